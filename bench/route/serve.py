"""The service child of `kvmesh bench route`: ``python -m bench.route.serve METRICS_PORT
MEMO`` (the Redis URL, password included, in env ``KVMESH_REDIS_URL``) runs
``create_server`` (redis backend, default settings) until SIGTERM and prints ``listening on
HOST:PORT`` once it serves. ``MEMO`` 0 replaces the service's block-hash memo with plain
hashing, to measure what the memo buys."""
from __future__ import annotations

import asyncio
from typing import Any


class _NoMemo:
    """Stands in for the service's ``BlockHashMemo``: hashes every block every time (the
    service as it was before the memo; ``--no-hash-memo``)."""

    @staticmethod
    def block_hashes(*args: Any, **kw: Any) -> list[bytes]:
        from kvmesh.hashing import block_hashes

        return block_hashes(*args, **kw)


async def _serve(redis_url: str, metrics_port: int, memo: bool = True) -> None:
    """The service of the benchmark: redis backend, defaults otherwise, until SIGTERM."""
    import signal

    from service.config import ServiceConfig
    from service.server import create_server

    # Liveness is not what this measures: a generous timeout keeps the protocol workers
    # routable even when a loaded machine delays their heartbeat thread.
    cfg = ServiceConfig(backend="redis", redis_url=redis_url, metrics_port=metrics_port,
                        liveness_timeout_s=30.0, purge_after_s=60.0)
    server, port = await create_server("127.0.0.1:0", cfg)
    if not memo:
        server.servicer.router.hash_memo = _NoMemo()  # type: ignore[assignment]
    await server.start()
    print(f"bench service listening on 127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=1.0)


if __name__ == "__main__":
    import os
    import sys

    # the URL carries the Redis password: it comes in the environment, not on argv
    asyncio.run(_serve(os.environ["KVMESH_REDIS_URL"], int(sys.argv[1]), sys.argv[2] == "1"))
