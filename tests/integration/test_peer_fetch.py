"""Peer fetch between real worker processes: the receiver pulls the holder's prefix over the
data plane (its output the holder's, its cached tokens "peer"); with the holder killed
before the fetch, or SIGKILLed mid-transfer, the request recomputes what did not land and
the output is still the same (and transformers').

Each worker's service credential (``KVMESH_WORKER_TOKEN``) is its peer key's root; tickets
are minted here as the metadata service mints them (``kvmesh.transfer.ticket.mint``).
"""
from __future__ import annotations

import random
import time

import grpc

from deploy.process import ServerProcess
from kvmesh.hashing import block_hashes
from kvmesh.transfer import ticket
from kvmesh.v1 import index_pb2, worker_pb2, worker_pb2_grpc
from worker.engine.engine import Engine

BLOCK = 16
CREDS = {"src": "cred-src-7f3a", "dst": "cred-dst-91bc"}


def _worker(wid: str) -> ServerProcess:
    return ServerProcess(wid, "worker", [
        "--port", "0", "--model", "tiny", "--block-size", str(BLOCK), "--num-blocks", "64",
        "--worker-id", wid], env={"KVMESH_WORKER_TOKEN": CREDS[wid], "KVMESH_TOKEN": ""})


def _generate(address: str, prompt: list[int],
              fetch: index_pb2.FetchPlan | None = None) -> worker_pb2.GenerateResponse:
    tokens: list[int] = []
    with grpc.insecure_channel(address) as ch:
        for msg in worker_pb2_grpc.WorkerServiceStub(ch).Generate(worker_pb2.GenerateRequest(
                token_ids=prompt, sampling=worker_pb2.SamplingParams(max_tokens=6,
                                                                     ignore_eos=True),
                fetch=fetch), timeout=60):
            tokens += msg.token_ids
            if msg.finished:
                msg.token_ids[:] = tokens
                return msg
    raise AssertionError("the stream ended without a final message")


def _plan(src: ServerProcess, prompt: list[int], blocks: int) -> index_pb2.FetchPlan:
    engine = Engine.from_pretrained("tiny", block_size=BLOCK, num_blocks=8)
    hashes = block_hashes(prompt, BLOCK, algo=engine.kv.hash_algo,
                          seed=engine.kv.hash_seed)[:blocks]
    tkt = ticket.mint(ticket.peer_key(CREDS["src"]), ticket.peer_key(CREDS["dst"]), "dst",
                      "src", hashes, int(time.time() * 1000))
    return index_pb2.FetchPlan(source_worker_id="src", source_address=src.address,
                               start_block=0, block_hashes=hashes, tokens=blocks * BLOCK,
                               est_s=0.05, ticket=tkt)


def test_a_fetch_between_processes_and_a_killed_source_fall_back_to_the_same_output():
    rng = random.Random(11)
    first, second = ([rng.randrange(3, 256) for _ in range(6 * BLOCK + 3)] for _ in range(2))
    src, dst = _worker("src").start(), _worker("dst").start()
    try:
        held = _generate(src.address, first)
        got = _generate(dst.address, first, _plan(src, first, 6))
        assert list(got.token_ids) == list(held.token_ids)
        assert dict(got.cached_tokens_by_tier) == {"gpu": 0, "cpu": 0, "disk": 0,
                                                   "peer": 6 * BLOCK}
        held2 = _generate(src.address, second)
        plan2 = _plan(src, second, 6)
        src.kill()  # the holder dies after the route planned the fetch
        again = _generate(dst.address, second, plan2)
        assert list(again.token_ids) == list(held2.token_ids)
        assert again.num_cached_tokens == 0 and "peer" not in again.cached_tokens_by_tier
        with grpc.insecure_channel(dst.address) as ch:
            stats = worker_pb2_grpc.WorkerServiceStub(ch).Stats(
                worker_pb2.WorkerStatsRequest(), timeout=10)
        assert stats.peer.fetches == 1 and stats.peer.fallbacks == 1
        assert stats.peer.peer_hit_tokens == 6 * BLOCK and stats.load.peer_fetch
    finally:
        for p in (src, dst):
            p.kill()


def test_the_source_killed_mid_transfer_keeps_what_landed_and_the_output(tmp_path,
                                                                         monkeypatch):
    """1 MiB blocks, more than the data plane's 16 MiB in flight: the source process is
    SIGKILLed as the first block lands, so part of the plan never leaves it."""
    import asyncio

    import torch

    from kvmesh.transfer.transports import pull as real_pull
    from tests.worker.hf_models import make_hf_model
    from tests.worker.rpc.peers import generate, generate_request, peers
    from worker.rpc import peer_fetch

    bs, blocks = 64, 24
    hf = make_hf_model("LlamaForCausalLM", tmp_path / "m", hidden_size=512,
                       num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=4,
                       max_position_embeddings=2048)  # a block: 4 x 2 x 64 x 4 x 128 x 4 B
    rng = random.Random(12)
    prompt = [rng.randrange(3, 320) for _ in range(blocks * bs + 7)]
    src = ServerProcess("src", "worker", [
        "--port", "0", "--model", str(tmp_path / "m"), "--block-size", str(bs),
        "--num-blocks", "40", "--worker-id", "src"],
        env={"KVMESH_WORKER_TOKEN": CREDS["src"], "KVMESH_TOKEN": ""}).start()

    async def killing_pull(endpoint, block_bytes, count, sink, timeout_s):
        def first_then_kill(i, block):
            sink(i, block)
            if i == 0:
                src.kill()

        return await real_pull(endpoint, block_bytes, count, first_then_kill, timeout_s)

    monkeypatch.setattr(peer_fetch, "pull", killing_pull)

    async def body():
        dst_engine = Engine.from_pretrained(tmp_path / "m", block_size=bs, num_blocks=40)
        assert dst_engine.kv_cache[:, :, 0].numel() * 4 == 1 << 20
        async with peers(("dst", CREDS["dst"], dst_engine)) as (dst,):
            hashes = block_hashes(prompt, bs, algo=dst_engine.kv.hash_algo,
                                  seed=dst_engine.kv.hash_seed)[:blocks]
            tkt = ticket.mint(ticket.peer_key(CREDS["src"]), ticket.peer_key(CREDS["dst"]),
                              "dst", "src", hashes, int(time.time() * 1000))
            plan = index_pb2.FetchPlan(source_worker_id="src", source_address=src.address,
                                       start_block=0, block_hashes=hashes, est_s=1.0,
                                       tokens=blocks * bs, ticket=tkt)
            got = await generate(dst, generate_request(prompt, fetch=plan))
            return got, dict(dst.servicer.peer.fallbacks)

    try:
        held = _generate(src.address, prompt)
        got, reasons = asyncio.run(body())
    finally:
        src.kill()
    assert reasons == {"closed": 1}, reasons
    assert 0 < got.cached_tokens_by_tier["peer"] < blocks * bs
    assert list(got.token_ids) == list(held.token_ids)
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                      pad_token_id=0, attention_mask=torch.ones(1, len(prompt),
                                                                dtype=torch.long))
    assert list(got.token_ids) == out[0, len(prompt):].tolist()
