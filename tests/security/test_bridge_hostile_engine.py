"""A hostile engine endpoint, real processes: whoever answers at one engine's event endpoint sends a
batch nested 3,000 deep (msgspec raised RecursionError, which ended the bridge process and
took every engine it bridges out of routing). Now: a malformed batch of that engine alone;
the process lives, the other engine stays live and routed, and the hostile engine's next
batches are indexed again."""
from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator

import pytest

from deploy.redis_server import RedisServer
from kvmesh.events import vllm as ve
from tests.bridge.cluster import BS, BridgeProcess, Engine, P, chain, router, start_service

pytestmark = pytest.mark.integration

NESTED = b"\x93\xcb" + struct.pack(">d", 1.0) + b"\x91" * 3000 + b"\x90\x00"
Q = [n + 500 for n in P]  # another three-block prompt


@pytest.fixture
def service(redis_server: RedisServer, redis_url: str) -> Iterator[str]:
    """A service process over an empty index (``redis_url`` empties it): the test counts every
    worker the index lists, and other suites leave theirs behind."""
    proc = start_service(redis_server)
    try:
        yield proc.address
    finally:
        proc.stop()


def test_a_nested_batch_from_one_engine_stops_neither_the_bridge_nor_the_other(
        service: str, tmp_path) -> None:
    async def main():
        a, b = Engine("hostile-a", "m-h"), Engine("honest-b", "m-h")
        cfg = tmp_path / "fleet.toml"
        cfg.write_text(f'service = "{service}"\n' + "".join(
            f'[[engines]]\nworker-id = "{e.spec.worker_id}"\naddress = "{e.metrics.url}"\n'
            f'events = "{e.spec.events}"\nreplay = "{e.spec.replay}"\nblock-size = {BS}\n\n'
            for e in (a, b)))
        proc = BridgeProcess("--config", str(cfg))
        try:
            async with router(service) as r:
                a.pub.publish(chain(P))
                b.pub.publish(chain(Q))

                async def both():  # (publishes until the subscriptions took effect)
                    m, q = await r.matched(P, "m-h"), await r.matched(Q, "m-h")
                    if m.get("hostile-a") != 12:
                        a.pub.publish(chain(P, first=100 + a.pub.seq))
                    return m.get("hostile-a"), q.get("honest-b")
                await r.until(both, lambda got: got == (12, 12))
                seq = a.pub.seq
                a.pub.seq += 1
                a.pub.pub.send_multipart(ve.pack_message(b"", seq, NESTED))
                # the batch is lost: engine a's entries are cleared ...
                await r.until(lambda: r.matched(P, "m-h"), lambda m: m.get("hostile-a") == 0)
                await asyncio.sleep(4)  # past the service's 3 s liveness timeout
                assert proc.proc.poll() is None, proc.output()
                assert await r.alive() == {"hostile-a": True, "honest-b": True}
                # ... engine b never noticed; engine a's next batches are indexed again
                assert (await r.matched(Q, "m-h")).get("honest-b") == 12
                a.pub.publish(chain(P, first=1000))
                await r.until(lambda: r.matched(P, "m-h"), lambda m: m.get("hostile-a") == 12)
                assert "RecursionError" not in proc.output()
            assert proc.stop() == 0, proc.output()
        finally:
            proc.stop()
            await a.close()
            await b.close()
    asyncio.run(main())
