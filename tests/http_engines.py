"""``kvmesh worker`` processes speaking vLLM's protocols (``--http-port``, ``--vllm-events``)
for tests: the engines a gateway forwards to and a bridge indexes."""
from __future__ import annotations

import re
import time

import zmq

from deploy.process import ServerProcess
from kvmesh.events import vllm as ve
from kvmesh.events.zmq_curve import CurveClient

BS = 4
_HTTP = re.compile(r"HTTP on :(\d+)")
_METRICS = re.compile(r"metrics on :(\d+)")
_EVENTS = re.compile(r"vLLM events on (\S+) \(replay ([^)\s]+)\)")


class HttpWorker:
    """One tiny worker with its OpenAI server on a free port and vLLM events (PUB + replay)
    on free loopback ports; ``args`` are more ``kvmesh worker`` flags, ``env`` more of its
    environment (secrets)."""

    def __init__(self, name: str, *args: str, events: bool = True, num_blocks: int = 64,
                 http_port: int = 0, env: dict[str, str] | None = None) -> None:
        flags = ["--model", "tiny", "--device", "cpu", "--block-size", str(BS),
                 "--num-blocks", str(num_blocks), "--port", "0", "--worker-id", name,
                 "--http-port", str(http_port), *args]
        if events:
            flags += ["--vllm-events", "tcp://127.0.0.1:*", "--vllm-replay", "tcp://127.0.0.1:*"]
        self.proc = ServerProcess(name, "worker", flags,
                                  env={"OMP_NUM_THREADS": "1", **(env or {})})
        self.name = name
        self.url = ""
        self.metrics_url = ""  # its vLLM /metrics: the metrics listener, not the HTTP API
        self.events: str | None = None
        self.replay: str | None = None

    def start(self) -> HttpWorker:
        self.proc.start(timeout=120)
        line = next(x for x in self.proc.lines if "listening on" in x)
        self.url = f"http://127.0.0.1:{_HTTP.search(line).group(1)}"
        self.metrics_url = f"http://127.0.0.1:{_METRICS.search(line).group(1)}/metrics"
        m = _EVENTS.search(line)
        if m:
            self.events, self.replay = m.group(1), m.group(2)
        return self

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(15)

    def kill(self) -> None:
        """SIGKILL: the engine dies as a crashed one does."""
        self.proc.kill()

    def replayed(self, start: int = 0, timeout: float = 10.0,
                 curve: CurveClient | None = None) -> list[tuple[int, bytes]]:
        """Every buffered batch from ``start`` (seq, payload), asked over the replay socket
        (as a CURVE client with ``curve``)."""
        assert self.replay is not None
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            curve.apply(sock)
        sock.connect(self.replay)
        try:
            sock.send_multipart(ve.replay_request(start))
            out: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if not sock.poll(int(max(0.0, deadline - time.monotonic()) * 1000)):
                    break
                got = ve.parse_replay_reply(sock.recv_multipart())
                if got is None:
                    return out
                out.append(got)
            raise TimeoutError("the replay socket did not finish its answer")
        finally:
            sock.close(linger=0)
