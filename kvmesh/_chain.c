/* kvmesh._chain: the sha256_cbor block-hash chain in one C call (kvmesh/hashing.py's
 * chain_hashes for algo "sha256_cbor", which stays the reference and the fallback).
 *
 * sha256_cbor_chain(parent, token_ids, block_size, tails) -> list[bytes] | None
 *
 * For each full block i (n = len(token_ids) // block_size; a trailing partial block is not
 * hashed) it hashes the canonical CBOR of (parent_i, tuple(block i's ids), extra_i):
 *
 *   0x83 | bytes head(len(parent_i)) | parent_i | array head(block_size)
 *        | the shortest CBOR uint of each id | tail_i
 *
 * where tail_i is tails[i] (the caller's CBOR of extra_i) or 0xf6 (null) when tails is None;
 * digest_i = SHA-256 of that, and parent_{i+1} = digest_i.
 *
 * Returns None, so that the caller runs its Python path, when it cannot produce the same
 * bytes as that path: parent not bytes, token_ids not a list or tuple, or an id that is not
 * an int in [0, 2**64) (negative ids are CBOR negative ints there; floats raise there).
 * Raises on caller errors: block_size < 1, tails not a list/tuple of >= n bytes.
 * No state is shared between calls but the immutable EVP_MD, so any thread may call it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/evp.h>

static EVP_MD *sha256;  /* fetched once: per-call fetches cost more than small blocks */

/* CBOR head of major type `major` with argument `v`, shortest form; returns its length. */
static inline Py_ssize_t
head(unsigned char *p, unsigned char major, unsigned long long v)
{
    unsigned char m = (unsigned char)(major << 5);
    int w;
    if (v < 24) {
        p[0] = m | (unsigned char)v;
        return 1;
    }
    if (v < 1ULL << 8) {
        p[0] = m | 24;
        w = 1;
    } else if (v < 1ULL << 16) {
        p[0] = m | 25;
        w = 2;
    } else if (v < 1ULL << 32) {
        p[0] = m | 26;
        w = 4;
    } else {
        p[0] = m | 27;
        w = 8;
    }
    for (int k = w; k > 0; k--, v >>= 8)
        p[k] = (unsigned char)v;  /* big-endian */
    return 1 + w;
}

static PyObject *
chain(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "sha256_cbor_chain takes 4 arguments");
        return NULL;
    }
    PyObject *parent = args[0], *ids = args[1], *tails = args[3];
    Py_ssize_t bs = PyLong_AsSsize_t(args[2]);
    if (bs == -1 && PyErr_Occurred())
        return NULL;
    if (bs < 1) {
        PyErr_SetString(PyExc_ValueError, "block_size must be >= 1");
        return NULL;
    }
    if (!PyBytes_Check(parent) || !(PyList_Check(ids) || PyTuple_Check(ids)))
        Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ids) / bs;
    PyObject **items = PySequence_Fast_ITEMS(ids);

    /* check the tails first and size one buffer for the largest block */
    Py_ssize_t tail_max = 1;
    if (tails != Py_None) {
        if (!(PyList_Check(tails) || PyTuple_Check(tails))
                || PySequence_Fast_GET_SIZE(tails) < n) {
            PyErr_SetString(PyExc_ValueError, "tails: a list of at least one bytes a block");
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *t = PySequence_Fast_GET_ITEM(tails, i);
            if (!PyBytes_Check(t)) {
                PyErr_SetString(PyExc_TypeError, "tails must be bytes");
                return NULL;
            }
            if (PyBytes_GET_SIZE(t) > tail_max)
                tail_max = PyBytes_GET_SIZE(t);
        }
    }
    Py_ssize_t plen = PyBytes_GET_SIZE(parent);
    if (bs > (PY_SSIZE_T_MAX - 64 - plen - tail_max) / 9)
        return PyErr_NoMemory();
    /* 0x83 + 9-byte heads for the parent and the array + 9 bytes an id at most */
    Py_ssize_t cap = 1 + 9 + (plen > 32 ? plen : 32) + 9 + 9 * bs + tail_max;
    unsigned char *buf = PyMem_Malloc(cap);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    PyObject *out = PyList_New(n);
    if (buf == NULL || ctx == NULL || out == NULL) {
        Py_XDECREF(out);
        out = PyErr_NoMemory();
        goto done;
    }
    const unsigned char *prev = (const unsigned char *)PyBytes_AS_STRING(parent);
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char *p = buf;
        *p++ = 0x83;
        p += head(p, 2, (unsigned long long)plen);
        memcpy(p, prev, plen);
        p += plen;
        p += head(p, 4, (unsigned long long)bs);
        for (Py_ssize_t k = i * bs; k < (i + 1) * bs; k++) {
            PyObject *o = items[k];
            unsigned long long v;
            /* PyLong_AsUnsignedLongLong runs no Python code, so `items` stays valid */
            if (!PyLong_Check(o)
                    || ((v = PyLong_AsUnsignedLongLong(o)) == (unsigned long long)-1
                        && PyErr_Occurred())) {
                PyErr_Clear();
                Py_DECREF(out);
                out = Py_NewRef(Py_None);
                goto done;
            }
            p += head(p, 0, v);
        }
        if (tails == Py_None) {
            *p++ = 0xf6;
        } else {
            PyObject *t = PySequence_Fast_GET_ITEM(tails, i);
            memcpy(p, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t));
            p += PyBytes_GET_SIZE(t);
        }
        PyObject *d = PyBytes_FromStringAndSize(NULL, 32);
        if (d == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(d);
        if (!EVP_DigestInit_ex2(ctx, sha256, NULL) || !EVP_DigestUpdate(ctx, buf, p - buf)
                || !EVP_DigestFinal_ex(ctx, dst, NULL)) {
            Py_DECREF(d);
            Py_CLEAR(out);
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL SHA-256 failed");
            goto done;
        }
        PyList_SET_ITEM(out, i, d);
        prev = dst;  /* owned by `out` from here on */
        plen = 32;
    }
done:
    PyMem_Free(buf);
    EVP_MD_CTX_free(ctx);
    return out;
}

static PyMethodDef methods[] = {
    {"sha256_cbor_chain", (PyCFunction)(void (*)(void))chain, METH_FASTCALL,
     "sha256_cbor_chain(parent, token_ids, block_size, tails) -> list[bytes] | None\n\n"
     "The sha256_cbor hashes of the full blocks of token_ids chained below parent; tails:\n"
     "each block's CBOR extra keys, or None for none. None when the Python path must run."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvmesh._chain",
    "The sha256_cbor block-hash chain in C (see kvmesh/hashing.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__chain(void)
{
    if (sha256 == NULL && (sha256 = EVP_MD_fetch(NULL, "SHA256", NULL)) == NULL) {
        PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA256");
        return NULL;
    }
    return PyModule_Create(&module);
}
