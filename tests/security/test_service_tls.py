"""TLS on the metadata service, with certificates the tests create: calls succeed with the
CA, fail without it or with another CA; mutual TLS refuses clients without a certificate."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc
import pytest

from client import AsyncKvmeshClient, KvmeshError
from kvmesh.rpc.tls import TlsFiles
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from service.config import ServiceConfig
from service.server import create_server
from tests.service.protocol_worker import ProtocolWorker, prompt

if TYPE_CHECKING:  # the certs fixture skips where `cryptography` is missing
    from tests.certificates import Certs


async def _stats(port: int, tls: TlsFiles | None) -> grpc.StatusCode:
    creds = tls.channel_credentials() if tls is not None else None
    target = f"127.0.0.1:{port}"
    channel = (grpc.aio.secure_channel(target, creds) if creds is not None
               else grpc.aio.insecure_channel(target))
    async with channel:
        try:
            await pb_grpc.IndexServiceStub(channel).Stats(pb.StatsRequest(), timeout=3)
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


def _serve_and(cfg: ServiceConfig, body):
    async def main():
        server, port = await create_server("127.0.0.1:0", cfg)
        await server.start()
        try:
            return await body(port)
        finally:
            await server.stop(None)

    return asyncio.run(main())


def test_tls_calls_need_the_ca(certs: Certs) -> None:
    cfg = ServiceConfig(tls_cert_file=str(certs.server_cert), tls_key_file=str(certs.server_key))

    async def body(port: int) -> None:
        ok, down = grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE
        assert await _stats(port, TlsFiles(ca=str(certs.ca))) == ok
        assert await _stats(port, None) == down                          # plaintext
        assert await _stats(port, TlsFiles(ca=str(certs.other_ca))) == down  # wrong CA
        # the client library, end to end: a worker joins over TLS, a router routes over TLS
        tls = TlsFiles(ca=str(certs.ca))
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", tls.channel_credentials()) as ch:
            await ProtocolWorker(pb_grpc.IndexServiceStub(ch), "w").join()
        async with AsyncKvmeshClient(f"127.0.0.1:{port}", tls=tls) as client:
            assert (await client.route(prompt(9))).worker_id == "w"
        async with AsyncKvmeshClient(f"127.0.0.1:{port}", timeout=2) as plain:
            with pytest.raises(KvmeshError) as err:
                await plain.stats()
            assert err.value.code == down

    _serve_and(cfg, body)


def test_mutual_tls_refuses_clients_without_a_certificate(certs: Certs) -> None:
    cfg = ServiceConfig(tls_cert_file=str(certs.server_cert), tls_key_file=str(certs.server_key),
                        tls_ca_file=str(certs.ca), tls_client_auth=True)

    async def body(port: int) -> None:
        with_cert = TlsFiles(ca=str(certs.ca), cert=str(certs.client_cert),
                             key=str(certs.client_key))
        assert await _stats(port, with_cert) == grpc.StatusCode.OK
        assert await _stats(port, TlsFiles(ca=str(certs.ca))) == grpc.StatusCode.UNAVAILABLE

    _serve_and(cfg, body)


def test_tls_settings_fail_early_and_clearly(tmp_path, certs: Certs) -> None:
    with pytest.raises(ValueError, match="--tls-cert and --tls-key"):
        TlsFiles(cert=str(certs.server_cert))
    with pytest.raises(ValueError, match="--tls-client-auth needs --tls-ca"):
        TlsFiles(cert=str(certs.server_cert), key=str(certs.server_key), client_auth=True)
    with pytest.raises(ValueError, match="--tls-ca .*cannot read"):
        TlsFiles(ca=str(tmp_path / "missing.pem")).channel_credentials()
    cfg = ServiceConfig(tls_cert_file=str(tmp_path / "nope.pem"), tls_key_file="nope.key")
    with pytest.raises(ValueError, match="--tls-key"):
        asyncio.run(create_server("127.0.0.1:0", cfg))
