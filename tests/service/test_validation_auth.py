"""Bad input gets a precise status code and changes nothing; bearer-token roles."""
from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from kvmesh.hashing import none_hash
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from service.config import ServiceConfig
from service.server import create_server
from tests.grpc_codes import code_of
from tests.service.protocol_worker import ProtocolWorker, meta, prompt, route, serve

INVALID = grpc.StatusCode.INVALID_ARGUMENT
TOO_BIG = grpc.StatusCode.RESOURCE_EXHAUSTED
H32 = b"\x01" * 32




def test_bad_requests_get_clear_codes_and_change_nothing(redis_url: str) -> None:
    cfg = ServiceConfig(backend="redis", redis_url=redis_url, max_prompt_tokens=100,
                        max_batch_events=10, max_snapshot_blocks=20)

    async def main() -> None:
        async with serve(cfg) as r:
            s = r.stub
            a = ProtocolWorker(s, "a")
            await a.join()
            await a.store(prompt(24))

            async def state() -> tuple:
                st = await s.Stats(pb.StatsRequest())
                res = await route(s, prompt(25))
                return ([(w.worker_id, w.indexed_blocks, w.last_seq) for w in st.workers],
                        [(c.worker_id, c.matched_tokens) for c in res.candidates])

            before = await state()

            def reg(**kw: object) -> Awaitable[object]:
                fields = dict(worker_id="b", address="h:1", model="tiny", block_size=4,
                              hash_algo="sha256_cbor", root_hash=none_hash("sha256_cbor"))
                fields.update(kw)
                return s.RegisterWorker(pb.RegisterWorkerRequest(**fields))  # type: ignore

            def pub(*events: pb.KvEvent, wid: str = "a") -> Awaitable[object]:
                return s.PublishEvents(pb.PublishEventsRequest(worker_id=wid, events=events))

            def stored(*hashes: bytes, parent: bytes = b"") -> pb.BlockStored:
                return pb.BlockStored(block_hashes=hashes, parent_hash=parent)

            nxt = a.seq + 1
            cases = {
                "empty prompt": (route(s, []), INVALID),
                "oversized prompt": (route(s, prompt(101)), TOO_BIG),
                "negative token": (route(s, [1, 2, -3]), INVALID),
                "salt over 4 KiB": (route(s, prompt(8), salt="x" * 4097), INVALID),
                "unknown policy": (route(s, prompt(8), policy="fastest"), INVALID),
                "mm outside prompt": (route(s, prompt(8), mm=[pb.MultimodalItem(
                    identifier="img", offset=6, length=5)]), INVALID),
                "lora without name": (route(s, prompt(8), lora=pb.Lora(path="/x")), INVALID),
                "bad worker id": (reg(worker_id="bad id!"), INVALID),
                "bad address": (reg(address="nowhere"), INVALID),
                "unknown algo": (reg(hash_algo="md5"), INVALID),
                "short root hash": (reg(root_hash=b"\x00" * 16), INVALID),
                "zero block size": (reg(block_size=0), INVALID),
                "free > total": (s.Heartbeat(pb.HeartbeatRequest(worker_id="a", load=pb.WorkerLoad(
                    free_blocks=5, total_blocks=4))), INVALID),
                "unknown worker events": (pub(pb.KvEvent(seq=1, stored=stored(H32)), wid="zz"),
                                          grpc.StatusCode.NOT_FOUND),
                "short block hash": (pub(pb.KvEvent(seq=nxt, stored=stored(b"\x01" * 31))),
                                     INVALID),
                "short parent hash": (pub(pb.KvEvent(seq=nxt, stored=stored(H32, parent=b"\x02"))),
                                      INVALID),
                "empty stored": (pub(pb.KvEvent(seq=nxt, stored=stored())), INVALID),
                "no event kind": (pub(pb.KvEvent(seq=nxt)), INVALID),
                "seq 0": (pub(pb.KvEvent(seq=0, cleared=pb.AllBlocksCleared())), INVALID),
                "out of order": (pub(pb.KvEvent(seq=nxt, cleared=pb.AllBlocksCleared()),
                                     pb.KvEvent(seq=nxt + 2, cleared=pb.AllBlocksCleared())),
                                 INVALID),
                "valid then malformed": (pub(pb.KvEvent(seq=nxt, cleared=pb.AllBlocksCleared()),
                                             pb.KvEvent(seq=nxt + 1, stored=stored(b"x"))),
                                         INVALID),
                "too many events": (pub(*[pb.KvEvent(seq=nxt + i, cleared=pb.AllBlocksCleared())
                                          for i in range(11)]), TOO_BIG),
                "snapshot bad hash": (s.SyncWorker(pb.SyncWorkerRequest(
                    worker_id="a", seq=9, blocks=[stored(b"\x01")])), INVALID),
                "snapshot too big": (s.SyncWorker(pb.SyncWorkerRequest(
                    worker_id="a", seq=9, blocks=[stored(*[H32] * 21)])), TOO_BIG),
                "snapshot unknown worker": (s.SyncWorker(pb.SyncWorkerRequest(
                    worker_id="zz", seq=1)), grpc.StatusCode.NOT_FOUND),
            }
            for name, (call, want) in cases.items():
                assert await code_of(call) == want, name
            assert await state() == before

    asyncio.run(main())


def test_default_prompt_limit_is_one_million_tokens() -> None:
    async def main() -> None:
        async with serve(ServiceConfig()) as r:
            await ProtocolWorker(r.stub, "a").join()
            assert await code_of(route(r.stub, [1] * 1_000_001)) == TOO_BIG

    asyncio.run(main())


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
