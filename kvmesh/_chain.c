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
 *
 * sha256_cbor_chain_packed(parent, packed, block_size, tails) -> list[bytes] | None
 *
 * The same hashes for the ids that `packed` (any bytes-like object, e.g. a msgspec.Raw
 * slice of a vLLM event) holds as msgpack: exactly one array (fixarray, array 16/32) of
 * uints (positive fixint, uint 8/16/32/64, any width for any value: the CBOR is re-encoded
 * shortest), so the caller need not build a Python int per id. None (the caller decodes the
 * array and runs its Python path) for anything else in any element, a partial block's
 * included: negative ints, non-ints, a truncated buffer or bytes after the array.
 *
 * msgpack_len(packed, check=True) -> int | None
 *
 * The element count of the msgpack array in `packed` if it is exactly one array of ints of
 * any sign and width (what msgspec decodes as list[int]); None otherwise. check=False reads
 * only the array head (for a buffer already checked).
 *
 * No state is shared between calls but the immutable EVP_MD, so any thread may call them.
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

/* The msgpack array head at *pp: its count, *pp past it; -1 if not an array head. A count
 * over the bytes left (each element takes one at least) is refused before anything is sized
 * by it. */
static Py_ssize_t
mp_array(const unsigned char **pp, const unsigned char *end)
{
    const unsigned char *p = *pp;
    unsigned long long c;
    if (p >= end)
        return -1;
    if ((*p & 0xf0) == 0x90) {
        c = *p++ & 0x0f;
    } else if (*p == 0xdc && end - p >= 3) {
        c = (unsigned long long)p[1] << 8 | p[2];
        p += 3;
    } else if (*p == 0xdd && end - p >= 5) {
        c = (unsigned long long)p[1] << 24 | (unsigned long long)p[2] << 16
            | (unsigned long long)p[3] << 8 | p[4];
        p += 5;
    } else {
        return -1;
    }
    if (c > (unsigned long long)(end - p))
        return -1;
    *pp = p;
    return (Py_ssize_t)c;
}

/* The size of a msgpack int from its type byte, 0 for no int: [0] uints only (positive
 * fixint, uint 8-64), [1] any sign (also negative fixint, int 8-64). A table because the
 * widths of real ids vary from one to the next: branching on them mispredicts. */
static unsigned char int_size[2][256];

static void
fill_int_size(void)
{
    for (int b = 0; b < 256; b++) {
        int u = b < 0x80 ? 1 : (b >= 0xcc && b <= 0xcf) ? 1 + (1 << (b - 0xcc)) : 0;
        int i = b >= 0xe0 ? 1 : (b >= 0xd0 && b <= 0xd3) ? 1 + (1 << (b - 0xd0)) : 0;
        int_size[0][b] = (unsigned char)u;
        int_size[1][b] = (unsigned char)(u ? u : i);
    }
}

/* The msgpack uint at *pp into *v, *pp past it; -1 for anything else or a truncated one. */
static inline int
mp_uint(const unsigned char **pp, const unsigned char *end, unsigned long long *v)
{
    const unsigned char *p = *pp;
    int size;
    if (p >= end || (size = int_size[0][*p]) == 0 || end - p < size)
        return -1;
    unsigned long long x = size == 1 ? *p : 0;
    for (int k = 1; k < size; k++)
        x = x << 8 | p[k];  /* big-endian */
    *v = x;
    *pp = p + size;
    return 0;
}

/* `count` if the bytes of b from offset i to len are exactly `count` msgpack ints of any
 * sign, else -1. Offsets, not pointers, so that a truncated last int never points past b. */
static Py_ssize_t
mp_ints(const unsigned char *b, Py_ssize_t i, Py_ssize_t len, Py_ssize_t count)
{
    const unsigned char *sz = int_size[1];
    Py_ssize_t k = 0;
    /* four at a time while four of the widest (9 bytes) fit: the loop is bound by the
     * latency of one int's size to the next's offset, so only the checks are cut */
    for (; k + 4 <= count && len - i >= 36; k += 4) {
        unsigned s0 = sz[b[i]];
        i += s0;
        unsigned s1 = sz[b[i]];
        i += s1;
        unsigned s2 = sz[b[i]];
        i += s2;
        unsigned s3 = sz[b[i]];
        i += s3;
        if (!s0 | !s1 | !s2 | !s3)
            return -1;
    }
    for (; k < count && i < len && sz[b[i]]; k++)
        i += sz[b[i]];
    return k == count && i == len ? count : -1;
}

/* The chain over ids from `items` (a list/tuple's) or, when items is NULL, msgpack uints
 * from *pp (past the array head, `count` of them, to end); see the module doc. */
static PyObject *
run(PyObject *parent, PyObject **items, const unsigned char *pk, const unsigned char *end,
    Py_ssize_t count, Py_ssize_t bs, PyObject *tails)
{
    Py_ssize_t n = count / bs;
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
    unsigned long long v;
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
            if (items == NULL) {
                if (mp_uint(&pk, end, &v))
                    goto refuse;
            } else {
                PyObject *o = items[k];
                /* PyLong_AsUnsignedLongLong runs no Python code, so `items` stays valid */
                if (!PyLong_Check(o)
                        || ((v = PyLong_AsUnsignedLongLong(o)) == (unsigned long long)-1
                            && PyErr_Occurred())) {
                    PyErr_Clear();
                    goto refuse;
                }
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
    if (items == NULL) {
        /* the partial block's ids too, and nothing after them: a buffer the Python path
         * would decode otherwise (or not at all) is its to judge */
        for (Py_ssize_t k = n * bs; k < count; k++)
            if (mp_uint(&pk, end, &v))
                goto refuse;
        if (pk != end)
            goto refuse;
    }
    goto done;
refuse:
    Py_DECREF(out);
    out = Py_NewRef(Py_None);
done:
    PyMem_Free(buf);
    EVP_MD_CTX_free(ctx);
    return out;
}

static Py_ssize_t
block_size(PyObject *const *args, Py_ssize_t nargs, const char *name)
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "%s takes 4 arguments", name);
        return -1;
    }
    Py_ssize_t bs = PyLong_AsSsize_t(args[2]);
    if (bs == -1 && PyErr_Occurred())
        return -1;
    if (bs < 1) {
        PyErr_SetString(PyExc_ValueError, "block_size must be >= 1");
        return -1;
    }
    return bs;
}

static PyObject *
chain(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t bs = block_size(args, nargs, "sha256_cbor_chain");
    if (bs < 0)
        return NULL;
    PyObject *parent = args[0], *ids = args[1];
    if (!PyBytes_Check(parent) || !(PyList_Check(ids) || PyTuple_Check(ids)))
        Py_RETURN_NONE;
    return run(parent, PySequence_Fast_ITEMS(ids), NULL, NULL, PySequence_Fast_GET_SIZE(ids),
               bs, args[3]);
}

static PyObject *
chain_packed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t bs = block_size(args, nargs, "sha256_cbor_chain_packed");
    if (bs < 0)
        return NULL;
    Py_buffer view;
    if (!PyBytes_Check(args[0]))
        Py_RETURN_NONE;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf, *end = p + view.len;
    Py_ssize_t count = mp_array(&p, end);
    /* the view holds the exporter, so the bytes stay put while run reads them */
    PyObject *out = count < 0 ? Py_NewRef(Py_None)
                              : run(args[0], NULL, p, end, count, bs, args[3]);
    PyBuffer_Release(&view);
    return out;
}

static PyObject *
packed_len(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "msgpack_len takes 1 or 2 arguments");
        return NULL;
    }
    int check = 1;
    if (nargs == 2 && (check = PyObject_IsTrue(args[1])) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf, *end = p + view.len;
    Py_ssize_t count = mp_array(&p, end);
    if (check && count >= 0)
        count = mp_ints(view.buf, p - (const unsigned char *)view.buf, view.len, count);
    PyBuffer_Release(&view);
    if (count < 0)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"sha256_cbor_chain", (PyCFunction)(void (*)(void))chain, METH_FASTCALL,
     "sha256_cbor_chain(parent, token_ids, block_size, tails) -> list[bytes] | None\n\n"
     "The sha256_cbor hashes of the full blocks of token_ids chained below parent; tails:\n"
     "each block's CBOR extra keys, or None for none. None when the Python path must run."},
    {"sha256_cbor_chain_packed", (PyCFunction)(void (*)(void))chain_packed, METH_FASTCALL,
     "sha256_cbor_chain_packed(parent, packed, block_size, tails) -> list[bytes] | None\n\n"
     "sha256_cbor_chain over the ids of a msgpack array of uints (bytes-like). None when\n"
     "the Python path must run on the decoded ids."},
    {"msgpack_len", (PyCFunction)(void (*)(void))packed_len, METH_FASTCALL,
     "msgpack_len(packed, check=True) -> int | None\n\n"
     "The count of a msgpack array of ints; None if packed is anything else. check=False:\n"
     "the array head only."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvmesh._chain",
    "The sha256_cbor block-hash chain in C (see kvmesh/hashing.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__chain(void)
{
    fill_int_size();
    if (sha256 == NULL && (sha256 = EVP_MD_fetch(NULL, "SHA256", NULL)) == NULL) {
        PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA256");
        return NULL;
    }
    return PyModule_Create(&module);
}
