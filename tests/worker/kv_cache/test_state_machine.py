"""Random allocate / decode / free / preempt / reset sequences against a reference model.

The model is the rules written the slow, obvious way: a plain list for the free queue, and
cached blocks keyed by their real content (salt + every token of the prefix) instead of
hashes. The manager must agree with it on every hit, every allocated block id, the free
queue order, ref counts and evictions, and keep its own structures consistent.
"""
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvmesh.events.pool import PoolCleared, PoolRemoved, PoolStored
from kvmesh.hashing import block_hashes
from worker.kv_cache import KVCacheManager, KVRequest

BS = 2
NUM_BLOCKS = 10
ALGO = "xxhash_cbor"
MAX_LEN = 16
TOKENS = st.integers(0, 2)  # a tiny vocabulary: prefixes are shared all the time


class Model:
    """The block-manager rules over plain lists and content keys."""

    def __init__(self) -> None:
        self.free = list(range(NUM_BLOCKS))
        self.ref = [0] * NUM_BLOCKS
        self.key: list[tuple | None] = [None] * NUM_BLOCKS
        self.cached: dict[tuple, list[int]] = {}
        self.tables: dict[str, list[int]] = {}
        self.ncached: dict[str, int] = {}
        self.evictions = 0

    def lookup(self, tokens, salt) -> list[int]:
        hits = []
        for i in range((len(tokens) - 1) // BS):
            holders = self.cached.get((salt, tuple(tokens[:(i + 1) * BS])))
            if not holders:
                break
            hits.append(holders[0])
        return hits

    def allocate(self, rid, tokens, salt, computed, num_new, hits):
        table = self.tables.get(rid)
        held = len(table) if table is not None else 0
        new_n = max(0, -(-(computed + num_new) // BS) - held - len(hits))
        if new_n + sum(self.ref[b] == 0 for b in hits) > len(self.free):
            return None
        if table is None:
            table = self.tables[rid] = []
            self.ncached[rid] = len(hits)
        for b in hits:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        new, self.free = self.free[:new_n], self.free[new_n:]
        for b in new:
            if self.key[b] is not None:
                self.cached[self.key[b]].remove(b)
                if not self.cached[self.key[b]]:
                    del self.cached[self.key[b]]
                self.key[b] = None
                self.evictions += 1
            self.ref[b] = 1
        table += hits + new
        n_full = min(computed + num_new, len(tokens)) // BS
        for i in range(self.ncached[rid], n_full):
            k = (salt, tuple(tokens[:(i + 1) * BS]))
            self.key[table[i]] = k
            self.cached.setdefault(k, []).append(table[i])
        self.ncached[rid] = max(self.ncached[rid], n_full)
        return new

    def release(self, rid) -> None:
        unhashed = []
        for b in reversed(self.tables.pop(rid, [])):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (unhashed if self.key[b] is None else self.free).append(b)
        self.free = unhashed + self.free
        self.ncached.pop(rid, None)

    def reset(self) -> bool:
        if any(self.ref):
            return False
        self.key = [None] * NUM_BLOCKS
        self.cached = {}
        return True


def ids(blocks):
    return None if blocks is None else [b.block_id for b in blocks]


class KVCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.m = KVCacheManager(NUM_BLOCKS, BS, hash_algo=ALGO)
        self.model = Model()
        self.waiting: list[KVRequest] = []
        self.running: list[KVRequest] = []
        self.n = 0
        self.held: set[bytes] = set()  # the hash set a service builds from the events
        self.seq = 0
        self.counts = [0] * 6
        self.hash_of: dict[tuple, bytes] = {}

    def _admit(self, req: KVRequest, chunk: int) -> bool:
        hits, n = self.m.get_computed_blocks(req)
        assert ids(hits) == self.model.lookup(req.token_ids, req.salt)
        assert n == len(hits) * BS < req.num_tokens
        num_new = min(chunk, req.num_tokens - n)
        new = self.m.allocate_slots(req, num_new, hits, n)
        expected = self.model.allocate(req.request_id, req.token_ids, req.salt, n, num_new,
                                       ids(hits))
        assert ids(new) == expected
        if new is None:
            return False
        base = 3 if req.num_preemptions else 0
        self.counts[base:base + 3] = [self.counts[base] + 1,
                                      self.counts[base + 1] + req.num_tokens,
                                      self.counts[base + 2] + n]
        req.num_computed_tokens = n + num_new
        return True

    @rule(prompt=st.lists(TOKENS, min_size=1, max_size=MAX_LEN - 4),
          salt=st.sampled_from([None, "s"]), chunk=st.integers(1, MAX_LEN))
    def arrive(self, prompt, salt, chunk):
        req = KVRequest(f"r{self.n}", prompt, salt=salt)
        self.n += 1
        (self.running if self._admit(req, chunk) else self.waiting).append(req)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), chunk=st.integers(1, MAX_LEN))
    def retry_waiting(self, data, chunk):
        req = data.draw(st.sampled_from(self.waiting))
        if self._admit(req, chunk):
            self.waiting.remove(req)
            self.running.append(req)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), token=TOKENS, chunk=st.integers(1, MAX_LEN))
    def step(self, data, token, chunk):
        """Continue a chunked prefill, or decode one token (appended first)."""
        req = data.draw(st.sampled_from(self.running))
        if req.num_computed_tokens == req.num_tokens:
            if req.num_tokens >= MAX_LEN:
                return
            req.token_ids.append(token)
        num_new = min(chunk, req.num_tokens - req.num_computed_tokens)
        new = self.m.allocate_slots(req, num_new)
        assert ids(new) == self.model.allocate(req.request_id, req.token_ids, req.salt,
                                               req.num_computed_tokens, num_new, [])
        if new is not None:
            req.num_computed_tokens += num_new

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data):
        req = data.draw(st.sampled_from(self.running))
        self.running.remove(req)
        self.m.free(req)
        self.model.release(req.request_id)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def preempt(self, data):
        req = data.draw(st.sampled_from(self.running))
        self.running.remove(req)
        self.m.preempt(req)
        self.model.release(req.request_id)
        assert req.num_computed_tokens == 0 and self.m.get_block_ids(req) == []
        self.waiting.append(req)

    @rule()
    def reset(self):
        assert self.m.reset_prefix_cache() == self.model.reset()

    # --- invariants -------------------------------------------------------------------

    def _hash(self, key) -> bytes:
        if key not in self.hash_of:
            salt, prefix = key
            self.hash_of[key] = block_hashes(list(prefix), BS, algo=ALGO, salt=salt)[-1]
        return self.hash_of[key]

    @invariant()
    def blocks_and_free_queue_match_the_model(self):
        pool = self.m.pool
        pool.free_queue.check()
        assert [b.block_id for b in pool.free_queue] == self.model.free
        assert [b.ref_cnt for b in pool.blocks] == self.model.ref
        for b in pool.blocks:
            assert b.ref_cnt >= 0
            assert b.is_free == (b.ref_cnt == 0)  # never both free and referenced
        for req in self.running + self.waiting:
            table = self.m.get_block_ids(req)
            assert table == self.model.tables.get(req.request_id, [])
            assert len(table) * BS >= req.num_computed_tokens

    @invariant()
    def cached_map_matches_block_hashes(self):
        pool = self.m.pool
        for b, key in zip(pool.blocks, self.model.key, strict=True):
            if key is None:
                assert b.block_hash is None and b.content is None
            else:
                assert b.block_hash == self._hash(key)
                assert b.token_ids == key[1][-BS:]
                assert b.block_id in pool.cached[b.block_hash]
        for h, holders in pool.cached.items():
            assert holders
            for block_id, block in holders.items():
                assert block.block_id == block_id and block.block_hash == h
        assert sum(map(len, pool.cached.values())) == pool.num_cached_blocks
        assert {self._hash(k): v for k, v in self.model.cached.items()} == {
            h: list(d) for h, d in pool.cached.items()}

    @invariant()
    def events_replay_to_the_cached_set(self):
        for event in self.m.take_events():
            self.seq += 1
            assert event.seq == self.seq
            if isinstance(event, PoolStored):
                assert event.tier == "gpu"
                assert len(event.token_ids) == BS * len(event.block_hashes)
                self.held.update(event.block_hashes)
            elif isinstance(event, PoolRemoved):
                assert self.held.issuperset(event.block_hashes)
                self.held.difference_update(event.block_hashes)
            else:
                assert isinstance(event, PoolCleared)
                self.held.clear()
        assert self.held == set(self.m.pool.cached)
        snap = self.m.cached_block_hashes()
        assert snap.seq == self.seq and set(snap.block_hashes) == self.held

    @invariant()
    def stats_match(self):
        s = self.m.stats
        assert [s.requests, s.queries, s.hits, s.preempted_requests, s.preempted_queries,
                s.preempted_hits] == self.counts
        assert s.evictions == self.model.evictions
        assert s.blocks_free == len(self.model.free) == self.m.num_free_blocks
        assert s.blocks_used == NUM_BLOCKS - s.blocks_free


KVCacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                            deadline=None)
TestKVCacheStateMachine = KVCacheMachine.TestCase
