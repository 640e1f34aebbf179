"""Bearer-token roles of the metadata service (``service.auth``): router, worker, with TLS."""
from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from service.config import ServiceConfig
from service.server import create_server
from tests.grpc_codes import code_of
from tests.service.protocol_worker import ProtocolWorker, meta, prompt, route, serve


def test_router_token_guards_every_call_but_health() -> None:
    async def main() -> None:
        async with serve(ServiceConfig(token="s3cret", worker_token="w-s3cret")) as r:
            unauth = grpc.StatusCode.UNAUTHENTICATED
            assert await code_of(route(r.stub, prompt(8))) == unauth
            assert await code_of(route(r.stub, prompt(8), token="wrong")) == unauth
            assert await code_of(ProtocolWorker(r.stub, "a").register()) == unauth
            assert await code_of(r.stub.Stats(pb.StatsRequest())) == unauth
            refl = reflection_pb2_grpc.ServerReflectionStub(r.channel)
            req = reflection_pb2.ServerReflectionRequest(list_services="")

            async def reflect() -> None:
                async for _ in refl.ServerReflectionInfo(iter([req])):
                    pass

            assert await code_of(reflect()) == unauth
            health = health_pb2_grpc.HealthStub(r.channel)
            assert (await health.Check(health_pb2.HealthCheckRequest())).status == 1
            assert await code_of(ProtocolWorker(r.stub, "a", token="s3cret").register()) == unauth
            await ProtocolWorker(r.stub, "a", token="w-s3cret").join()
            res = await route(r.stub, prompt(8), token="s3cret")
            assert res.candidates[0].worker_id == "a"

    asyncio.run(main())


@pytest.mark.parametrize("router_token", ["r-tok", None])
def test_worker_token_is_a_separate_role(router_token: str | None) -> None:
    async def main() -> None:
        cfg = ServiceConfig(token=router_token, worker_token="w-tok")
        async with serve(cfg) as r:
            unauth = grpc.StatusCode.UNAUTHENTICATED
            if router_token:
                assert await code_of(ProtocolWorker(r.stub, "a", token=router_token).register()) \
                    == unauth
                assert await code_of(route(r.stub, prompt(8), token="w-tok")) == unauth
            w = ProtocolWorker(r.stub, "a", token="w-tok")
            await w.join()
            assert await code_of(w.heartbeat()) == grpc.StatusCode.OK
            await w.store(prompt(8))
            stats = await r.stub.Stats(pb.StatsRequest(), metadata=meta(router_token))
            assert stats.workers[0].indexed_blocks == 2

    asyncio.run(main())


def test_tls_with_token(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    cfg = ServiceConfig(token="t", worker_secret="w" * 16, tls_cert_file=str(cert),
                        tls_key_file=str(key))

    async def main() -> None:
        server, port = await create_server("127.0.0.1:0", cfg)
        await server.start()
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        try:
            async with grpc.aio.secure_channel(f"localhost:{port}", creds) as ch:
                stub = pb_grpc.IndexServiceStub(ch)
                assert await code_of(stub.Stats(pb.StatsRequest())) \
                    == grpc.StatusCode.UNAUTHENTICATED
                st = await stub.Stats(pb.StatsRequest(), metadata=meta("t"))
                assert not st.degraded
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                plain = pb_grpc.IndexServiceStub(ch).Stats(pb.StatsRequest(), metadata=meta("t"),
                                                           timeout=2)
                assert await code_of(plain) == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_the_quota_rpcs_take_the_admin_token_and_refuse_every_other_credential() -> None:
    """Set/GetTenantQuotas on a real server with every role's token configured: the router
    token, the shared worker token, a worker's bound token, a wrong one and none are all
    refused (UNAUTHENTICATED or PERMISSION_DENIED), and nothing is set."""
    from service import worker_tokens

    secret = "s" * 16
    cfg = ServiceConfig(token="r-tok", worker_token="w-tok", worker_secret=secret,
                        admin_token="adm-tok")
    refused = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
    req = pb.SetTenantQuotaRequest(quota=pb.TenantQuota(tenant="a", gpu=0.3))

    async def main() -> None:
        async with serve(cfg) as r:
            for token in ("r-tok", "w-tok", worker_tokens.mint(secret, "a"), "wrong", None):
                assert await code_of(r.stub.SetTenantQuota(req, metadata=meta(token))) \
                    in refused, token
                assert await code_of(r.stub.GetTenantQuotas(
                    pb.GetTenantQuotasRequest(), metadata=meta(token))) in refused, token
            got = await r.stub.GetTenantQuotas(pb.GetTenantQuotasRequest(),
                                               metadata=meta("adm-tok"))
            assert got.quotas.version == 0  # no refused call set anything
            res = await r.stub.SetTenantQuota(req, metadata=meta("adm-tok"))
            assert res.quotas.tenants[0].tenant == "a" and res.quotas.version != 0

    asyncio.run(main())
