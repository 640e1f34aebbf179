"""``worker.vllm.publisher`` on real ZMQ sockets over loopback: who may connect and how much a
replay may pull (the events carry every tenant's prompt ids and salts)."""
from __future__ import annotations

import asyncio
import time

import pytest
import zmq
import zmq.asyncio
import zmq.auth

from bridge.engine_state import EngineState
from bridge.subscriber import Subscriber
from deploy.waiting import eventually
from kvmesh.events import vllm as ve
from kvmesh.events.zmq_curve import CurveClient, CurveServer
from worker.main import WorkerOptions, vllm_curve
from worker.vllm.publisher import VllmPublisher

BS = 4
SALT = "tenant-salt-0123456789abcdef"
PROMPT = [101, 32, 83, 69, 67, 82, 69, 84]  # two blocks


def secret_batch() -> list[ve.VllmEvent]:
    """A tenant's two prompt blocks, the salt on block 0 (as the worker publishes them)."""
    return [ve.VllmStored(block_hashes=[11, 12], parent_block_hash=None, token_ids=PROMPT,
                          block_size=BS, lora_id=None, medium=None, lora_name=None,
                          extra_keys=[(SALT,), None])]


@pytest.fixture
def keys(tmp_path):
    """Certificates of a worker, an allowed bridge and an outsider; ``clients`` lists only the
    bridge."""
    clients = tmp_path / "clients"
    clients.mkdir()
    _, worker = zmq.auth.create_certificates(tmp_path, "worker")
    bridge_pub, bridge = zmq.auth.create_certificates(tmp_path, "bridge")
    _, outsider = zmq.auth.create_certificates(tmp_path, "outsider")
    (clients / "bridge.key").write_bytes(open(bridge_pub, "rb").read())
    for f in (worker, bridge, outsider):
        (tmp_path / f).chmod(0o600)
    return {"worker": worker, "clients": clients, "bridge": bridge, "outsider": outsider,
            "worker_public": str(tmp_path / "worker.key")}


@pytest.mark.parametrize("events,replay", [
    ("tcp://*:5557", None), ("tcp://0.0.0.0:5557", None), ("tcp://[::]:5557", None),
    ("tcp://10.1.2.3:5557", None), ("tcp://eth0:5557", None),
    ("tcp://127.0.0.1:5557", "tcp://*:5558"), ("tcp://127.0.0.1:5557", "tcp://0.0.0.0:5558")])
def test_a_non_loopback_bind_without_curve_is_refused(events, replay):
    with pytest.raises(ValueError, match="CURVE"):
        VllmPublisher(events, replay, block_size=BS)
    with pytest.raises(ValueError, match="CURVE"):
        vllm_curve(WorkerOptions(vllm_events=events, vllm_replay=replay))


def test_loopback_stays_plain_for_vllm_consumers_unless_the_worker_needs_a_token(keys):
    for local in ("tcp://127.0.0.1:5557", "tcp://[::1]:5557", "tcp://localhost:5557",
                  "ipc:///tmp/kvmesh-events"):
        VllmPublisher(local, local, block_size=BS)  # vLLM's consumers speak plain ZMQ
        assert vllm_curve(WorkerOptions(vllm_events=local)) is None
    # a worker that requires an access token does not hand its prompts to any local process
    with pytest.raises(ValueError, match="access token"):
        vllm_curve(WorkerOptions(vllm_events="tcp://127.0.0.1:5557", access_token="t"))
    with pytest.raises(ValueError, match="together"):
        vllm_curve(WorkerOptions(vllm_events="tcp://*:5557", vllm_curve_key=keys["worker"]))
    curve = vllm_curve(WorkerOptions(vllm_events="tcp://*:5557", access_token="t",
                                     vllm_curve_key=keys["worker"],
                                     vllm_curve_clients=str(keys["clients"])))
    assert isinstance(curve, CurveServer) and len(curve.clients) == 1


async def _replay(ctx: zmq.asyncio.Context, endpoint: str, start: int = 0,
                  curve: CurveClient | None = None, wait: float = 1.5):
    """(batches, whether the end marker came) of one replay request."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        curve.apply(dealer)
    dealer.connect(endpoint)
    got = []
    try:
        await dealer.send_multipart(ve.replay_request(start))
        while await dealer.poll(int(wait * 1000)):
            reply = ve.parse_replay_reply(await dealer.recv_multipart())
            if reply is None:
                return got, True
            got.append(reply)
        return got, False
    finally:
        dealer.close(linger=0)


@pytest.mark.slow
def test_with_curve_only_a_listed_bridge_reads_the_events(keys):
    """CURVE sockets: a bridge subscriber with a listed key indexes the tenant's blocks (live
    and by replay); a plain client and a CURVE client with another key get nothing."""
    server = CurveServer.load(keys["worker"], keys["clients"])
    bridge = CurveClient.load(keys["bridge"], keys["worker_public"])
    outsider = CurveClient.load(keys["outsider"], server.public.decode())

    async def main():
        pub = VllmPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", block_size=BS,
                            curve=server)
        events, replay = pub.start()
        ctx = zmq.asyncio.Context()
        spies = []
        for curve in (None, outsider):  # live spies: plain, and CURVE with the wrong key
            sock = ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.subscribe(b"")
            if curve is not None:
                curve.apply(sock)
            sock.connect(events)
            spies.append(sock)
        state = EngineState(block_size=BS)
        sub = Subscriber(state, events, replay, lambda evs: None, replay_timeout=1.0,
                         probe_interval=0.3, ctx=ctx, curve=bridge)
        task = asyncio.create_task(sub.run())
        try:
            pub._publish(time.time(), secret_batch())  # before the bridge: by replay
            await eventually(lambda: _value(sub.stats.applied >= 1), within=10)
            pub._publish(time.time(), secret_batch())  # live, to everyone connected
            await eventually(lambda: _value(sub.stats.applied >= 2), within=10)
            for sock in spies:
                assert not await sock.poll(500)
            for curve in (None, outsider):
                assert await _replay(ctx, replay, curve=curve, wait=1.0) == ([], False)
            got, complete = await _replay(ctx, replay, curve=bridge)
            assert complete and [s for s, _ in got] == [0, 1]
            stored = ve.decode_batch(got[0][1]).events[0]
            assert stored.token_ids == PROMPT and list(stored.extra_keys[0]) == [SALT]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            for sock in spies:
                sock.close(linger=0)
            ctx.destroy(linger=0)
            await pub.close()
    asyncio.run(main())


async def _value(v):
    return v


def _published(pub: VllmPublisher, n: int) -> None:
    for _ in range(n):
        pub._publish(time.time(), secret_batch())


def test_one_replay_request_is_capped_in_batches_and_bytes():
    async def main():
        pub = VllmPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", block_size=BS,
                            buffer=100, replay_max_batches=10)
        _, replay = pub.start()
        ctx = zmq.asyncio.Context()
        try:
            _published(pub, 100)
            got, complete = await _replay(ctx, replay)
            assert complete and [s for s, _ in got] == list(range(10))  # the oldest first
            got, complete = await _replay(ctx, replay, start=95)
            assert complete and [s for s, _ in got] == list(range(95, 100))
            size = len(pub.buffer[0][1])
            pub.replay_max_bytes = 3 * size  # what one answer may carry
            got, complete = await _replay(ctx, replay, start=20)
            assert complete and [s for s, _ in got] == [20, 21, 22]
            assert pub.counters["replays_capped"] == 2
        finally:
            ctx.destroy(linger=0)
            await pub.close()
    asyncio.run(main())


@pytest.mark.slow
def test_a_caller_repeating_replays_is_bounded():
    """A full replay when a consumer connects and a second one after a restart are served;
    one caller asking again and again gets no more until its budget refills, new connections
    (new ROUTER routing ids) included."""
    async def main():
        pub = VllmPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", block_size=BS,
                            buffer=50)
        _, replay = pub.start()
        ctx = zmq.asyncio.Context()
        try:
            _published(pub, 50)
            for _ in range(2):
                got, complete = await _replay(ctx, replay)
                assert complete and len(got) == 50
            served = 100
            for _ in range(5):  # every request a fresh DEALER, as the bridge's
                got, _ = await _replay(ctx, replay, wait=0.3)
                served += len(got)
            # the budget refills one buffer a minute: a few batches at most meanwhile
            assert served <= 100 + 10
            assert pub.counters["replays_refused"] >= 4
        finally:
            ctx.destroy(linger=0)
            await pub.close()
    asyncio.run(main())
