"""Random workloads over a manager with CPU and disk tiers, onboards, failures and aborts.

Checked after every step:

- index equivalence: a consumer keeping one plain set per tier, fed only the events, holds
  exactly what each tier holds, and a block that stays held somewhere is never seen held
  nowhere (a move is stored below before it is removed above);
- the data: a fake data plane executing the transfer orders in order holds, in every
  device block, CPU slot and disk file, the KV the books say; every cache hit a request
  gets is its own prefix; no copy's source changes while it is read;
- the references: every block's ``ref_cnt`` is the number of block tables and holds that
  contain it; lower entries are read exactly by the in-flight onboards; slots are unique;
- the snapshot covers every tier; cached tokens per tier add up to the cached tokens;
- failed copies (an offload batch, a disk write: ``fail``): the manager, told by the plane
  as the engine tells it, holds no entry whose bytes were not written (the data check), and
  an onboard that read one fails and recomputes;
- eviction classes (``decoded``, under ``eviction="layered"``): a lower entry of a block
  the device no longer holds has the class the device last gave it, and an onboarded
  block takes its entry's class, not its destination's.
"""
import random
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvmesh.events.pool import PoolCleared, PoolRemoved, PoolStored
from worker.kv_cache import KVCacheManager, KVRequest

from .fake_plane import FakePlane
from .test_state_machine import ALGO as SM_ALGO
from .test_state_machine import BS as SM_BS
from .test_state_machine import NUM_BLOCKS as SM_BLOCKS
from .test_state_machine import KVCacheMachine

BS = 2
NUM_BLOCKS = 6
MAX_LEN = 12
TOKENS = st.integers(0, 1)  # a tiny vocabulary: prefixes are shared all the time


class TierMachine(RuleBasedStateMachine):
    cpu_blocks = 4
    disk_blocks = 3
    eviction = "lru"

    def __init__(self) -> None:
        super().__init__()
        self.m = KVCacheManager(NUM_BLOCKS, BS, hash_algo="xxhash_cbor",
                                cpu_blocks=self.cpu_blocks, disk_blocks=self.disk_blocks,
                                eviction=self.eviction)
        self.cls: dict[bytes, bool | None] = {}  # the device's last class of each hash
        self.plane = FakePlane(self.m)
        self.waiting: list[KVRequest] = []
        self.running: list[KVRequest] = []
        self.n = 0
        self.held = {"gpu": set(), "cpu": set(), "disk": set()}
        self.seq = 0
        self.past: list[tuple[list[int], str | None]] = []

    def pick(self, data, items):
        return data.draw(st.sampled_from(items))

    def pick_some(self, data, items) -> set:
        return set(data.draw(st.lists(st.sampled_from(items))))

    # --- rules ------------------------------------------------------------------------

    @rule(prompt=st.lists(TOKENS, min_size=1, max_size=MAX_LEN - 2),
          salt=st.sampled_from([None, "s"]))
    def arrive(self, prompt, salt):
        self.waiting.append(KVRequest(f"r{self.n}", prompt, salt=salt,
                                      num_prompt_tokens=len(prompt)))
        self.past.append((prompt, salt))
        self.n += 1

    @precondition(lambda self: self.past)
    @rule(data=st.data(), more=st.lists(TOKENS, max_size=3))
    def arrive_again(self, data, more):
        """A returning conversation: an earlier prompt, maybe extended."""
        prompt, salt = self.pick(data, self.past)
        prompt = (prompt + more)[:MAX_LEN - 2]
        self.waiting.append(KVRequest(f"r{self.n}", prompt, salt=salt,
                                      num_prompt_tokens=len(prompt)))
        self.n += 1

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), chunk=st.integers(1, MAX_LEN),
          onboard=st.sampled_from([True, True, False]))
    def admit(self, data, chunk, onboard):
        req = self.pick(data, self.waiting)
        if self.m.onboarding(req):
            return
        hits, n = self.m.get_computed_blocks(req)
        if onboard and self.m.start_onboard(req, hits):
            assert self.m.onboarding(req)
            self.plane.run()
            return
        num_new = min(chunk, req.num_tokens - n)
        first = req.num_preemptions == 0
        new = self.m.allocate_slots(req, num_new, hits, n)
        self.plane.run()  # offloads read the evicted blocks before the forward writes
        if new is None:
            self.m.release_holds(keep=req)
            return
        self.plane.check_hits(req, hits)
        if first:
            by_tier = self.m.cached_tokens_by_tier(req)
            assert sum(by_tier.values()) == n and min(by_tier.values()) >= 0
        req.num_computed_tokens = n + num_new
        self.plane.write(req)
        self.waiting.remove(req)
        self.running.append(req)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), token=TOKENS, chunk=st.integers(1, MAX_LEN))
    def step(self, data, token, chunk):
        req = self.pick(data, self.running)
        if req.num_computed_tokens == req.num_tokens:
            if req.num_tokens >= MAX_LEN:
                return
            req.token_ids.append(token)
        num_new = min(chunk, req.num_tokens - req.num_computed_tokens)
        new = self.m.allocate_slots(req, num_new)
        self.plane.run()
        if new is not None:
            req.num_computed_tokens += num_new
            self.plane.write(req)

    @rule(num_blocks=st.integers(1, NUM_BLOCKS))
    def churn(self, num_blocks):
        """Pressure: blocks taken from the free queue's head (evicting, so offloading) and
        given back unused, at the tail so the next churn reaches further."""
        num_blocks = min(num_blocks, self.m.num_free_blocks)
        if num_blocks:
            pool = self.m.pool
            blocks = pool.get_new_blocks(num_blocks)
            self.plane.run()
            pool.free_blocks(blocks)
            for block in blocks:
                pool.free_queue.remove(block)
                pool.free_queue.append(block)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data):
        req = self.pick(data, self.running)
        self.running.remove(req)
        self.m.free(req)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def preempt(self, data):
        req = self.pick(data, self.running)
        self.running.remove(req)
        self.m.preempt(req)
        self.waiting.append(req)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def abort_waiting(self, data):
        """A waiting request goes away, maybe in the middle of its copy."""
        req = self.pick(data, self.waiting)
        self.waiting.remove(req)
        self.m.free(req)

    @precondition(lambda self: any(h.in_flight for h in self.m._onboards.holds.values()))
    @rule(data=st.data(), ok=st.booleans())
    def copy_done(self, data, ok):
        holds = [h for h in self.m._onboards.holds.values() if h.in_flight]
        hold = self.pick(data, holds)
        sources = [(tier.name, entry.block_hash) for tier, entry in hold.reads]
        failed = set() if ok else self.pick_some(data, sources)
        want = {entry.block_hash: entry.decoded for _, entry in hold.reads}
        dests = hold.blocks[hold.num_hits:]
        self.plane.finish(hold.request_id, ok, failed)
        self.plane.run()  # Drop orders of failed disk entries
        for block in dests:  # cached now (the copy landed): the entry's class, carried
            if block.block_hash in want:
                assert block.decoded == want[block.block_hash], "class lost on onboard"

    @rule(kind=st.sampled_from(["offload", "write"]))
    def fail(self, kind):
        """The next offload batch or disk write fails (the plane reports it lost)."""
        self.plane.fail(kind)

    @rule()
    def release_holds(self):
        self.m.release_holds()

    @rule(dice=st.integers(0, 9))
    def reset(self, dice):
        if dice == 0 and self.m.reset_prefix_cache():  # rare: it wipes every tier
            self.plane.run()
            assert not self.plane.disk  # every file deleted

    # --- invariants -------------------------------------------------------------------

    def truth(self) -> dict[str, set[bytes]]:
        lower = self.m.offloader
        return {"gpu": set(self.m.pool.cached),
                "cpu": {e.block_hash for e in lower.cpu},
                "disk": set() if lower.disk is None else {e.block_hash for e in lower.disk}}

    @invariant()
    def events_replay_to_every_tier(self):
        events = self.m.take_events()
        truth = self.truth()
        for k, event in enumerate(events):
            self.seq += 1
            assert event.seq == self.seq
            if isinstance(event, PoolStored):
                assert len(event.token_ids) == BS * len(event.block_hashes)
                self.held[event.tier].update(event.block_hashes)
            elif isinstance(event, PoolRemoved):
                held = self.held[event.tier]
                assert held.issuperset(event.block_hashes)
                held.difference_update(event.block_hashes)
                for h in event.block_hashes:
                    if any(h in s for s in self.held.values()) or not any(
                            h in s for s in truth.values()):
                        continue
                    # Held at the end, held nowhere now: only if it was gone for real and
                    # computed again (so stored on the device) later in this batch.
                    assert any(isinstance(e, PoolStored) and e.tier == "gpu"
                               and h in e.block_hashes
                               for e in events[k + 1:]), "a moved block was held nowhere"
            else:
                assert isinstance(event, PoolCleared)
                for s in self.held.values():
                    s.clear()
        assert self.held == truth
        snap = self.m.cached_block_hashes()
        assert snap.seq == self.seq
        by_tier = {t: set(h) for t, (h, _) in snap.by_tier().items()}
        assert {t: s for t, s in by_tier.items() if s} == {t: s for t, s in truth.items() if s}
        assert len(snap.block_hashes) == sum(map(len, truth.values()))

    @invariant()
    def the_data_is_what_the_books_say(self):
        self.plane.run()
        self.plane.check()

    @invariant()
    def references_and_readers(self):
        pool = self.m.pool
        pool.free_queue.check()
        want = Counter()
        for req in self.running + self.waiting:
            want.update(b.block_id for b in self.m._blocks.get(req.request_id, ()))
        readers = Counter()
        for hold in self.m._onboards.holds.values():
            want.update(b.block_id for b in hold.blocks)
            if hold.in_flight:
                readers.update(id(entry) for _, entry in hold.reads)
        assert [b.ref_cnt for b in pool.blocks] == [want[i] for i in range(NUM_BLOCKS)]
        for b in pool.blocks:
            assert b.is_free == (b.ref_cnt == 0)
        for tier in self.m.offloader.tiers:
            entries = list(tier)
            for e in entries:
                assert e.readers == readers[id(e)] and not e.dropped
            busy = [e.slot for e in entries]
            free = tier._free_slots
            assert len(set(busy + free)) == len(busy) + len(free)  # no slot twice
            assert len(busy) + len(free) + tier._num_dropped_read == tier.num_slots

    @invariant()
    def classes_survive_the_tiers(self):
        pool = self.m.pool
        for h, holders in pool.cached.items():
            flags = {b.decoded for b in holders.values()}
            self.cls[h] = flags.pop() if len(flags) == 1 else None  # None: duplicates differ
        for tier in self.m.offloader.tiers:
            for entry in tier:
                want = self.cls.get(entry.block_hash)
                if entry.block_hash not in pool.cached and want is not None:
                    assert entry.decoded == want, f"{tier.name} entry lost its class"

    @invariant()
    def tier_stats_match(self):
        stats = self.m.tier_stats()
        truth = self.truth()
        assert stats["gpu"].cached_blocks == self.m.pool.num_cached_blocks
        for name in ("cpu", "disk")[:len(self.m.offloader.tiers)]:
            assert stats[name].cached_blocks == len(truth[name])
        assert sum(s.hit_tokens for s in stats.values()) == self.m.stats.hits
        assert stats["gpu"].evictions >= 0


class CpuOnlyMachine(TierMachine):
    cpu_blocks = 3
    disk_blocks = 0


class LayeredTierMachine(TierMachine):
    eviction = "layered"


for machine in (TierMachine, CpuOnlyMachine, LayeredTierMachine):
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=100,
                                         deadline=None)
TestTierStateMachine = TierMachine.TestCase
TestCpuOnlyStateMachine = CpuOnlyMachine.TestCase
TestLayeredTierStateMachine = LayeredTierMachine.TestCase


class RandomDriver(TierMachine):
    """The same rules and checks, driven by a seeded RNG for long runs: hypothesis explores
    short sequences well, long ones (a chain evicted twice, copies overlapping) less so."""

    def __init__(self, seed: int, cpu_blocks: int, disk_blocks: int,
                 eviction: str = "lru") -> None:
        self.cpu_blocks, self.disk_blocks, self.eviction = cpu_blocks, disk_blocks, eviction
        super().__init__()
        self.rng = random.Random(seed)

    def pick(self, data, items):
        return self.rng.choice(items)

    def pick_some(self, data, items) -> set:
        return {x for x in items if self.rng.random() < 0.5}

    def tokens(self, n):
        return [self.rng.randint(0, 1) for _ in range(n)]

    def one_step(self) -> None:
        rng = self.rng
        ops = [("arrive", 3), ("again", 4), ("admit", 8), ("churn", 3), ("step", 4),
               ("finish", 3), ("preempt", 1), ("abort", 1), ("copy", 5), ("release", 1),
               ("reset", 0.05), ("fail", 0.3)]
        op = rng.choices([o for o, _ in ops], [w for _, w in ops])[0]
        if op == "arrive":
            self.arrive(self.tokens(rng.randint(1, MAX_LEN - 2)), rng.choice([None, "s"]))
        elif op == "again" and self.past:
            self.arrive_again(None, self.tokens(rng.randint(0, 3)))
        elif op == "admit" and self.waiting:
            self.admit(None, rng.randint(1, MAX_LEN), rng.random() < 0.8)
        elif op == "churn":
            self.churn(rng.randint(1, NUM_BLOCKS))
        elif op == "step" and self.running:
            self.step(None, rng.randint(0, 1), rng.randint(1, MAX_LEN))
        elif op == "finish" and self.running:
            self.finish(None)
        elif op == "preempt" and self.running:
            self.preempt(None)
        elif op == "abort" and self.waiting:
            self.abort_waiting(None)
        elif op == "copy" and any(h.in_flight for h in self.m._onboards.holds.values()):
            self.copy_done(None, rng.random() < 0.7)
        elif op == "release":
            self.release_holds()
        elif op == "reset":
            self.reset(0)
        elif op == "fail":
            self.fail(rng.choice(["offload", "write"]))

    def check(self) -> None:
        self.events_replay_to_every_tier()
        self.the_data_is_what_the_books_say()
        self.references_and_readers()
        self.classes_survive_the_tiers()
        self.tier_stats_match()


@pytest.mark.parametrize("seed", range(6))
def test_long_random_runs(seed):
    cpu, disk = [(4, 3), (3, 0), (1, 1), (6, 6), (2, 5), (5, 1)][seed]
    d = RandomDriver(seed, cpu, disk, eviction="layered" if seed % 2 else "lru")
    for _ in range(1500):
        d.one_step()
        d.check()
    d.count = Counter(type(o).__name__ for o in d.plane.orders)
    assert d.count["Onboard"] > 20 and d.count["Offload"] > 100
    lost = Counter(x.tier for x in d.plane.lost)
    assert lost["cpu"] > 2  # failed offloads happened, and were checked
    if disk:
        assert d.count["Spill"] > 10 and lost["disk"] > 0


class DeviceUnchangedMachine(KVCacheMachine):
    """The device-only state machine (vLLM's rules, checked block for block against a
    reference model) run on a manager WITH lower tiers: offloading what the pool evicts
    never changes a hit, a block id, the free queue or a device event."""

    def __init__(self) -> None:
        super().__init__()
        self.m = KVCacheManager(SM_BLOCKS, SM_BS, hash_algo=SM_ALGO, cpu_blocks=3,
                                disk_blocks=2)
        self.lower = {"cpu": set(), "disk": set()}

    @invariant()
    def events_replay_to_the_cached_set(self):
        for event in self.m.take_events():
            self.seq += 1
            assert event.seq == self.seq
            if isinstance(event, PoolCleared):
                self.held.clear()
                for s in self.lower.values():
                    s.clear()
                continue
            held = self.held if event.tier == "gpu" else self.lower[event.tier]
            if isinstance(event, PoolStored):
                held.update(event.block_hashes)
            else:
                assert held.issuperset(event.block_hashes)
                held.difference_update(event.block_hashes)
        assert self.held == set(self.m.pool.cached)
        lower = self.m.offloader
        assert self.lower == {t.name: {e.block_hash for e in t} for t in lower.tiers}
        snap = self.m.cached_block_hashes()
        gpu = {h for h, t in zip(snap.block_hashes, snap.tiers, strict=True) if t == "gpu"}
        assert snap.seq == self.seq and gpu == self.held
        self.m.take_transfers()


DeviceUnchangedMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                                    deadline=None)
TestDeviceUnchangedByTiers = DeviceUnchangedMachine.TestCase
