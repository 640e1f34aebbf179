"""Pins on the KV manager: chains from block 0, cap, TTL (a manual clock), refresh by use,
unpin, automatic pins, reset, preemption, failed steps, warm-up pins."""
import pickle

import pytest

from kvmesh.events.pool import PoolRemoved
from worker.kv_cache import KVCacheManager, KVRequest, Pinned

BS = 2
ALGO = "xxhash_cbor"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def manager(num_blocks=30, **kw):  # pin cap: 3 blocks
    clock = Clock()
    return KVCacheManager(num_blocks, BS, hash_algo=ALGO, clock=clock, **kw), clock


_n = iter(range(10**6))


def run(m, tokens, *, free=True, salt=None):
    """Admit a request for ``tokens`` (all of it in one chunk); free it unless told not."""
    req = KVRequest(f"r{next(_n)}", list(tokens), salt=salt, num_prompt_tokens=len(tokens))
    hits, n = m.get_computed_blocks(req)
    assert m.allocate_slots(req, req.num_tokens - n, hits, n) is not None
    req.num_computed_tokens = req.num_tokens
    if free:
        m.free(req)
    return req, n


def hashes(m, tokens, salt=None):
    req = KVRequest("h", list(tokens), salt=salt)
    m._update_hashes(req)
    return req.block_hashes


def flood(m, n_blocks, base=100):
    """Allocate and free ``n_blocks`` fresh blocks: evicts every free cached block."""
    req = KVRequest(f"f{next(_n)}", list(range(base, base + n_blocks * BS)))
    assert m.allocate_slots(req, req.num_tokens) is not None
    m.free(req)


SYS = [1, 2, 3, 4, 5, 6]  # three full blocks


def test_pinned_blocks_survive_pressure_and_unpinned_ones_do_not():
    m, _ = manager()
    run(m, SYS + [9])
    assert m.pin(hashes(m, SYS), ttl_s=60) == 3 and m.num_pinned_blocks == 3
    pinned = [b for b in m.pool.blocks if b.ref_cnt == 1]
    assert len(pinned) == 3 and not any(b.is_free for b in pinned)
    flood(m, m.num_free_blocks)  # every free block handed out: all the rest evicted
    assert run(m, SYS + [9])[1] == 6
    m.unpin(hashes(m, SYS)[:1])
    flood(m, m.num_free_blocks)
    assert run(m, SYS + [9])[1] == 0


def test_pin_takes_the_chain_from_block_0_as_far_as_it_is_cached():
    m, _ = manager()
    run(m, SYS + [9])
    h = hashes(m, SYS + [7, 8])
    assert m.pin(h[1:], ttl_s=60) == 0  # not from block 0
    assert m.pin(h, ttl_s=60) == 3      # block 3 ([7, 8]) is not cached: stops there
    assert m.pin(hashes(m, [5, 6]), ttl_s=60) == 0  # another chain's block 0: not held
    assert m.pin(hashes(m, SYS, salt="s"), ttl_s=60) == 0  # a salt is another chain
    assert m.num_pinned_blocks == 3


def test_cap_defaults_to_a_tenth_of_the_pool_and_bounds_all_pins():
    m, _ = manager(num_blocks=20)
    assert m.pins.cap == 2
    run(m, SYS + [9])
    run(m, [7, 7, 7, 7, 7])
    assert m.pin(hashes(m, SYS), ttl_s=60) == 2
    assert m.pin(hashes(m, [7, 7, 7, 7]), ttl_s=60) == 0
    assert m.num_pinned_blocks == 2
    m2, _ = manager(num_blocks=20, pin_cap=0)
    run(m2, SYS + [9])
    assert m2.pin(hashes(m2, SYS), ttl_s=60) == 0


def test_ttl_expires_at_the_tick_and_the_blocks_stay_cached():
    m, clock = manager()
    run(m, SYS + [9])
    m.take_events()
    m.pin(hashes(m, SYS), ttl_s=10)
    clock.now = 9.9
    assert m.expire_pins() == 0 and m.num_pinned_blocks == 3
    clock.now = 10
    with m.step():  # every engine step starts with the pins' tick
        pass
    assert m.num_pinned_blocks == 0
    assert all(b.ref_cnt == 0 for b in m.pool.blocks)
    assert m.take_events() == []  # pinning and unpinning change no cached hash
    assert run(m, SYS + [9])[1] == 6


def test_a_hit_refreshes_the_pin_of_the_hit_prefix_only():
    m, clock = manager()
    run(m, SYS + [9])
    m.pin(hashes(m, SYS), ttl_s=10)
    clock.now = 8
    run(m, SYS[:4] + [0])  # hits blocks 0 and 1
    clock.now = 12
    assert m.expire_pins() == 1  # block 2 expired at 10; 0 and 1 live until 18
    assert m.num_pinned_blocks == 2
    assert m.expire_pins(now=18) == 2


def test_unpin_releases_descendants_too_and_counts_them():
    m, _ = manager()
    run(m, SYS + [9])
    h = hashes(m, SYS)
    m.pin(h, ttl_s=60)
    assert m.unpin(h[1:2]) == 2  # block 1 and its child block 2
    assert m.num_pinned_blocks == 1 and m.pins.get(h[0]) is not None
    assert m.unpin(h[1:]) == 0
    assert m.unpin(h) == 1
    # Released deepest first: block 2 at the tail's side of block 1, block 0 last.
    order = [b.block_hash for b in m.pool.free_queue if b.block_hash in h]
    assert order == [h[2], h[1], h[0]]


def test_a_longer_pin_refreshes_the_parents_too():
    m, _ = manager()
    run(m, SYS + [9])
    h = hashes(m, SYS)
    m.pin(h[:1], ttl_s=5)
    assert m.pin(h, ttl_s=50) == 3  # block 0 now lives as long as its children
    assert m.expire_pins(now=10) == 0 and m.num_pinned_blocks == 3
    assert m.expire_pins(now=50) == 3


def test_automatic_pin_after_k_hits_in_the_window_and_released_when_cold():
    m, clock = manager(num_blocks=20, auto_pin=True)
    run(m, SYS + [9])  # computes the prefix: not a hit
    for i in range(7):
        clock.now += 1
        run(m, SYS + [10 + i])
    m.expire_pins()
    assert m.num_pinned_blocks == 0  # 7 hits
    run(m, SYS + [20])
    assert m.num_pinned_blocks == 0  # hot now, pinned at the next tick (between steps)
    m.expire_pins()
    assert m.num_pinned_blocks == 2  # the cap (10% of 20) bounds it
    assert all(p.auto for p in m.pins._pins.values())
    flood(m, m.num_free_blocks)
    assert run(m, SYS + [9])[1] == 6 - 2  # block 2 was evicted, 0 and 1 pinned
    clock.now += 59
    assert m.expire_pins() == 0  # used at the last run: warm
    clock.now += 61
    assert m.expire_pins() == 2 and m.num_pinned_blocks == 0  # cold


def test_hits_spread_wider_than_the_window_do_not_pin():
    m, clock = manager(auto_pin=True)
    run(m, SYS + [9])
    for i in range(20):
        clock.now += 10  # 8 hits span 70 s > the 60 s window
        run(m, SYS + [10 + i])
        m.expire_pins()
    assert m.num_pinned_blocks == 0


def test_preempted_readmissions_do_not_count_as_hits():
    m, _ = manager(auto_pin=True)
    run(m, SYS + [9])
    req = KVRequest("p", SYS + [9, 9], num_prompt_tokens=7)
    for _ in range(10):
        hits, n = m.get_computed_blocks(req)
        m.allocate_slots(req, req.num_tokens - n, hits, n)
        m.preempt(req)
    m.expire_pins()
    assert m.num_pinned_blocks == 0  # one request, counted once


def test_reset_drops_pins_unless_a_request_holds_blocks():
    m, _ = manager()
    run(m, SYS + [9])
    m.pin(hashes(m, SYS), ttl_s=60)
    held, _ = run(m, SYS + [1], free=False)
    assert not m.reset_prefix_cache()
    assert m.num_pinned_blocks == 3  # refused: nothing changed
    m.free(held)
    assert m.reset_prefix_cache()
    assert m.num_pinned_blocks == 0 and m.num_free_blocks == m.num_blocks
    assert not m.pool.cached


def test_pins_yield_to_a_request_that_could_never_fit_beside_them():
    m, _ = manager(num_blocks=10, pin_cap=3)
    run(m, SYS + [9])
    m.pin(hashes(m, SYS), ttl_s=60)
    # Needs 8 blocks beside 3 pinned ones in a pool of 10: 1 pin must go (the deepest).
    big = KVRequest("big", list(range(100, 116)), num_prompt_tokens=16)
    assert m.allocate_slots(big, 16) is not None
    assert m.num_pinned_blocks == 2
    m.free(big)
    # Short only because another request runs: pins stay, the caller preempts or waits.
    other, _ = run(m, list(range(50, 60)), free=False)  # 5 blocks
    big2 = KVRequest("big2", list(range(200, 208)), num_prompt_tokens=8)  # 4 blocks
    assert m.allocate_slots(big2, 8) is None
    assert m.num_pinned_blocks == 2
    m.preempt(other)
    assert m.allocate_slots(big2, 8) is not None and m.num_pinned_blocks == 2


def test_a_request_hitting_pinned_blocks_needs_no_room_for_them():
    m, _ = manager(num_blocks=10, pin_cap=3)
    run(m, SYS + [9])
    m.pin(hashes(m, SYS), ttl_s=60)
    req = KVRequest("r", SYS + list(range(30, 44)), num_prompt_tokens=20)  # 10 blocks
    hits, n = m.get_computed_blocks(req)
    assert n == 6 and m.allocate_slots(req, 14, hits, n) is not None
    assert m.num_pinned_blocks == 3 and m.num_free_blocks == 0


def test_hot_blocks_cached_in_a_failed_step_are_never_pinned():
    m, _ = manager(auto_pin=True)
    m.pins.hot_hits = 2
    with pytest.raises(RuntimeError), m.step():
        a, _ = run(m, SYS + [9], free=False)
        b, nb = run(m, SYS + [8], free=False)
        c, nc = run(m, SYS + [7], free=False)
        assert nb == nc == 6 and m.pins._hot  # hot in the step that computed it
        raise RuntimeError("the forward failed")
    for req in (a, b, c):
        m.free(req)
    removed = [e for e in m.take_events() if isinstance(e, PoolRemoved)]
    assert removed and not m.pool.cached
    m.expire_pins()
    assert m.num_pinned_blocks == 0
    assert all(b.ref_cnt == 0 for b in m.pool.blocks)


def test_pin_when_computed_waits_for_the_prompt_and_gives_up_after_ttl():
    m, clock = manager(pin_cap=4)
    warm = KVRequest("w", SYS + [9], num_prompt_tokens=7)
    m.pin_when_computed(warm, ttl_s=5)
    m.expire_pins()
    assert m.num_pinned_blocks == 0
    hits, n = m.get_computed_blocks(warm)
    m.allocate_slots(warm, 7, hits, n)
    m.expire_pins()
    assert m.num_pinned_blocks == 0  # scheduled, not computed yet
    warm.num_computed_tokens = 7
    m.free(warm)
    m.expire_pins()
    assert m.num_pinned_blocks == 3
    never = KVRequest("n", [4, 4, 4, 4], num_prompt_tokens=4)
    m.pin_when_computed(never, ttl_s=5)
    clock.now = 6
    m.expire_pins()
    assert m.pins._deferred == []


def test_bad_ttl_and_caching_off():
    m, _ = manager()
    with pytest.raises(ValueError):
        m.pin([b"x"], ttl_s=0)
    off = KVCacheManager(20, BS, hash_algo=ALGO, enable_caching=False, auto_pin=True)
    assert off.pin([b"x"], ttl_s=5) == 0 and off.num_pinned_blocks == 0


def test_pins_yield_soonest_to_expire_first_deepest_first():
    m, clock = manager(num_blocks=10, pin_cap=5)
    run(m, [1, 2, 3, 4, 5])
    run(m, [7, 8, 9, 9, 9])
    long_, short = hashes(m, [1, 2, 3, 4]), hashes(m, [7, 8, 9, 9])
    m.pin(long_, ttl_s=100)
    m.pin(short, ttl_s=10)
    big = KVRequest("big", list(range(100, 114)), num_prompt_tokens=14)  # 7 blocks
    assert m.allocate_slots(big, 14) is not None  # 7 + 4 pinned > 10: one must go
    assert set(m.pins._pins) == {*long_, short[0]}
    m.free(big)
    big2 = KVRequest("big2", list(range(200, 218)), num_prompt_tokens=18)  # 9 blocks
    assert m.allocate_slots(big2, 18) is not None  # then the short chain's head, then...
    assert set(m.pins._pins) == {long_[0]}  # ...the long one's tail


def test_an_unpinned_hot_chain_needs_k_new_hits_to_come_back():
    m, _ = manager(auto_pin=True)
    for i in range(9):
        run(m, SYS + [10 + i])
    m.expire_pins()
    assert m.num_pinned_blocks == 3
    assert m.unpin(hashes(m, SYS)) == 3
    for i in range(7):
        run(m, SYS + [30 + i])
        m.expire_pins()
        assert m.num_pinned_blocks == 0
    run(m, SYS + [40])
    m.expire_pins()
    assert m.num_pinned_blocks == 3


def hot(m, tokens, salt=None, hits=9):
    """Make ``tokens``'s chain hot (first admissions hitting it) and tick: auto-pinned."""
    for i in range(hits):
        run(m, tokens + [50 + i], salt=salt)
    m.expire_pins()


def test_an_explicit_pin_displaces_automatic_pins_at_the_cap():
    """Automatic pins leave the admin room: hot traffic (any caller's own salted prefix) fills the
    cap with
    automatic pins; the admin's pin still takes the cap, and is told when the cap cut it."""
    m, _ = manager(auto_pin=True)  # cap 3
    hot(m, SYS, salt="attacker")
    assert m.num_pinned_blocks == 3 and m.pins.num_explicit == 0
    sys2 = [7, 8, 9, 10, 11, 12, 13, 14]  # four full blocks
    run(m, sys2 + [1])
    got = m.pin(hashes(m, sys2), ttl_s=600)
    assert (got, got.of, got.capped) == (3, 4, True)  # the cap stopped it: said so
    assert {h for h, p in m.pins._pins.items() if p.explicit} == set(hashes(m, sys2)[:3])
    assert m.num_pinned_blocks == 3  # the automatic pins gave way, deepest first
    hot(m, SYS, salt="attacker")  # and hot traffic cannot take the cap back
    assert m.pins.num_explicit == 3 and m.num_pinned_blocks == 3
    assert m.pin(hashes(m, sys2), ttl_s=600) == 3  # a refresh, still capped
    full = m.pin(hashes(m, SYS, salt="attacker"), ttl_s=60)
    assert (full, full.capped) == (0, True)  # explicit pins fill the cap: reported


def test_a_short_pin_says_whether_the_cap_or_the_cache_stopped_it():
    m, _ = manager(auto_pin=True)
    run(m, SYS + [9])
    h = hashes(m, SYS + [7, 8])
    got = m.pin(h, ttl_s=60)  # block 3 is not cached: not the cap's doing
    assert (got, got.of, got.capped) == (3, 4, False)
    again = pickle.loads(pickle.dumps(Pinned(2, 5, True)))  # across a process, the reason too
    assert (again, again.of, again.capped) == (2, 5, True)
    assert m.pin(hashes(m, [5, 6]), ttl_s=60).capped is False
    off = KVCacheManager(20, BS, hash_algo=ALGO, enable_caching=False)
    assert (off.pin(h, ttl_s=60), off.pin(h, ttl_s=60).of) == (0, 4)


def test_a_block_pinned_both_ways_counts_as_explicit_and_is_kept():
    m, _ = manager(auto_pin=True)
    hot(m, SYS)  # automatic, then the admin pins the same chain: explicit now
    assert m.pin(hashes(m, SYS), ttl_s=600) == 3 and m.pins.num_explicit == 3
    run(m, [7, 8, 9, 10, 11])
    assert m.pin(hashes(m, [7, 8, 9, 10]), ttl_s=600).capped  # nothing to displace
    assert set(m.pins._pins) == set(hashes(m, SYS))


def test_pins_yield_automatic_ones_first():
    m, _ = manager(num_blocks=10, pin_cap=5, auto_pin=True)
    run(m, [1, 2, 3, 4, 5])
    m.pin(hashes(m, [1, 2, 3, 4]), ttl_s=10)  # explicit, expires soonest
    hot(m, [7, 8, 9, 9], hits=9)             # automatic, 60 s
    auto = [h for h, p in m.pins._pins.items() if not p.explicit]
    assert auto and m.pins.num_explicit == 2
    big = KVRequest("big", list(range(100, 114)), num_prompt_tokens=14)  # 7 blocks
    assert m.allocate_slots(big, 14) is not None  # 7 + 4 pinned > 10: one must go
    assert m.pins.num_explicit == 2 and set(m.pins._pins) == {*hashes(m, [1, 2, 3, 4]),
                                                              auto[0]}  # not the explicit
