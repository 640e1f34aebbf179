"""Security properties that were sound before the credential hardening and must stay so, each
pinned by a test here or named in the report next to the existing test that covers it."""
from __future__ import annotations

import ast
import asyncio
import hmac
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from client.gateway.tenants import Tenancy, TenantKeyError, parse_tenant_keys
from kvmesh.rpc import auth
from kvmesh.rpc.tls import TlsFiles
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from service import worker_tokens
from service.config import ServiceConfig
from service.index.base import namespace
from service.server import create_server
from service.validate import RequestError, worker_id

if TYPE_CHECKING:  # the certs fixture skips where `cryptography` is missing
    from tests.certificates import Certs

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kvmesh", "service", "worker", "client", "bridge", "deploy", "bench")


def test_token_comparisons_are_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Router and worker tokens are compared by ``hmac.compare_digest`` only (no ``==``
    whose time depends on the first differing byte)."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest  # auth.hmac is the hmac module: patching it patches this

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    verify = auth.shared_token("router", "router-secret")
    assert verify("router-secret") == auth.Grant("router") and verify("router-secreT") is None
    assert calls == [(b"router-secret", b"router-secret"), (b"router-secreT", b"router-secret")]
    calls.clear()
    monkeypatch.setattr(worker_tokens.hmac, "compare_digest", spy)
    secret = "s" * 32
    token = worker_tokens.mint(secret, "w1")
    assert worker_tokens.bound_worker(secret, token) == "w1"
    assert worker_tokens.bound_worker(secret, token[:-1] + ("A" if token[-1] != "A" else "B"))\
        is None
    assert len(calls) == 2


def test_default_tenant_salt_secret_is_random_and_salts_are_hmacs() -> None:
    """Without ``--salt-secret`` every gateway draws its own secret: salts cannot be
    recomputed from tenant names (and, with one, they are HMAC-SHA256 of the name)."""
    a, b = Tenancy({"k": "acme"}), Tenancy({"k": "acme"})
    assert a.random_secret and b.random_secret
    assert a.salt("acme") != b.salt("acme")
    assert len(bytes.fromhex(a.salt("acme"))) == 32
    fixed = Tenancy({"k": "acme"}, "secret")
    assert fixed.salt("acme") == hmac.new(b"secret", b"kvmesh-tenant\0acme", "sha256").hexdigest()


def test_tenant_names_cannot_hold_nul() -> None:
    """NUL separates the tenant from the cache salt in the HMAC message: a tenant name with
    NUL could collide with another tenant's (tenant, cache_salt) pair."""
    with pytest.raises(TenantKeyError):
        parse_tenant_keys('{"key-1": "acme\\u0000x"}')
    with pytest.raises(TenantKeyError):
        parse_tenant_keys("key-1 acme\0x\n")


@pytest.mark.parametrize("model", ["org/m{x}|y", "a:4:sha256_cbor", "m\n1 purged", "%41"])
def test_model_names_are_percent_encoded_in_index_keys(model: str) -> None:
    """A model name never shapes the Redis key layout (hash tags ``{}``, the ``|``
    separator) nor collides with another (model, block size, algo)."""
    ns = namespace(model, 4, "sha256_cbor")
    assert not set("{}|\n ") & set(ns)
    assert ns.endswith(":4:sha256_cbor") and ns != namespace("A", 4, "sha256_cbor")
    assert namespace(model, 4, "sha256_cbor") != namespace(model + ":4", 4, "sha256_cbor")


@pytest.mark.parametrize("value", ["", "-w", "w 1", "w\n1", "w{1}", "w|1", "w%1", "ü",
                                   "w" * 129])
def test_worker_ids_keep_their_character_set(value: str) -> None:
    with pytest.raises(RequestError):
        worker_id(value)


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = (f"{f.value.id}.{f.attr}" if isinstance(f, ast.Attribute)
                    and isinstance(f.value, ast.Name) else getattr(f, "id", ""))
            out.append((name, node))
    return out


def _kw(call: ast.Call, name: str) -> object:
    for k in call.keywords:
        if k.arg == name:
            return k.value.value if isinstance(k.value, ast.Constant) else "?"
    return None


def test_no_module_unpickles_anything() -> None:
    """Nothing kvmesh runs deserializes with pickle: no ``pickle.load(s)``, ``torch.load``
    only with ``weights_only=True``, no ``yaml.load``/``marshal``/``dill``/``numpy.load``
    with ``allow_pickle``. (``pickle.dumps`` in hashing only serializes.)"""
    bad = []
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    assert len(files) > 50
    for path in files:
        for name, call in _calls(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT)}:{call.lineno} {name}"
            if name in ("pickle.load", "pickle.loads", "pickle.Unpickler", "marshal.load",
                        "marshal.loads", "dill.load", "dill.loads", "cloudpickle.load",
                        "cloudpickle.loads", "yaml.load", "yaml.unsafe_load"):
                bad.append(where)
            elif name == "torch.load" and _kw(call, "weights_only") is not True:
                bad.append(where)
            elif name in ("np.load", "numpy.load") and _kw(call, "allow_pickle") not in (None,
                                                                                     False):
                bad.append(where)
    assert bad == []


def test_mutual_tls_refuses_a_client_certificate_from_another_ca(tmp_path: Path,
                                                                  certs: Certs) -> None:
    """With ``client_auth`` the service verifies client certificates against its CA: a
    certificate of another CA (same names, same usages) is refused at the handshake."""
    from tests.certificates import _ca, _leaf

    rogue_ca, rogue_key = _ca("rogue CA", tmp_path / "rogue-ca.pem")
    _leaf("kvmesh client", rogue_ca, rogue_key, tmp_path / "rogue.pem", tmp_path / "rogue.key")
    (tmp_path / "rogue.key").chmod(0o600)
    cfg = ServiceConfig(tls_cert_file=str(certs.server_cert), tls_key_file=str(certs.server_key),
                        tls_ca_file=str(certs.ca), tls_client_auth=True)

    async def stats(port: int, tls: TlsFiles) -> grpc.StatusCode:
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}",
                                           tls.channel_credentials()) as ch:
            try:
                await pb_grpc.IndexServiceStub(ch).Stats(pb.StatsRequest(), timeout=3)
            except grpc.aio.AioRpcError as e:
                return e.code()
        return grpc.StatusCode.OK

    async def main() -> None:
        server, port = await create_server("127.0.0.1:0", cfg)
        await server.start()
        try:
            good = TlsFiles(ca=str(certs.ca), cert=str(certs.client_cert),
                            key=str(certs.client_key))
            rogue = TlsFiles(ca=str(certs.ca), cert=str(tmp_path / "rogue.pem"),
                             key=str(tmp_path / "rogue.key"))
            assert await stats(port, good) == grpc.StatusCode.OK
            assert await stats(port, rogue) == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_a_printed_service_config_shows_no_secret():
    """A config in a log line or a traceback never carries the Redis password or a token."""
    from service.config import ServiceConfig

    cfg = ServiceConfig(backend="redis", redis_url="redis://:hunter2pw@127.0.0.1:6379/0",
                        token="router-token-secret", worker_secret="w" * 24)
    text = repr(cfg)
    assert "hunter2pw" not in text and "router-token-secret" not in text and "w" * 24 not in text
