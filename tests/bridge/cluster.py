"""Real processes around a bridge under test: a service process on a real Valkey, a route
client, and the bridge itself run in the test's event loop (``Running``) or as a process."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc

from bridge.config import EngineSpec
from bridge.main import BridgeOptions, Rank, build, run
from deploy.process import ServerProcess
from deploy.redis_server import RedisServer
from deploy.waiting import eventually
from kvmesh.events import vllm as ve
from kvmesh.rpc.channel import parse_addresses
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from tests.bridge.fake_metrics import FakeMetrics
from tests.bridge.fake_vllm import FakeEngine
from tests.ports import free_port

WITHIN = 15.0  # generous: a loaded 2-core host runs other suites beside this one
BS = 4
P = list(range(1000, 1012))  # a three-block prompt


def start_service(redis: RedisServer) -> ServerProcess:
    return ServerProcess("bridge-service", "service", [
        "--port", "0", "--log-level", "warning"],
        env={"KVMESH_REDIS_URL": redis.url}).start()


def port_pair() -> tuple[int, int]:
    """Two consecutive free loopback ports (a rank-0 endpoint and rank 1's, port + 1)."""
    while True:
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port, port + 1


def stored(hashes: Sequence[int], tokens: Sequence[int], parent: int | None = None, *,
           block_size: int, medium: str | None = None, lora: str | None = None,
           keys: list | None = None) -> ve.VllmStored:
    return ve.VllmStored(block_hashes=list(hashes), parent_block_hash=parent,
                         token_ids=list(tokens), block_size=block_size, lora_id=None,
                         medium=medium, lora_name=lora, extra_keys=keys)


def removed(hashes: Sequence[int], medium: str | None = None) -> ve.VllmRemoved:
    return ve.VllmRemoved(block_hashes=list(hashes), medium=medium)


class Engine:
    """A vLLM engine as the bridge sees it: publishers (one per rank) and a metrics page."""

    def __init__(self, worker_id: str, model: str, *, ranks: int = 1, replay: bool = True,
                 lora: dict[str, str] | None = None) -> None:
        self.metrics = FakeMetrics(model=model, ranks=ranks, block_size=BS)
        pub = port_pair()[0] if ranks > 1 else free_port()
        rep = (port_pair()[0] if ranks > 1 else free_port()) if replay else None
        self.ports = [(pub + r, None if rep is None else rep + r) for r in range(ranks)]
        self.ranks = [FakeEngine(p, q) for p, q in self.ports]
        self.spec = EngineSpec(
            worker_id=worker_id, address=self.metrics.url, events=f"tcp://127.0.0.1:{pub}",
            replay=None if rep is None else f"tcp://127.0.0.1:{rep}", block_size=BS,
            dp_ranks=ranks, lora=lora or {})

    @property
    def pub(self) -> FakeEngine:
        return self.ranks[0]

    async def close(self) -> None:
        for e in self.ranks:
            await e.close()
        self.metrics.stop()


def chain(tokens, parent=None, first=1, **kw) -> ve.VllmStored:
    n = len(tokens) // BS
    return stored(range(first, first + n), tokens, parent, block_size=BS, **kw)


class Router:
    """Route (dry run: it records nothing) and Stats against the service."""

    def __init__(self, address: str, channel: grpc.aio.Channel | None = None) -> None:
        self.channel = channel or grpc.aio.insecure_channel(address)
        self.stub = pb_grpc.IndexServiceStub(self.channel)

    async def matched(self, tokens: Sequence[int], model: str, *, salt: str = "",
                      lora: tuple[str, str] | None = None, tiers: bool = False) -> dict:
        """worker id -> matched tokens (``tiers``: -> (matched tokens, the slowest tier of
        the match, ``index_pb2.Tier``)) of every candidate
        for the prompt ``tokens`` and one more token (the last prompt token is never served
        from cache, so this lets every block of ``tokens`` match)."""
        resp = await self.stub.Route(pb.RouteRequest(
            token_ids=[*tokens, 0], model=model, salt=salt, dry_run=True,
            lora=pb.Lora(name=lora[0], path=lora[1]) if lora else None), timeout=5)
        return {c.worker_id: (c.matched_tokens, c.tier) if tiers else c.matched_tokens
                for c in resp.candidates}

    async def alive(self) -> dict[str, bool]:
        resp = await self.stub.Stats(pb.StatsRequest(), timeout=5)
        return {w.worker_id: w.alive for w in resp.workers}

    async def until(self, probe, ok, within: float = WITHIN):
        return await eventually(probe, ok, within=within)

    async def close(self) -> None:
        await self.channel.close()


class Running:
    """A bridge (``bridge.main.run``) in a task of the current loop; ``ranks`` by worker id."""

    def __init__(self, service: str, engines: list[EngineSpec], **opts) -> None:
        self.opts = BridgeOptions(services=tuple(parse_addresses(service)), **opts)
        self.engines = engines
        self.stop = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.ranks: dict[str, Rank] = {}

    async def __aenter__(self) -> Running:
        fleet = build(self.opts, self.engines)
        self.ranks = {r.worker_id: r for r in fleet}
        self.task = asyncio.create_task(run(fleet, self.opts, self.stop))
        return self

    async def live(self, worker_id: str, engine) -> None:
        """Wait until ``engine``'s live stream reaches the rank (a ZMQ subscription takes
        effect late: what is published before is lost on the way, as with vLLM, and only a
        later gap or probe would fetch it): publish empty batches until one arrives."""
        sub = self.ranks[worker_id].sub
        seen = sub.stats.messages

        async def probe():
            if self.task is not None and self.task.done():
                self.task.result()  # a crashed bridge: fail now
            engine.publish()
            await asyncio.sleep(0.02)
            return sub.stats.messages > seen
        await eventually(probe, within=WITHIN)

    async def __aexit__(self, *exc) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 10)


@contextlib.asynccontextmanager
async def router(address: str) -> AsyncIterator[Router]:
    r = Router(address)
    try:
        yield r
    finally:
        await r.close()


class BridgeProcess:
    """``kvmesh bridge vllm ARGS`` as a child process, its output lines collected."""

    def __init__(self, *args: str) -> None:
        kvmesh = str(Path(sys.executable).parent / "kvmesh")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVMESH_")}
        self.proc = subprocess.Popen(
            [kvmesh, "bridge", "vllm", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, env={**env, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then its exit code (SIGKILL past ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
