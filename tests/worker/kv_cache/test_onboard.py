"""Onboard: lower-tier blocks copied back to the device before the request is admitted."""
import pytest

from worker.kv_cache import KVRequest, Onboard

from .fake_plane import BS, Run


def offloaded(gpu=4, cpu=4, disk=0):
    """a0 a1 (the prompt [1, 2, 3, 4, 5]) evicted to the CPU by b ([9] * 7, freed)."""
    r = Run(gpu=gpu, cpu=cpu, disk=disk)
    r.run([1, 2, 3, 4, 5], "a")
    r.run([9] * 7, "b")
    assert r.lower("cpu")[-2:] == ["a1", "a0"]
    r.events()
    return r


def admit(r, req):
    hits, n = r.m.get_computed_blocks(req)
    new = r.m.allocate_slots(req, req.num_tokens - n, hits, n)
    r.plane.run()
    if new is not None:
        req.num_computed_tokens = req.num_tokens
        r.plane.write(req)
    return new, hits, n


def refs(r, blocks):
    return [b.ref_cnt for b in blocks]


def test_onboard_lifecycle_ok():
    r = offloaded()
    c = KVRequest("c", [1, 2, 3, 4, 6])
    hits, n = r.m.get_computed_blocks(c)
    assert (hits, n) == ([], 0)
    assert r.m.match_by_tier(c) == {"gpu": 0, "cpu": 4, "disk": 0}
    assert r.m.start_onboard(c, hits) and r.m.onboarding(c)
    orders = r.plane.run()
    onboard = orders[-1]
    assert isinstance(onboard, Onboard) and onboard.request_id == "c"
    a0, a1 = r.chain("a", [1, 2, 3, 4])
    cpu = r.m.offloader.cpu
    assert [(t, s) for t, s, _ in onboard.copies] == [("cpu", cpu.get(a0).slot),
                                                       ("cpu", cpu.get(a1).slot)]
    dest = [r.m.pool.blocks[b] for _, _, b in onboard.copies]
    assert refs(r, dest) == [1, 1] and not any(b.is_free for b in dest)
    assert [b.block_hash for b in dest] == [None, None]  # nobody can hit them mid-copy
    assert cpu.get(a0).readers == cpu.get(a1).readers == 1
    # Not admitted while the copy runs; a second start changes nothing.
    assert r.m.get_computed_blocks(c) == ([], 0) and not r.m.start_onboard(c, [])
    with pytest.raises(ValueError, match="in flight"):
        r.m.allocate_slots(c, 5)
    r.events()
    r.plane.finish("c")
    assert not r.m.onboarding(c)
    assert r.events() == [("stored", "gpu", ["a0", "a1"])]
    assert cpu.get(a0).readers == 0 and r.lower("cpu") == ["a1", "a0", "b2"]  # inclusive
    r.plane.check()
    new, hits, n = admit(r, c)
    assert hits == dest and n == 4 and len(new) == 1
    assert refs(r, dest) == [1, 1]  # the hold is gone, the request's references remain
    assert r.m.cached_tokens_by_tier(c) == {"gpu": 0, "cpu": 4, "disk": 0}
    stats = r.m.tier_stats()
    assert stats["cpu"].onboard_blocks == 2 and stats["cpu"].hit_tokens == 4
    assert r.m.stats.hits == 4
    r.m.free(c)
    assert refs(r, dest) == [0, 0] and r.m.cached_tokens_by_tier(c)["cpu"] == 0


def test_the_hold_keeps_onboarded_blocks_until_admission():
    r = offloaded()
    c = KVRequest("c", [1, 2, 3, 4, 6])
    assert r.m.start_onboard(c, [])
    r.plane.run()
    r.plane.finish("c")
    dest = [r.m.pool.blocks[b] for _, _, b in r.plane.orders[-1].copies]
    # Everything else is taken: the onboarded blocks are not evicted.
    assert r.m.num_free_blocks == 2
    r.run([7] * 4, "x", free=False)
    assert r.m.num_free_blocks == 0 and refs(r, dest) == [1, 1]
    assert r.m.get_computed_blocks(c)[0] == dest


def test_a_failed_copy_drops_the_failed_entries_and_the_request_recomputes():
    r = offloaded()
    c = KVRequest("c", [1, 2, 3, 4, 6])
    assert r.m.start_onboard(c, [])
    r.plane.run()
    dest = [r.m.pool.blocks[b] for _, _, b in r.plane.orders[-1].copies]
    r.events()
    a1 = r.chain("a", [1, 2, 3, 4])[1]
    r.plane.finish("c", ok=False, failed={("cpu", a1)})
    assert r.events() == [("removed", "cpu", ["a1"])]
    assert "a0" in r.lower("cpu") and "a1" not in r.lower("cpu") and not r.m.onboarding(c)
    free = list(r.m.pool.free_queue)
    assert free[:2] == dest[::-1] or free[:2] == dest  # unhashed: at the head
    assert refs(r, dest) == [0, 0] and [b.block_hash for b in dest] == [None, None]
    # The request recomputes: no second onboard (even though a0 is still on the CPU).
    assert not r.m.start_onboard(c, [])
    new, hits, n = admit(r, c)
    assert n == 0 and len(new) == 3
    assert r.m.cached_tokens_by_tier(c) == {"gpu": 0, "cpu": 0, "disk": 0}
    r.plane.check()


def test_abort_during_the_copy_releases_the_hold_only_at_finish():
    for ok in (True, False):
        r = offloaded()
        c = KVRequest("c", [1, 2, 3, 4, 6])
        assert r.m.start_onboard(c, [])
        r.plane.run()
        dest = [r.m.pool.blocks[b] for _, _, b in r.plane.orders[-1].copies]
        r.m.free(c)  # the abort
        assert refs(r, dest) == [1, 1] and not any(b.is_free for b in dest)
        assert r.m.onboarding(c)
        # The pool cannot hand them out meanwhile.
        x = r.run([7] * 4, "x", free=False)
        assert r.m.num_free_blocks == 0 and refs(r, dest) == [1, 1]
        r.m.free(x)
        r.events()
        r.plane.finish("c", ok=ok)
        assert refs(r, dest) == [0, 0] and all(b.is_free for b in dest)
        assert "c" not in r.m._onboards.holds
        if ok:  # the copy was good: its blocks stay cached for others
            assert r.events() == [("stored", "gpu", ["a0", "a1"])]
            assert r.m.get_computed_blocks(KVRequest("d", [1, 2, 3, 4, 9]))[1] == 4
        else:
            assert r.events() == [] and r.m.get_computed_blocks(c)[1] == 0
        with pytest.raises(ValueError, match="in flight"):
            r.m.finish_onboard("c", True)
        r.plane.check()


def test_lower_entries_being_read_are_never_evicted():
    r = offloaded(gpu=4, cpu=2)
    assert r.lower("cpu") == ["a1", "a0"]  # the CPU is full
    c = KVRequest("c", [1, 2, 3, 4, 6])
    assert r.m.start_onboard(c, [])  # evicts b2: the CPU has no victim, b2 is dropped
    r.plane.run()
    assert r.events() == [("removed", "gpu", ["b2"])]
    for i in range(3):  # more evictions: still nothing may leave the CPU
        r.run([20 + i] * 3, f"x{i}")
    assert r.lower("cpu") == ["a1", "a0"]
    assert not [e for e in r.events() if e[:2] == ("removed", "cpu")]
    r.plane.finish("c")
    r.run([30] * 3, "y")  # read no more: now the LRU entry goes
    assert r.lower("cpu")[:1] == ["a0"]
    r.plane.check()


def test_a_chain_split_across_gpu_cpu_and_disk_is_matched_in_order():
    r = Run(gpu=4, cpu=1, disk=2)
    r.run([1, 2, 3, 4, 5, 6, 7], "a")  # a0 a1 a2 + a partial block, all freed
    r.run([9, 9, 9], "x")              # takes the partial block and a2: a2 -> cpu
    r.run([8, 8, 8], "y")              # takes x's partial block and a1: a1 -> cpu, a2 -> disk
    assert (r.lower("cpu"), r.lower("disk")) == (["a1"], ["a2"])
    c = KVRequest("c", [1, 2, 3, 4, 5, 6, 7])
    hits, n = r.m.get_computed_blocks(c)
    assert n == 2  # a0 is still on the device
    assert r.m.match_by_tier(c) == {"gpu": 2, "cpu": 2, "disk": 2}
    assert r.m.start_onboard(c, hits)
    r.plane.run()
    a2 = r.chain("a", [1, 2, 3, 4, 5, 6])[2]
    copies = r.plane.orders[-1].copies
    assert [c_[0] for c_ in copies] == ["cpu", "disk"] and copies[1][1] == a2
    r.plane.finish("c")
    new, hits, n = admit(r, c)
    assert n == 6 and r.m.cached_tokens_by_tier(c) == {"gpu": 2, "cpu": 2, "disk": 2}
    r.plane.check()
    stats = r.m.tier_stats()
    assert [stats[t].hit_tokens for t in ("gpu", "cpu", "disk")] == [2, 2, 2]
    assert stats["disk"].onboard_blocks == 1


def test_never_past_the_last_token_and_only_as_many_blocks_as_are_free():
    r = offloaded()
    c = KVRequest("c", [1, 2, 3, 4])  # 2 full blocks; the last token is always computed
    assert r.m.match_by_tier(c) == {"gpu": 0, "cpu": 2, "disk": 0}
    x = r.run([7] * 5, "x", free=False)  # 3 blocks of 4 taken: one free
    assert r.m.num_free_blocks == 1
    d = KVRequest("d", [1, 2, 3, 4, 5])
    assert r.m.start_onboard(d, [])
    r.plane.run()
    assert len(r.plane.orders[-1].copies) == 1  # a0 only
    assert not r.m.start_onboard(c, [])  # nothing free now: nothing changes
    assert c.request_id not in r.m._onboards.holds
    r.plane.finish("d")
    assert r.m.get_computed_blocks(d)[1] == BS
    r.m.free(x)


def test_release_holds_frees_finished_holds_but_the_kept_one():
    r = offloaded()
    c = KVRequest("c", [1, 2, 3, 4, 6])
    assert r.m.start_onboard(c, [])
    r.plane.run()
    assert r.m.release_holds() == 0  # in flight: never released early
    r.plane.finish("c")
    assert r.m.release_holds(keep=c) == 0
    dest = [r.m.pool.blocks[b] for _, _, b in r.plane.orders[-1].copies]
    assert r.m.release_holds() == 1 and refs(r, dest) == [0, 0]
    # The blocks stay cached: the request now hits them on the device.
    assert r.m.get_computed_blocks(c)[1] == 4


def test_an_onboarded_block_keeps_its_owner_and_the_hit_is_the_requesters():
    r = Run(gpu=4, cpu=4)
    r.run([1, 2, 3, 4, 5], "a", tenant="t")
    r.run([9] * 7, "b", tenant="u")  # a0 a1 on the CPU now, owned by t
    c = KVRequest("c", [1, 2, 3, 4, 6], tenant="w")
    assert r.m.start_onboard(c, [])
    r.plane.run()
    r.plane.finish("c")
    new, hits, n = admit(r, c)
    assert n == 4 and [b.owner for b in hits] == ["t", "t"]
    s = r.m.tenant_stats()
    assert s["t"].tiers["gpu"].blocks == 2 and s["w"].tiers["gpu"].blocks == 0
    assert s["w"].tiers["cpu"].hit_blocks == 2 and s["w"].cached_tokens == 4
