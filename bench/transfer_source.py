"""The source side of `kvmesh bench transfer`: a process serving offers, as a peer would.

The bench runs the source in its own process so that the receiver's process measures what
a peer sees: two interpreters, two event loops, the bytes crossing the loopback (or
/dev/shm). Protocol, one JSON line each way: the bench writes
``[transport, frame_bytes, count, block_bytes]``; the source answers with an endpoint for an
offer of ``count`` blocks (views of one buffer, reused) on its DataServer for that frame
size (``zmq+curve``: zmq on a second DataServer that encrypts, as one on a routable address
does); ``"cpu"`` gets its CPU seconds so far. End of input stops it.

See docs/benchmarks.md#peer-kv-transfer-kvmesh-bench-transfer.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path


async def _serve(frame_sizes: list[int], max_bytes: int) -> None:
    from kvmesh.transfer.transports import DataServer

    servers = {f: DataServer(frame_bytes=f) for f in frame_sizes}
    sealed = {f: DataServer(frame_bytes=f, encrypt=True) for f in frame_sizes}
    for s in (*servers.values(), *sealed.values()):
        await s.start()
    data = memoryview(bytearray(b"\xa5" * max_bytes))  # written once: its pages are real
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    stdin = sys.stdin.buffer

    def on_request() -> None:
        line = stdin.readline()
        if not line:
            if not done.done():
                done.set_result(None)
            return
        req = json.loads(line)
        if req == "cpu":  # the source's CPU seconds so far (user + system, all threads)
            sys.stdout.write(json.dumps(time.process_time()) + "\n")
            sys.stdout.flush()
            return
        transport, frame_bytes, count, bb = req
        span = max_bytes - bb + 1
        blocks = [data[(i * bb) % span:][:bb] for i in range(count)]
        if transport == "zmq+curve":
            ep = sealed[frame_bytes].offer("zmq", blocks)
        else:
            ep = servers[frame_bytes].offer(transport, blocks)
        sys.stdout.write(json.dumps(ep) + "\n")
        sys.stdout.flush()

    loop.add_reader(stdin.fileno(), on_request)
    sys.stdout.write('"ready"\n')
    sys.stdout.flush()
    try:
        await done
    finally:
        loop.remove_reader(stdin.fileno())
        for s in (*servers.values(), *sealed.values()):
            await s.close()


class Source:
    """A source process and its pipes; ``offer(...)`` returns an endpoint string."""

    def __init__(self, frame_sizes: list[int], max_bytes: int) -> None:
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.transfer_source", json.dumps([frame_sizes, max_bytes])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        if self._read() != "ready":
            self.close()
            raise RuntimeError("the bench's source process did not start")

    def _read(self) -> object:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the bench's source process exited ({self.proc.poll()})")
        return json.loads(line)

    def offer(self, transport: str, frame_bytes: int, count: int, block_bytes: int) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([transport, frame_bytes, count, block_bytes]) + "\n")
        self.proc.stdin.flush()
        return str(self._read())

    def cpu_s(self) -> float:
        """CPU seconds the source process has used so far."""
        assert self.proc.stdin is not None
        self.proc.stdin.write('"cpu"\n')
        self.proc.stdin.flush()
        return float(self._read())  # type: ignore[arg-type]

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


if __name__ == "__main__":
    sizes, total = json.loads(sys.argv[1])
    asyncio.run(_serve(sizes, total))
