"""KV tiers end to end through the engine: greedy output is identical whether a prefix comes
from the device pool, host memory, disk, or is recomputed, whatever happens to the copies.

A tiny device pool forces evictions: a prompt's blocks are offloaded when later prompts need
the room, and come back (onboard) when the prompt is sent again.
"""
from __future__ import annotations

import random
import threading

import pytest
import torch

from tests.worker.hf_models import make_hf_model
from worker import Engine
from worker.engine.engine import StepFailed
from worker.engine.sequence import SamplingParams, SeqStatus
from worker.kv_cache.tier_config import TierConfig
from worker.model import load_model

BS = 4
N_OUT = 4
WAIT = 10.0


def prompts(seed: int, n: int, length: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(0, 256) for _ in range(length)] for _ in range(n)]


A, B, C = prompts(1, 3, 24)  # 6 blocks each; with N_OUT tokens, 7 blocks in use
D, E = prompts(2, 2, 12)     # never seen before A's copies start: nothing to onboard


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def engine(tiny, num_blocks: int = 8, hash_seed: str | None = None, *,
           write_behind: bool = True, **tiers) -> Engine:
    model, config = tiny
    return Engine(model, config, block_size=BS, num_blocks=num_blocks, hash_seed=hash_seed,
                  tiers=TierConfig(**tiers), write_behind=write_behind)


@pytest.fixture(scope="module")
def want(tiny):
    """Greedy output of every prompt, recomputed from scratch (a fresh, big pool)."""
    e = engine(tiny, num_blocks=64)
    out = {tuple(p): e.generate([p], N_OUT, ignore_eos=True)[0].token_ids for p in (A, B, C)}
    for p in (D, E):
        out[tuple(p)] = engine(tiny, num_blocks=64).generate([p], 12, ignore_eos=True)[
            0].token_ids
    return out


def run(e: Engine, p: list[int]):
    return e.generate([p], N_OUT, ignore_eos=True)[0]


def evict_a(e: Engine) -> None:
    """Serve A, then B and C, which push A's blocks out of the 8-block device pool."""
    run(e, A)
    run(e, B)
    run(e, C)


def drain(e: Engine) -> None:
    while e.has_work():
        e.step()


@pytest.mark.parametrize("write_behind", [True, False], ids=["write-behind", "sync"])
@pytest.mark.parametrize("where", ["gpu", "cpu", "disk", "recompute"])
def test_output_is_identical_wherever_the_prefix_comes_from(tiny, want, tmp_path, where,
                                                            write_behind):
    kw = {"gpu": dict(num_blocks=64), "cpu": dict(cpu_blocks=32),
          "disk": dict(cpu_blocks=1, disk_blocks=64, disk_dir=tmp_path),
          "recompute": {}}[where]
    e = engine(tiny, write_behind=write_behind, **kw)
    evict_a(e)
    got = run(e, A)
    assert got.token_ids == want[tuple(A)]
    tiers = got.cached_tokens_by_tier
    assert sum(tiers.values()) == got.num_cached_tokens
    if where == "recompute":
        assert got.num_cached_tokens < len(A) - BS
    else:
        assert tiers[where] > 0, tiers
    e.close()


def test_a_chain_split_across_all_three_tiers(tiny, want, tmp_path):
    e = engine(tiny, cpu_blocks=3, disk_blocks=64, disk_dir=tmp_path)
    run(e, A)
    run(e, B)  # A's tail leaves the device first: to cpu, then (cpu full) on to disk
    got = run(e, A)
    tiers = got.cached_tokens_by_tier
    assert tiers["gpu"] > 0 and tiers["cpu"] > 0 and tiers["disk"] > 0, tiers
    assert got.token_ids == want[tuple(A)]
    assert run(e, B).token_ids == want[tuple(B)]
    e.close()


def test_a_failed_copy_falls_back_to_recompute(tiny, want):
    e = engine(tiny, cpu_blocks=32)
    evict_a(e)
    real = e.copies.copy_in

    def broken(tier, src, block_id):
        raise RuntimeError("DMA error (injected)")

    e.copies.copy_in = broken
    got = run(e, A)
    assert got.token_ids == want[tuple(A)]
    assert got.cached_tokens_by_tier["cpu"] == 0
    e.copies.copy_in = real
    evict_a(e)  # the failed blocks were dropped; A goes down again and comes back fine
    again = run(e, A)
    assert again.token_ids == want[tuple(A)] and again.cached_tokens_by_tier["cpu"] > 0
    assert e.kv.num_free_blocks == e.kv.num_blocks  # nothing leaked


def test_a_failed_offload_fails_its_step_and_its_blocks_are_never_used(tiny, want):
    """Synchronous offloads (a write-behind one fails behind the step: test_write_behind)."""
    e = engine(tiny, cpu_blocks=32, write_behind=False)
    run(e, A)
    real = e.copies._offload

    def broken(copies):
        raise RuntimeError("copy failed (injected)")

    e.copies._offload = broken
    with pytest.raises(StepFailed):
        run(e, B)  # B's prefill evicts A's blocks: their copy to host memory fails
    e.copies._offload = real
    got = run(e, A)
    assert got.token_ids == want[tuple(A)]
    assert got.cached_tokens_by_tier["cpu"] == 0
    assert run(e, B).token_ids == want[tuple(B)]
    assert e.kv.num_free_blocks == e.kv.num_blocks


def disk_files(e: Engine) -> set[bytes]:
    e.copies.flush(WAIT)
    return {bytes.fromhex(f.name.split(".")[0]) for f in e.copies.store.dir.glob("*.kvb")}


def test_a_failed_offload_never_announces_its_blocks_on_disk(tiny, want, tmp_path):
    """A failed copy: the copy device -> host raises mid-step. The manager is told before
    the step's events go out: every CPU entry of that batch is removed (``PoolRemoved
    cpu`` in the same batch of events as its ``PoolStored cpu``; a spill of it in the same
    step is refused and withdrawn likewise), so the pressure that follows never spills it,
    and the index (events, snapshot) never holds a disk block with no file."""
    from kvmesh.events.pool import PoolRemoved, PoolStored

    e = engine(tiny, cpu_blocks=1, disk_blocks=16, disk_dir=tmp_path, write_behind=False)
    run(e, A)
    e.kv.take_events()
    real = e.copies._offload
    e.copies._offload = lambda copies: (_ for _ in ()).throw(RuntimeError("DMA (injected)"))
    with pytest.raises(StepFailed):
        run(e, B)  # B's prefill evicts A's blocks: the offload fails
    e.copies._offload = real
    events = e.kv.take_events()
    held: dict[str, set[bytes]] = {"gpu": set(), "cpu": set(), "disk": set()}
    for ev in events:  # what an index holds after this step's batch: nothing below
        if isinstance(ev, PoolStored):
            held[ev.tier].update(ev.block_hashes)
        elif isinstance(ev, PoolRemoved):
            held[ev.tier].difference_update(ev.block_hashes)
    assert any(isinstance(ev, PoolStored) and ev.tier == "cpu" for ev in events)
    # The one host slot was spilled within the step, too: refused, withdrawn as well.
    assert held["cpu"] == held["disk"] == set()
    assert set(e.kv.cached_block_hashes().by_tier()) == {"gpu"}
    for p in (C, D, E):  # more pressure: the CPU tier spills
        run(e, p)
    assert set(on_disk(e)) <= disk_files(e)
    assert run(e, A).token_ids == want[tuple(A)]
    assert e.kv.num_free_blocks == e.kv.num_blocks
    e.close()


def test_a_failed_disk_write_withdraws_its_disk_block(tiny, want, tmp_path):
    """A spill's file write fails on the background thread: the next step (or the idle
    loop: ``Engine.settle_copies``) drops the disk entry, so it is neither announced nor
    onboarded; the prompt is recomputed, with the right output."""
    from kvmesh.events.pool import PoolRemoved, PoolStored

    spilled = False
    e = engine(tiny, cpu_blocks=1, disk_blocks=16, disk_dir=tmp_path)
    store = e.copies.store
    real = store.write
    store.write = lambda entry, data: (_ for _ in ()).throw(OSError(28, "disk full"))
    e.kv.take_events()
    evict_a(e)
    e.copies.flush(WAIT)
    late = set(on_disk(e))  # the last step's spills: their writes failed after it
    assert e.settle_copies() == len(late) and not on_disk(e) and not disk_files(e)
    disk: set[bytes] = set()
    for ev in e.kv.take_events():
        if isinstance(ev, PoolStored) and ev.tier == "disk":
            disk.update(ev.block_hashes)
            spilled = True
        elif isinstance(ev, PoolRemoved) and ev.tier == "disk":
            disk.difference_update(ev.block_hashes)
    assert spilled and not disk  # every disk block announced was withdrawn
    store.write = real
    got = run(e, A)
    assert got.token_ids == want[tuple(A)] and got.cached_tokens_by_tier["disk"] == 0
    assert set(on_disk(e)) <= disk_files(e)
    e.close()


@pytest.mark.parametrize("damage", ["corrupt", "truncate"])
def test_a_damaged_disk_file_is_recomputed_never_used(tiny, want, tmp_path, damage):
    e = engine(tiny, cpu_blocks=1, disk_blocks=64, disk_dir=tmp_path)
    evict_a(e)
    e.copies.flush(WAIT)
    files = sorted(e.copies.store.dir.glob("*.kvb"))
    assert files
    for f in files:  # every block: whichever one A needs is damaged
        data = bytearray(f.read_bytes())
        if damage == "corrupt":
            data[-7] ^= 0x10
        else:
            data = data[:-3]
        f.write_bytes(bytes(data))
    got = run(e, A)
    assert got.token_ids == want[tuple(A)]
    assert got.cached_tokens_by_tier["disk"] == 0
    e.close()
    # the onboard read a damaged file, refused it and deleted it
    assert any(not f.exists() for f in files)


def on_disk(e: Engine) -> dict[bytes, bytes | None]:
    """Hash -> parent of the disk tier, from the snapshot a (re)started worker syncs."""
    hashes, parents = e.kv.cached_block_hashes().by_tier().get("disk", ([], []))
    return dict(zip(hashes, parents, strict=True))


def rooted(chains: dict[bytes, bytes | None]) -> set[bytes]:
    """The hashes reachable from block 0 through ``chains`` alone."""
    def ok(h: bytes | None) -> bool:
        return h is None or (h in chains and ok(chains[h]))
    return {h for h in chains if ok(chains[h])}


def test_a_restart_on_the_same_disk_dir_announces_and_hits_its_blocks(tiny, want, tmp_path):
    model, config = tiny
    first = engine(tiny, cpu_blocks=1, disk_blocks=64, disk_dir=tmp_path)
    evict_a(first)
    for p in prompts(7, 2, 24):  # A's head leaves the device and the host too
        run(first, p)
    before = on_disk(first)
    first.close()

    again = engine(tiny, cpu_blocks=1, disk_blocks=64, disk_dir=tmp_path)
    # the snapshot (the first sync) announces every chain the files hold from block 0;
    # the others could never be hit, their heads died with the first process's memory
    assert set(on_disk(again)) == rooted(before) and len(rooted(before)) >= 5
    got = run(again, A)
    assert got.token_ids == want[tuple(A)] and got.cached_tokens_by_tier["disk"] > 0
    again.close()

    seeded = engine(tiny, cpu_blocks=1, disk_blocks=64, disk_dir=tmp_path, hash_seed="other")
    assert on_disk(seeded) == {}
    assert run(seeded, A).cached_tokens_by_tier["disk"] == 0
    seeded.close()

    other_model, _ = load_model("tiny")
    with torch.no_grad():
        other_model.embed_tokens.weight[0, 0] += 1.0  # same shapes, other weights
    stranger = Engine(other_model, config, block_size=BS, num_blocks=8,
                      tiers=TierConfig(cpu_blocks=1, disk_blocks=64, disk_dir=tmp_path))
    assert on_disk(stranger) == {}
    stranger.close()


class Gate:
    """Wraps the executor's copies: each one first scribbles NaN into its destination
    block (what a reader of an unfinished copy would see), then waits for ``open``."""

    def __init__(self, e: Engine) -> None:
        self.real = e.copies.copy_in
        self.cache = e.kv_cache
        self.open = threading.Event()
        self.started = threading.Event()
        self.blocks: list[int] = []
        e.copies.copy_in = self

    def __call__(self, tier, src, block_id):
        self.blocks.append(block_id)
        self.cache[:, :, block_id] = float("nan")
        self.started.set()
        assert self.open.wait(WAIT)
        self.real(tier, src, block_id)


def test_a_request_waits_for_its_copy_while_others_progress(tiny, want):
    e = engine(tiny, num_blocks=16, cpu_blocks=32)
    evict_a(e)
    run(e, A[:8] + C)  # A's head is back on the device, its tail still in the cpu tier
    gate = Gate(e)
    params = SamplingParams(N_OUT, ignore_eos=True)
    a = e.add_request(A, params)
    e.step()
    assert gate.started.wait(WAIT)
    assert e.kv.onboarding(a.req) and a.status is SeqStatus.WAITING
    read: list[list[int]] = []
    forward = e.model.forward

    def spy(ids, pos, meta, cache):
        read.append(meta.block_tables.flatten().tolist())
        return forward(ids, pos, meta, cache)

    e.model.forward = spy
    d = e.add_request(D, SamplingParams(12, ignore_eos=True))
    while d.status is not SeqStatus.FINISHED:
        e.step()
        assert a.status is SeqStatus.WAITING
    assert d.output_ids == want[tuple(D)]
    assert not any(set(gate.blocks) & set(t) for t in read)  # never read mid-copy
    gate.open.set()
    drain(e)
    assert a.output_ids == want[tuple(A)] and a.cached_tokens_by_tier["cpu"] > 0


def test_an_abort_during_a_copy_releases_its_blocks_when_the_copy_ends(tiny, want):
    e = engine(tiny, cpu_blocks=32)
    evict_a(e)
    gate = Gate(e)
    a = e.add_request(A, SamplingParams(N_OUT, ignore_eos=True))
    e.step()
    assert gate.started.wait(WAIT)
    e.abort(a)
    assert e.has_work()  # the copy still runs: its blocks are not free yet
    assert e.kv.num_free_blocks < e.kv.num_blocks
    gate.open.set()
    drain(e)
    assert e.kv.num_free_blocks == e.kv.num_blocks
    e.copies.copy_in = gate.real
    assert run(e, A).token_ids == want[tuple(A)]


def test_preemption_during_a_copy(tiny, want):
    e = engine(tiny, num_blocks=12, cpu_blocks=32)
    evict_a(e)
    gate = Gate(e)
    long = SamplingParams(12, ignore_eos=True)
    a = e.add_request(A, SamplingParams(N_OUT, ignore_eos=True))
    e.step()
    assert gate.started.wait(WAIT)
    # two requests that outgrow what the pool has left while A's copy holds its blocks
    d = e.add_request(D, long)
    f = e.add_request(E, long)
    for _ in range(100):
        if e.scheduler.num_preemptions:
            break
        e.step()
    assert e.scheduler.num_preemptions > 0  # while A's copy is still in flight
    assert a.status is SeqStatus.WAITING and e.kv.onboarding(a.req)
    gate.open.set()
    drain(e)
    assert d.output_ids == want[tuple(D)] and f.output_ids == want[tuple(E)]
    assert a.output_ids == want[tuple(A)]
    assert e.kv.num_free_blocks == e.kv.num_blocks


def test_measured_costs_in_load(tiny, tmp_path):
    plain = engine(tiny)
    assert plain.load()["onboard_us_per_block_cpu"] == 0.0
    assert plain.load()["prefill_us_per_token"] == 0.0
    run(plain, A)
    assert plain.load()["prefill_us_per_token"] > 0.0  # live, from the prefill step
    tiered = engine(tiny, cpu_blocks=4, disk_blocks=4, disk_dir=tmp_path)
    load = tiered.load()  # calibrated at start
    assert load["prefill_us_per_token"] > 0.0
    assert load["onboard_us_per_block_cpu"] > 0.0
    assert load["onboard_us_per_block_disk"] > 0.0
    assert list(tiered.copies.store.dir.iterdir()) == []  # the calibration file is gone
    assert torch.count_nonzero(tiered.kv_cache) == 0     # and the pool is clean again
    tiered.close()


def test_settings_that_cannot_work_are_refused(tiny, tmp_path):
    with pytest.raises(ValueError):
        engine(tiny, disk_blocks=4)                 # no directory
    with pytest.raises(ValueError):
        engine(tiny, disk_blocks=4, disk_dir=tmp_path)  # no host tier to spill from
    with pytest.raises(ValueError):
        engine(tiny, cpu_blocks=-1)


def test_tiered_output_equals_transformers(tmp_path):
    hf = make_hf_model("LlamaForCausalLM", tmp_path / "model")
    e = Engine.from_pretrained(tmp_path / "model", block_size=BS, num_blocks=8,
                               tiers=TierConfig(cpu_blocks=2, disk_blocks=32,
                                                disk_dir=tmp_path / "disk"))
    first, *others = prompts(3, 3, 24)
    for p in (first, *others):
        run(e, p)
    got = run(e, first)  # its tail comes back from the cpu and disk tiers
    assert got.cached_tokens_by_tier["cpu"] + got.cached_tokens_by_tier["disk"] > 0
    out = hf.generate(torch.tensor([first]), max_new_tokens=N_OUT, do_sample=False,
                      pad_token_id=0, attention_mask=torch.ones(1, len(first), dtype=torch.long))
    assert got.token_ids == out[0, len(first):].tolist()
    e.close()


@pytest.mark.slow
@pytest.mark.parametrize("write_behind", [True, False], ids=["write-behind", "sync"])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_traffic_with_failing_copies_aborts_and_damaged_files(tiny, tmp_path, seed,
                                                                     write_behind):
    """Shared prefixes under a tiny pool, copies that fail at random (onboards, offloads,
    disk writes), files damaged behind the worker's back, requests aborted mid-flight:
    every finished output equals the recomputed one, nothing leaks, the disk tier's books
    match the files, and the index never hears of a disk block with no file. A failed
    synchronous offload fails its step; a failed write-behind one is only reported lost."""
    rng = random.Random(seed)
    heads = prompts(10 + seed, 4, 16)
    e = engine(tiny, num_blocks=12, cpu_blocks=4, disk_blocks=24, disk_dir=tmp_path,
               write_behind=write_behind)
    real = e.copies.copy_in

    def flaky(tier, src, block_id):
        if rng.random() < 0.15:
            raise RuntimeError("copy failed (injected)")
        real(tier, src, block_id)

    e.copies.copy_in = flaky
    real_offload, real_write = e.copies._offload, e.copies.store.write

    def flaky_offload(copies):
        if rng.random() < 0.05:
            raise RuntimeError("offload failed (injected)")
        real_offload(copies)

    def flaky_write(entry, data):
        if rng.random() < 0.1:
            raise OSError(5, "write failed (injected)")
        real_write(entry, data)

    lane_rng, lost_offloads = random.Random(seed + 100), []
    if write_behind:  # the lane's thread copies: it fails there, behind the step
        real_layer = e.copies.behind.copy_layer

        def flaky_layer(layer, blocks, slots):
            if lane_rng.random() < 0.02:
                lost_offloads.append(blocks.tolist())
                raise RuntimeError("offload failed (injected)")
            real_layer(layer, blocks, slots)

        e.copies.behind.copy_layer = flaky_layer
    else:
        e.copies._offload = flaky_offload
    e.copies.store.write = flaky_write
    ref = engine(tiny, num_blocks=64)
    want: dict[tuple[int, ...], list[int]] = {}
    live, done = [], []
    failed_steps = 0
    for _ in range(400):
        if len(done) >= 30 and not live:
            break
        if len(done) + len(live) < 30 and rng.random() < 0.3:
            p = rng.choice(heads) + [rng.randrange(256) for _ in range(rng.randrange(1, 6))]
            live.append(e.add_request(p, SamplingParams(3, ignore_eos=True)))
        if live and rng.random() < 0.03:
            e.abort(live.pop(rng.randrange(len(live))))
        if rng.random() < 0.05:
            e.copies.flush(WAIT)
            files = list(e.copies.store.dir.glob("*.kvb"))
            if files:
                f = rng.choice(files)
                f.write_bytes(f.read_bytes()[:-1])
        try:
            e.step()
        except StepFailed as exc:  # a failed offload: its requests are aborted
            failed_steps += 1
            for s in exc.seqs:
                if s in live:
                    live.remove(s)
        for s in [s for s in live if s.status is SeqStatus.FINISHED]:
            live.remove(s)
            done.append(s)
        e.copies.flush(WAIT)
        e.settle_copies()
        if not e.copies.onboarding():  # (a read refused a damaged file: told at the poll)
            assert set(on_disk(e)) <= disk_files(e), "a disk block announced with no file"
    drain(e)
    assert len(done) >= 20
    assert (lost_offloads and not failed_steps) if write_behind else failed_steps
    for s in done:
        key = tuple(s.req.token_ids[:s.num_prompt_tokens])
        if key not in want:
            want[key] = ref.generate([list(key)], 3, ignore_eos=True)[0].token_ids
        assert s.output_ids == want[key]
    assert sum(s.cached_tokens_by_tier["cpu"] + s.cached_tokens_by_tier["disk"]
               for s in done) > 0
    assert e.kv.num_free_blocks == e.kv.num_blocks and not e.copies.onboarding()
    e.copies.flush(WAIT)
    files = {bytes.fromhex(f.name.split(".")[0]) for f in e.copies.store.dir.glob("*.kvb")}
    assert set(on_disk(e)) == files  # a dropped block's file is deleted, and only then
    e.close()


@pytest.mark.parametrize("edit", [
    {"rope_theta": 500000.0},
    {"rms_norm_eps": 1e-2},
    {"max_position_embeddings": 16384},  # tiny's is 8192
    {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
], ids=lambda e: next(iter(e)))
def test_a_restart_with_an_edited_config_never_serves_the_old_disk_kv(tmp_path, edit):
    """The fingerprint covers the config: the same weights under another config.json (a context
    extension,
    another RoPE base or norm epsilon) wrote other KV bytes; a restart on the same disk
    directory must recompute, and its greedy output must be the uncached run's."""
    from worker.model import loader
    from worker.model.config import ModelConfig

    def build(extra: dict):
        cfg = ModelConfig.from_dict({**loader.TINY_CONFIG, **extra})
        model = loader._empty_model(cfg, torch.device("cpu"), torch.float32)
        loader.init_random(model, loader.TINY_SEED, loader.TINY_INIT_STD)  # the same weights
        return model, cfg

    old, new = build({}), build(edit)
    first = engine(old, cpu_blocks=1, disk_blocks=64, disk_dir=tmp_path)
    for p in (A, B, C, *prompts(7, 2, 24)):  # A's blocks leave the device and the host
        run(first, p)
    first.close()
    same = engine(old, cpu_blocks=1, disk_blocks=64, disk_dir=tmp_path)
    assert run(same, A).cached_tokens_by_tier["disk"] > 0  # the files were there to hit
    same.close()
    want = run(engine(new, num_blocks=64), A).token_ids  # uncached, the edited config
    again = engine(new, cpu_blocks=1, disk_blocks=64, disk_dir=tmp_path)
    got = run(again, A)
    again.close()
    assert got.cached_tokens_by_tier["disk"] == 0
    assert got.token_ids == want
