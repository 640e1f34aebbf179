"""Offload: evicted device blocks move to the CPU tier, spill to disk, or are dropped."""
import pytest

from kvmesh.events.pool import PoolCleared
from kvmesh.hashing import block_hashes
from worker.kv_cache import BlockContent, Drop, KVCacheManager, KVRequest, Offload, Spill
from worker.kv_cache.block_pool import Evicted

from .fake_plane import BS, Run


def test_defaults_have_no_tiers():
    m = KVCacheManager(4, BS)
    assert m.offloader is None and m.pool.on_evict is None and m.take_transfers() == []
    assert list(m.tier_stats()) == ["gpu"]
    with pytest.raises(ValueError, match="CPU tier"):
        KVCacheManager(4, BS, disk_blocks=2)
    with pytest.raises(ValueError):
        KVCacheManager(4, BS, cpu_blocks=-1)
    with pytest.raises(ValueError, match="device pool"):
        KVCacheManager(4, BS, tier="cpu", cpu_blocks=2)


def test_an_evicted_chain_is_stored_on_cpu_before_it_is_removed_from_gpu():
    r = Run(gpu=4, cpu=4)
    r.run([1, 2, 3, 4, 5], "a")  # blocks 0, 1 cached (a0, a1); 2 holds the partial block
    assert r.events() == [("stored", "gpu", ["a0", "a1"])]
    r.run([9] * 7, "b", free=False)  # needs all 4 blocks: a1 then a0 are evicted
    assert r.events() == [("stored", "cpu", ["a1"]), ("stored", "cpu", ["a0"]),
                          ("removed", "gpu", ["a1", "a0"]),
                          ("stored", "gpu", ["b0", "b1", "b2"])]
    a0, a1 = r.chain("a", [1, 2, 3, 4])
    assert r.plane.orders == [Offload(1, 0, a1), Offload(0, 1, a0)]
    assert r.lower("cpu") == ["a1", "a0"]  # the chain's tail is the LRU victim
    r.plane.check()
    stats = r.m.tier_stats()
    assert stats["gpu"].offloads == 2 and stats["gpu"].evictions == 0
    assert stats["cpu"].cached_blocks == 2 and stats["cpu"].capacity_blocks == 4


def test_a_duplicate_hash_is_offloaded_only_when_its_last_device_block_goes():
    r = Run(gpu=6, cpu=4)
    # Two requests compute the same prompt in the same step: two blocks hold each hash.
    x, y = KVRequest("x", [1, 2, 3]), KVRequest("y", [1, 2, 3])
    r.chain("a", [1, 2])
    for req in (x, y):
        assert r.m.allocate_slots(req, 3) is not None
        req.num_computed_tokens = 3
        r.plane.write(req)
    assert sorted(r.m.pool.cached[block_hashes([1, 2], BS)[0]]) == [0, 2]
    r.m.free(x)
    r.m.free(y)
    r.events()
    # Free queue: 3 (unhashed), 1 (unhashed), 4, 5, then the two holders of a0: 2, 0.
    r.run([9] * 9, "b", free=False)  # takes 5 blocks: the first holder of a0 goes, not a0
    assert r.events() == [("stored", "gpu", ["b0", "b1", "b2", "b3"])]
    assert r.lower("cpu") == [] and r.plane.orders == []
    r.run([7] * 2, "c", free=False)  # the last holder goes: a0 moves to the CPU
    assert r.events() == [("stored", "cpu", ["a0"]), ("removed", "gpu", ["a0"]),
                          ("stored", "gpu", ["c0"])]
    assert r.lower("cpu") == ["a0"]
    r.plane.check()


def test_a_full_cpu_spills_its_lru_block_to_disk_before_taking_the_new_one():
    r = Run(gpu=3, cpu=2, disk=2)
    r.run([1, 2, 3, 4, 5], "a")  # a0, a1
    r.run([5, 6, 7], "b")        # b0: evicts a1 (offloaded: its parent a0 is on gpu)
    r.run([8, 9, 8, 9, 8], "c")  # evicts a0 and b0: the CPU fills, a1 spills
    a0, a1 = r.chain("a", [1, 2, 3, 4])
    b0, c0 = r.chain("b", [5, 6])[0], r.chain("c", [8, 9])[0]
    assert r.events() == [
        ("stored", "gpu", ["a0", "a1"]),
        ("stored", "cpu", ["a1"]), ("removed", "gpu", ["a1"]), ("stored", "gpu", ["b0"]),
        ("stored", "cpu", ["a0"]),
        ("stored", "disk", ["a1"]), ("removed", "cpu", ["a1"]),  # a1 spilled, slot 0 free
        ("stored", "cpu", ["b0"]),
        ("removed", "gpu", ["a0", "b0"]), ("stored", "gpu", ["c0", "c1"])]
    assert r.plane.orders == [Offload(1, 0, a1), Offload(0, 1, a0),
                              Spill(0, a1, a0, (3, 4), None), Offload(2, 0, b0)]
    assert r.lower("disk") == ["a1"] and r.lower("cpu") == ["a0", "b0"]
    assert c0
    r.plane.check()
    assert r.m.tier_stats()["cpu"].offloads == 1


def test_without_disk_the_cpu_victim_is_dropped():
    r = Run(gpu=2, cpu=1)
    r.run([1, 2, 3], "a")
    r.run([4, 5, 6], "b")  # a0 -> cpu
    r.run([7, 8, 9], "c")  # b0 -> cpu: a0 dropped
    assert r.events()[-4:] == [("removed", "cpu", ["a0"]), ("stored", "cpu", ["b0"]),
                               ("removed", "gpu", ["b0"]), ("stored", "gpu", ["c0"])]
    assert r.lower("cpu") == ["b0"]
    stats = r.m.tier_stats()
    assert stats["cpu"].evictions == 1 and stats["cpu"].offloads == 0


def test_a_full_disk_drops_its_lru_block_and_orders_the_file_deleted():
    r = Run(gpu=2, cpu=1, disk=1)
    for name, tokens in zip("abcd", ([1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 1, 1]),
                            strict=True):
        r.run(tokens, name)
    # a0 -> cpu -> disk; b0 -> cpu -> disk (a0 dropped); c0 -> cpu.
    assert r.lower("disk") == ["b0"] and r.lower("cpu") == ["c0"]
    a0 = r.chain("a", [1, 2])[0]
    assert Drop(a0) in r.plane.orders and a0 not in r.plane.disk
    events = r.events()
    assert ("removed", "disk", ["a0"]) in events
    assert r.m.tier_stats()["disk"].evictions == 1
    r.plane.check()


def test_an_orphan_is_not_offloaded():
    """A block whose parent is held on no tier can never be reached from block 0."""
    r = Run(gpu=4, cpu=4)
    a0, a1, a2 = r.chain("a", [1, 2, 3, 4, 5, 6])
    o0 = BlockContent(None, (1, 2), None)
    c1 = BlockContent(o0, (3, 4), None)
    c2 = BlockContent(c1, (5, 6), None)
    # a2 alone: its parent a1 is on no tier.
    r.m.pool.on_evict([Evicted(0, a2, a1, c2)])
    assert r.lower("cpu") == [] and r.m.take_transfers() == []
    # a2 and a1 in one batch, tail first: a1's parent a0 is on no tier either.
    r.m.pool.on_evict([Evicted(0, a2, a1, c2), Evicted(1, a1, a0, c1)])
    assert r.lower("cpu") == []
    # With the head in the batch too, the whole chain hangs from block 0.
    r.m.pool.on_evict([Evicted(0, a2, a1, c2), Evicted(1, a1, a0, c1), Evicted(2, a0, None, o0)])
    assert r.lower("cpu") == ["a2", "a1", "a0"]
    assert r.events() == [("stored", "cpu", ["a2"]), ("stored", "cpu", ["a1"]),
                          ("stored", "cpu", ["a0"])]
    # A parent held on the CPU (or the device) is enough.
    d1 = block_hashes([1, 2, 7, 7], BS)[1]
    r.names[d1] = "d1"
    r.m.pool.on_evict([Evicted(3, d1, a0, BlockContent(o0, (7, 7), None))])
    assert r.lower("cpu") == ["a2", "a1", "a0", "d1"]


def test_a_hash_already_on_cpu_is_refreshed_not_copied_again():
    r = Run(gpu=4, cpu=4)
    a0, a1 = r.chain("a", [1, 2, 3, 4])
    c0 = BlockContent(None, (1, 2), None)
    r.m.pool.on_evict([Evicted(5, a0, None, c0)])
    r.m.pool.on_evict([Evicted(6, b"other", None, BlockContent(None, (8, 8), None))])
    r.names[b"other"] = "o"
    r.m.take_transfers()
    r.events()
    r.m.pool.on_evict([Evicted(7, a0, None, BlockContent(None, (1, 2), None))])
    assert r.lower("cpu") == ["o", "a0"] and r.m.take_transfers() == [] and r.events() == []
    # A collision (same hash, other tokens) keeps what the tier has.
    r.m.pool.on_evict([Evicted(7, b"other", None, BlockContent(None, (9, 9), None))])
    assert r.lower("cpu") == ["o", "a0"] and r.m.take_transfers() == []
    assert r.m.offloader.cpu.get(b"other").content.token_ids == (8, 8)


def test_reset_clears_every_tier_and_deletes_disk_files():
    r = Run(gpu=2, cpu=1, disk=2)
    r.run([1, 2, 3], "a")
    r.run([4, 5, 6], "b")
    r.run([7, 8, 9], "c")
    assert r.lower("disk") == ["a0"] and r.lower("cpu") == ["b0"]
    r.plane.run()
    assert r.m.reset_prefix_cache()
    assert r.events()[-1:] == [("cleared",)]
    assert r.lower("cpu") == [] and r.lower("disk") == []
    assert r.plane.run() == [Drop(r.chain("a", [1, 2])[0])]
    assert r.m.cached_block_hashes().block_hashes == []
    assert r.m.take_events() == [] and isinstance(PoolCleared(1), PoolCleared)


def test_a_failed_offload_drops_its_cpu_entries_before_they_spill_or_are_announced():
    """A lost offload: the offload batch fails (the plane reports it lost, as the engine
    does after executing a step's orders): the CPU entries go at once, ``PoolRemoved(cpu)``
    after their ``PoolStored(cpu)``, so the pressure that follows spills and announces
    nothing of them on disk, and the snapshot does not list them."""
    r = Run(gpu=3, cpu=2, disk=4)
    r.run([1, 2, 3, 4, 5], "a")
    r.events()
    r.plane.fail("offload")
    r.run([5, 6, 7, 8, 9], "b")  # evicts a1, a0: their copy to host memory fails
    assert r.events() == [("stored", "cpu", ["a1"]), ("stored", "cpu", ["a0"]),
                          ("removed", "gpu", ["a1", "a0"]), ("stored", "gpu", ["b0", "b1"]),
                          ("removed", "cpu", ["a1"]), ("removed", "cpu", ["a0"])]
    assert r.lower("cpu") == [] and r.m.tier_stats()["cpu"].evictions == 2
    for i in range(4):  # pressure: the CPU tier fills and spills
        r.run([20 + i, 30 + i, 40 + i], f"c{i}")
    events = r.events()
    assert not any(e[0] == "stored" and e[1] == "disk" and {"a0", "a1"} & set(e[2])
                   for e in events)
    snap = r.m.cached_block_hashes()
    a = set(r.chain("a", [1, 2, 3, 4]))
    assert not a & set(snap.block_hashes)
    r.plane.check()


def test_a_spill_lost_in_the_same_step_drops_the_disk_entry_and_its_file():
    """The failed slot was spilled in the same batch (a CPU of one slot): the spill is
    refused, reported lost, and the disk entry it announced goes with a ``Drop``."""
    r = Run(gpu=2, cpu=1, disk=2)
    r.run([1, 2, 3], "a")
    r.plane.fail("offload")
    r.run([4, 5, 6], "b")  # a0 -> cpu (lost)
    r.run([7, 8, 9], "c")  # b0 -> cpu: a0 never reaches disk (already dropped)
    a0 = r.chain("a", [1, 2])[0]
    assert not any(isinstance(o, Spill) and o.block_hash == a0 for o in r.plane.orders)
    r.plane.fail("write")
    r.run([1, 1, 1], "d")  # c0 -> cpu: b0 spills, its file write fails
    b0 = r.chain("b", [4, 5])[0]
    assert any(isinstance(o, Spill) and o.block_hash == b0 for o in r.plane.orders)
    events = r.events()
    assert events.index(("stored", "disk", ["b0"])) < events.index(("removed", "disk", ["b0"]))
    assert r.lower("disk") == [] and Drop(b0) in r.plane.orders and b0 not in r.plane.disk
    r.plane.check()


def test_a_lost_copy_of_an_entry_that_moved_on_changes_nothing():
    from worker.kv_cache import Lost

    r = Run(gpu=2, cpu=2)
    r.run([1, 2, 3], "a")
    r.run([4, 5, 6], "b")  # a0 -> cpu slot 0
    a0 = r.chain("a", [1, 2])[0]
    r.events()
    assert r.m.copies_lost([Lost("cpu", a0, 1), Lost("disk", a0),
                            Lost("cpu", b"\0" * 32, 0)]) == 0  # another slot, no disk tier
    assert r.events() == [] and r.lower("cpu") == ["a0"]
    assert r.m.copies_lost([Lost("cpu", a0, 0)]) == 1 and r.lower("cpu") == []
    assert KVCacheManager(4, BS).copies_lost([Lost("cpu", a0, 0)]) == 0  # no tiers


def test_an_offloaded_block_keeps_its_owner_and_a_move_down_is_not_a_drop():
    r = Run(gpu=4, cpu=4)
    r.run([1, 2, 3, 4, 5], "a", tenant="t")
    r.run([9] * 7, "b", tenant="u", free=False)  # a1 then a0 move to the CPU
    assert [(r.names[e.block_hash], e.owner) for e in r.m.offloader.cpu] == [("a1", "t"),
                                                                            ("a0", "t")]
    t = r.m.tenant_stats()["t"].tiers
    assert (t["gpu"].blocks, t["gpu"].evicted_blocks, t["cpu"].blocks) == (0, 0, 2)


def test_with_quotas_a_full_cpu_tier_makes_room_from_the_over_quota_owner():
    from kvmesh.quota import Quota, Quotas

    r = Run(gpu=4, cpu=3, disk=1)
    ev = [Evicted(i, bytes([i]) * 8, None, BlockContent(None, (i, i), None), owner=o)
          for i, o in enumerate("uttv")]
    r.m.pool.on_evict(ev[:3])  # CPU: u's, t's, t's; u's is the least recently used
    r.m.set_quotas(Quotas(tenants={"t": Quota(cpu=0.34)}))  # 1 CPU slot; t holds 2
    r.m.pool.on_evict(ev[3:])  # v's block needs a slot: t's oldest moves down, not u's
    assert [e.owner for e in r.m.offloader.cpu] == ["u", "t", "v"]
    assert [e.owner for e in r.m.offloader.disk] == ["t"]  # spilled: it keeps its owner
    r.m.pool.on_evict([Evicted(4, b"w" * 8, None, BlockContent(None, (8, 8), None),
                               owner="t")])
    # t at its CPU quota evicts its own; on disk (one file) t's is the only victim: dropped
    assert [e.owner for e in r.m.offloader.cpu] == ["u", "v", "t"]
    s = r.m.tenant_stats()
    assert s["t"].tiers["cpu"].evicted_blocks == 0 and s["t"].tiers["disk"].evicted_blocks == 1
    assert s["u"].tiers["cpu"].blocks == 1 and s["t"].tiers["disk"].blocks == 1
