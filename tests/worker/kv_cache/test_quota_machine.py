"""Quotas under random allocate / decode / free / preempt / pin / quota-change sequences.

1. ``QuotaMachine``: requests of several tenants, quotas set and changed at random, LRU or
   layered, pins. Every hand-out is checked against the rules written the slow way (a walk
   of the free queue with recounted owners); after every rule the ledger equals a recount,
   the over-quota set is exactly the tenants over their quota, each tenant's free list is
   its free cached blocks in queue order, no referenced or pinned block was handed out, and
   the events replay to the cached set.
   ``TieredQuotaMachine`` adds CPU and disk tiers (quotas on them too): every lower-tier
   victim is the slow rule's, every tier's ledger a recount.
2. ``EmptyQuotaMachine``: the vLLM-model machine of test_eviction_machine (layered + pins)
   with random tenants and empty quotas set at random: still vLLM's, block for block and
   event for event.
"""
from __future__ import annotations

import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvmesh.events.pool import PoolCleared, PoolRemoved, PoolStored
from kvmesh.quota import Quota, Quotas
from tests.worker.kv_cache.test_eviction_machine import EvictionMachine
from tests.worker.kv_cache.test_state_machine import ALGO, BS, MAX_LEN, NUM_BLOCKS, TOKENS
from worker.kv_cache import KVCacheManager, KVRequest

TENANTS = ("a", "b", "c")
FRACTIONS = st.sampled_from([None, 0.0, 0.1, 0.2, 0.3, 0.5, 1.0])
QUOTAS = st.builds(  # small defaults: several tenants over quota at once are common
    lambda default, own: Quotas(Quota(gpu=default), {t: Quota(gpu=f) for t, f in own.items()
                                                      if f is not None}),
    st.sampled_from([None, 0.0, 0.1, 0.2]),
    st.dictionaries(st.sampled_from(TENANTS), FRACTIONS, max_size=3))


def limit(quotas: Quotas, tenant: str) -> int | None:
    f = quotas.fraction(tenant, "gpu")
    return None if f is None else math.floor(f * NUM_BLOCKS + 1e-9)


def expected_hand_out(pool, quotas: Quotas, tenant: str | None, n: int) -> list[int]:
    """The ids the rules hand out next, by walking the free queue with recounted owners."""
    free = list(pool.free_queue)
    count: dict[str, int] = {}
    for b in pool.blocks:
        if b.block_hash is not None:
            count[b.owner] = count.get(b.owner, 0) + 1
    out = []
    for i in range(n):
        pick = free[0]
        if not quotas.empty and all(b.block_hash is not None for b in free):
            lim = None if tenant is None else limit(quotas, tenant)
            own = [b for b in free if b.owner == tenant]
            over = sorted((-(count[t] - limit(quotas, t)), t) for t in count
                          if limit(quotas, t) is not None and count[t] > limit(quotas, t)
                          and any(b.owner == t for b in free))
            if lim is not None and count.get(tenant, 0) + i >= lim and own:
                pick = own[0]
            elif over:
                pick = next(b for b in free if b.owner == over[0][1])
        free.remove(pick)
        if pick.block_hash is not None:
            count[pick.owner] -= 1
        out.append(pick.block_id)
    return out


class QuotaMachine(RuleBasedStateMachine):
    LAYERED = False

    def __init__(self) -> None:
        super().__init__()
        self.m = KVCacheManager(NUM_BLOCKS, BS, hash_algo=ALGO,
                                eviction="layered" if self.LAYERED else "lru", pin_cap=3,
                                clock=lambda: 0.0)  # pins never expire; ties are stable
        self.quotas = Quotas()
        self.running: list[KVRequest] = []
        self.waiting: list[KVRequest] = []
        self.n = 0
        self.held: set[bytes] = set()
        self.handed_out = 0
        pool = self.m.pool
        real = pool.get_new_blocks

        def checked(num_blocks, tenant=None):
            referenced = {b.block_id for b in pool.blocks if b.ref_cnt > 0}
            want = expected_hand_out(pool, self.quotas, tenant, num_blocks)
            got = real(num_blocks, tenant)
            assert [b.block_id for b in got] == want
            assert not referenced & set(want)  # running and pinned blocks are never taken
            self.handed_out += num_blocks
            return got

        pool.get_new_blocks = checked

    def _admit(self, req: KVRequest, chunk: int) -> bool:
        hits, n = self.m.get_computed_blocks(req)
        num_new = min(chunk, req.num_tokens - n)
        if self.m.allocate_slots(req, num_new, hits, n) is None:
            return False
        req.num_computed_tokens = n + num_new
        return True

    @rule(prompt=st.lists(TOKENS, min_size=1, max_size=MAX_LEN - 4),
          system=st.sampled_from([(), (0, 1, 2, 0)]), salt=st.sampled_from([None, "s"]),
          tenant=st.sampled_from(TENANTS), chunk=st.integers(1, MAX_LEN),
          decode_from=st.integers(0, 4))
    def arrive(self, prompt, system, salt, tenant, chunk, decode_from):
        tokens = list(system) + prompt
        req = KVRequest(f"r{self.n}", tokens, salt=salt, tenant=tenant,
                        num_prompt_tokens=min(len(tokens), decode_from * BS) or None)
        self.n += 1
        (self.running if self._admit(req, chunk) else self.waiting).append(req)

    @rule(prompt=st.lists(TOKENS, min_size=1, max_size=MAX_LEN - 4),
          system=st.sampled_from([(), (0, 1, 2, 0)]), tenant=st.sampled_from(TENANTS))
    def whole(self, prompt, system, tenant):
        """A request admitted, computed and finished at once: cached blocks pile up, so
        later ones evict (unless the running ones leave no room)."""
        req = KVRequest(f"r{self.n}", list(system) + prompt, tenant=tenant)
        self.n += 1
        if self._admit(req, MAX_LEN):
            self.m.free(req)

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
        req = data.draw(st.sampled_from(self.running))
        if req.num_computed_tokens == req.num_tokens:
            if req.num_tokens >= MAX_LEN:
                return
            req.token_ids.append(token)
        num_new = min(chunk, req.num_tokens - req.num_computed_tokens)
        if self.m.allocate_slots(req, num_new) is not None:
            req.num_computed_tokens += num_new

    @precondition(lambda self: self.running)
    @rule(data=st.data(), preempt=st.booleans())
    def finish(self, data, preempt):
        req = data.draw(st.sampled_from(self.running))
        self.running.remove(req)
        if preempt:
            self.m.preempt(req)
            self.waiting.append(req)
        else:
            self.m.free(req)

    @rule(quotas=QUOTAS)
    def set_quotas(self, quotas):
        self.quotas = quotas
        self.m.set_quotas(quotas)

    @precondition(lambda self: self.m.pool.cached)
    @rule(data=st.data())
    def pin_or_unpin(self, data):
        block = data.draw(st.sampled_from([b for b in self.m.pool.blocks if b.block_hash]))
        chain = [block.block_hash]
        while block.parent_hash is not None:  # walk up to block 0 through held parents
            block = next(iter(self.m.pool.cached.get(block.parent_hash, {}).values()), None)
            if block is None:
                return
            chain.insert(0, block.block_hash)
        if data.draw(st.booleans()):
            self.m.pin(chain, ttl_s=600)
        else:
            self.m.unpin(chain[-1:])

    @rule()
    def reset(self):
        self.m.reset_prefix_cache()

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def ledger_equals_a_recount(self):
        pool = self.m.pool
        count: dict[str, int] = {}
        for b in pool.blocks:
            if b.block_hash is not None:
                count[b.owner] = count.get(b.owner, 0) + 1
        ledger = pool.ledger
        assert {t: n for t, n in ledger.blocks.items() if n} == count
        over = {t for t, n in count.items()
                if limit(self.quotas, t) is not None and n > limit(self.quotas, t)}
        assert set(ledger.over) == over
        stats = self.m.tenant_stats()
        assert {t: s.tiers["gpu"].blocks for t, s in stats.items() if s.tiers["gpu"].blocks} \
            == count

    @invariant()
    def free_lists_are_in_step_with_the_free_queue(self):
        pool = self.m.pool
        pool.free_queue.check()
        quota = pool.quota
        assert (quota is None) == self.quotas.empty
        if quota is None:
            assert all(b.prev_owned is None and b.next_owned is None for b in pool.blocks)
            return
        free = [b for b in pool.free_queue if b.block_hash is not None]
        for tenant in TENANTS:
            assert list(quota.listed(tenant)) == [b for b in free if b.owner == tenant]
        for pin in self.m.pins._pins.values():
            assert pin.block.block_hash is not None and pin.block.ref_cnt >= 1

    @invariant()
    def events_replay_to_the_cached_set(self):
        for event in self.m.take_events():
            if isinstance(event, PoolStored | PoolRemoved) and event.tier != "gpu":
                continue  # the lower tiers' (TieredQuotaMachine): the device set is checked
            if isinstance(event, PoolStored):
                self.held.update(event.block_hashes)
            elif isinstance(event, PoolRemoved):
                assert self.held.issuperset(event.block_hashes)
                self.held.difference_update(event.block_hashes)
            else:
                assert isinstance(event, PoolCleared)
                self.held.clear()
        assert self.held == set(self.m.pool.cached)


class LayeredQuotaMachine(QuotaMachine):
    LAYERED = True


def expected_victim(tier, quotas: Quotas, tenant: str | None):
    """``LowerTier.victim`` the slow way: over the tier's LRU order with recounted owners."""
    unread = [e for e in tier if e.readers == 0]
    if not unread:
        return None
    if quotas.empty:
        return unread[0]
    count: dict[str, int] = {}
    for e in tier:
        count[e.owner] = count.get(e.owner, 0) + 1

    def lim(t):
        f = quotas.fraction(t, tier.name)
        return None if f is None else math.floor(f * tier.num_slots + 1e-9)

    own = [e for e in unread if e.owner == tenant]
    if tenant is not None and lim(tenant) is not None and count.get(tenant, 0) >= lim(tenant) \
            and own:
        return own[0]
    over = sorted((-(n - lim(t)), t) for t, n in count.items()
                  if lim(t) is not None and n > lim(t) and any(e.owner == t for e in unread))
    return next(e for e in unread if e.owner == over[0][1]) if over else unread[0]


class TieredQuotaMachine(QuotaMachine):
    """CPU and disk tiers below the pool, with quotas on them too: evictions offload, and
    every lower-tier victim is the slow rule's; each tier's ledger equals a recount."""

    def __init__(self) -> None:
        super().__init__()
        self.m = KVCacheManager(NUM_BLOCKS, BS, hash_algo=ALGO, cpu_blocks=4, disk_blocks=3,
                                pin_cap=3, clock=lambda: 0.0)
        pool = self.m.pool
        real = pool.get_new_blocks

        def checked(num_blocks, tenant=None):
            want = expected_hand_out(pool, self.quotas, tenant, num_blocks)
            got = real(num_blocks, tenant)
            assert [b.block_id for b in got] == want
            return got

        pool.get_new_blocks = checked
        for tier in self.m.offloader.tiers:
            self._check_victims(tier)

    def _check_victims(self, tier):
        real = tier.victim

        def checked(tenant=None):
            want = expected_victim(tier, self.quotas, tenant)
            got = real(tenant)
            assert got is want
            return got

        tier.victim = checked

    @rule(quotas=st.builds(
        lambda gpu, cpu, disk, own: Quotas(Quota(gpu, cpu, disk), own),
        st.sampled_from([None, 0.1, 0.3]), st.sampled_from([None, 0.0, 0.25, 0.5]),
        st.sampled_from([None, 0.0, 0.34]),
        st.dictionaries(st.sampled_from(TENANTS),
                        st.builds(Quota, cpu=st.sampled_from([None, 0.0, 0.5, 1.0]),
                                  disk=st.sampled_from([None, 0.0, 1.0])), max_size=2)))
    def set_tier_quotas(self, quotas):
        self.quotas = quotas
        self.m.set_quotas(quotas)

    @invariant()
    def lower_ledgers_equal_a_recount(self):
        for tier in self.m.offloader.tiers:
            count: dict[str, int] = {}
            for e in tier:
                count[e.owner] = count.get(e.owner, 0) + 1
            assert {t: n for t, n in tier.ledger.blocks.items() if n} == count
            stats = self.m.tenant_stats()
            assert {t: s.tiers[tier.name].blocks for t, s in stats.items()
                    if s.tiers[tier.name].blocks} == count


class EmptyQuotaMachine(EvictionMachine):
    """The layered + pins machine against its vLLM model, with tenants and empty quotas."""

    @rule(system=st.sampled_from([(), (0, 1, 2, 0), (2, 2)]),
          prompt=st.lists(TOKENS, min_size=1, max_size=MAX_LEN - 8),
          salt=st.sampled_from([None, "s"]), chunk=st.integers(1, MAX_LEN),
          all_prompt=st.booleans(), tenant=st.sampled_from(TENANTS))
    def arrive(self, system, prompt, salt, chunk, all_prompt, tenant):
        prompt = list(system) + prompt
        rid = f"r{self.n}"
        n_prompt = None if all_prompt else len(prompt)
        req = KVRequest(rid, prompt, salt=salt, num_prompt_tokens=n_prompt, tenant=tenant)
        self.model.prompt[rid] = n_prompt
        self.n += 1
        (self.running if self._admit(req, chunk) else self.waiting).append(req)

    @rule(quotas=st.sampled_from([Quotas(), Quotas(Quota(), {"a": Quota()})]))
    def set_empty_quotas(self, quotas):
        self.m.set_quotas(quotas)
        assert self.m.pool.quota is None


SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None)
QuotaMachine.TestCase.settings = SETTINGS
LayeredQuotaMachine.TestCase.settings = SETTINGS
EmptyQuotaMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40,
                                               deadline=None)
TestQuotaMachine = QuotaMachine.TestCase
TestLayeredQuotaMachine = LayeredQuotaMachine.TestCase
TieredQuotaMachine.TestCase.settings = SETTINGS
TestTieredQuotaMachine = TieredQuotaMachine.TestCase
TestEmptyQuotasAreVllm = EmptyQuotaMachine.TestCase
