"""Worker tokens bound to their worker id: a rogue worker cannot touch another's entries."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from typer.testing import CliRunner

from kvmesh.v1 import index_pb2 as pb
from service import worker_tokens
from service.config import ServiceConfig
from tests.grpc_codes import code_of
from tests.service.protocol_worker import ProtocolWorker, meta, prompt, route, serve

SECRET = "0123456789abcdef-test-secret"
DENIED = grpc.StatusCode.PERMISSION_DENIED
UNAUTH = grpc.StatusCode.UNAUTHENTICATED




def test_mint_and_verify() -> None:
    token = worker_tokens.mint(SECRET, "gpu-0:1/a.b")
    assert worker_tokens.bound_worker(SECRET, token) == "gpu-0:1/a.b"
    worker_id, _, mac = token.rpartition(":")
    assert worker_tokens.bound_worker(SECRET, f"gpu-1:{mac}") is None  # MAC of another id
    flipped = token[:-1] + ("1" if token.endswith("0") else "0")
    assert worker_tokens.bound_worker(SECRET, flipped) is None
    assert worker_tokens.bound_worker(SECRET + "x", token) is None
    for bad in ("", ":", "abc", f":{mac}"):
        assert worker_tokens.bound_worker(SECRET, bad) is None
    with pytest.raises(ValueError, match="16 bytes"):
        worker_tokens.mint("short", "w")
    with pytest.raises(ValueError, match="16 bytes"):
        ServiceConfig(worker_secret="short")


def test_worker_token_command_prints_the_bound_token() -> None:
    import typer

    from service.cli import register

    app = typer.Typer()
    register(app)  # two commands: "worker-token" is a subcommand, as in kvmesh
    out = CliRunner().invoke(app, ["worker-token", "--worker-id", "w-7"],
                             env={"KVMESH_WORKER_SECRET": SECRET})
    assert out.exit_code == 0, out.output
    assert out.output.strip() == worker_tokens.mint(SECRET, "w-7")


def test_rogue_worker_cannot_write_or_delete_another_workers_entries() -> None:
    cfg = ServiceConfig(token="router-tok", worker_secret=SECRET)

    async def main() -> None:
        async with serve(cfg) as r:
            s = r.stub
            a = ProtocolWorker(s, "a", token=worker_tokens.mint(SECRET, "a"))
            await a.join()
            chain = await a.store(prompt(17))
            rogue_token = worker_tokens.mint(SECRET, "rogue")
            rogue = ProtocolWorker(s, "rogue", token=rogue_token, port=9001)
            await rogue.join()

            async def view() -> tuple:
                st = await s.Stats(pb.StatsRequest(), metadata=meta("router-tok"))
                res = await route(s, prompt(17), token="router-tok", dry_run=True)
                return (sorted((w.worker_id, w.indexed_blocks, w.last_seq, w.address)
                               for w in st.workers),
                        sorted((c.worker_id, c.matched_tokens) for c in res.candidates))

            before = await view()
            assert ("a", 16) in before[1]
            # the rogue, with its own valid token, acting for "a":
            as_a = ProtocolWorker(s, "a", token=rogue_token, port=9002)
            as_a.seq = a.seq
            attacks = {
                "evict a's blocks": as_a.publish(pb.KvEvent(
                    seq=a.seq + 1, removed=pb.BlockRemoved(block_hashes=chain))),
                "clear a's cache": as_a.publish(pb.KvEvent(
                    seq=a.seq + 1, cleared=pb.AllBlocksCleared())),
                "store in a's name": as_a.publish(pb.KvEvent(
                    seq=a.seq + 1, stored=pb.BlockStored(block_hashes=[b"\x05" * 32]))),
                "empty snapshot for a": s.SyncWorker(pb.SyncWorkerRequest(
                    worker_id="a", seq=a.seq + 5), metadata=meta(rogue_token)),
                "re-register a elsewhere": as_a.register(),
                "heartbeat as a": as_a.heartbeat(free_blocks=0, total_blocks=1),
            }
            for name, call in attacks.items():
                assert await code_of(call) == DENIED, name
            # forged, missing and wrong-role tokens: not even authenticated
            forged = "a:" + rogue_token.rpartition(":")[2]
            assert await code_of(ProtocolWorker(s, "a", token=forged).heartbeat()) == UNAUTH
            assert await code_of(ProtocolWorker(s, "a").heartbeat()) == UNAUTH
            assert await code_of(ProtocolWorker(s, "a", token="router-tok").heartbeat()) == UNAUTH
            assert await code_of(route(s, prompt(8), token=rogue_token)) == UNAUTH
            assert await code_of(s.Stats(pb.StatsRequest(), metadata=meta(rogue_token))) \
                == UNAUTH
            assert await view() == before
            # its own token still works for itself
            assert await code_of(a.heartbeat()) == grpc.StatusCode.OK

    asyncio.run(main())


def test_shared_worker_token_still_works_next_to_bound_ones() -> None:
    cfg = ServiceConfig(token="r", worker_token="shared-w", worker_secret=SECRET)

    async def main() -> None:
        async with serve(cfg) as r:
            await ProtocolWorker(r.stub, "x", token="shared-w").join()
            y_token = worker_tokens.mint(SECRET, "y")
            await ProtocolWorker(r.stub, "y", token=y_token, port=9001).join()
            st = await r.stub.Stats(pb.StatsRequest(), metadata=meta("r"))
            assert sorted(w.worker_id for w in st.workers) == ["x", "y"]

    asyncio.run(main())
