"""restore_disk: the disk tier rebuilt from its files at start; the snapshot of every tier."""
import pytest

from kvmesh.events.pool import PoolStored
from kvmesh.events.to_index import snapshot_blocks
from kvmesh.hashing import block_hashes, extra_keys
from kvmesh.v1 import index_pb2
from worker.kv_cache import KVCacheManager, KVRequest

BS = 2


def entries(tokens, salt=None, seed=None, algo="sha256_cbor"):
    """The (hash, parent, tokens, extra keys) of each full block, as files would hold."""
    hashes = block_hashes(tokens, BS, salt=salt, seed=seed, algo=algo)
    return [(h, hashes[i - 1] if i else None, tokens[i * BS:(i + 1) * BS],
             extra_keys(i * BS, (i + 1) * BS, salt=salt))
            for i, h in enumerate(hashes)]


def disk(m):
    return [e.block_hash for e in m.offloader.disk]


def test_restored_blocks_are_announced_and_onboarded_verified():
    m = KVCacheManager(8, BS, cpu_blocks=2, disk_blocks=8)
    a = entries([1, 2, 3, 4, 5, 6])
    kept = m.restore_disk(a)
    assert kept == [h for h, *_ in a] == disk(m)
    assert m.take_events() == [PoolStored(1, kept, None, [1, 2, 3, 4, 5, 6], "disk")]
    req = KVRequest("r", [1, 2, 3, 4, 5, 6, 7])
    assert m.match_by_tier(req) == {"gpu": 0, "cpu": 0, "disk": 6}
    assert m.start_onboard(req, [])
    copies = m.take_transfers()[0].copies
    assert [(t, s) for t, s, _ in copies] == [("disk", h) for h in kept]
    # Other tokens under the same hashes (a forged or mixed-up file) never match.
    assert m.match_by_tier(KVRequest("x", [1, 2, 3, 5, 5, 6, 7]))["disk"] == 2


def test_orphans_bad_hashes_and_other_seeds_are_dropped():
    m = KVCacheManager(8, BS, cpu_blocks=2, disk_blocks=8)
    a = entries([1, 2, 3, 4, 5, 6])
    b = entries([7, 7, 8, 8])
    other_seed = entries([9, 9], seed="another")
    forged = [(a[0][0], None, [2, 1], None)]          # hash of [1, 2], tokens [2, 1]
    short = [(block_hashes([4, 4, 4], 3)[0], None, [4, 4, 4], None)]  # another block size
    kept = m.restore_disk(forged + a[1:] + b + other_seed + short)
    assert kept == [h for h, *_ in b]  # a1, a2 hang from a block that did not load
    assert disk(m) == kept
    events = m.take_events()
    assert [e.block_hashes for e in events] == [kept] and events[0].tier == "disk"


def test_extra_keys_from_a_file_format_that_lists_them():
    m = KVCacheManager(8, BS, cpu_blocks=2, disk_blocks=8)
    salted = entries([1, 2, 3, 4], salt="s")
    as_lists = [(h, p, list(t), None if x is None else [list(k) for k in x])
                for h, p, t, x in salted]
    assert m.restore_disk(as_lists) == [h for h, *_ in salted]
    req = KVRequest("r", [1, 2, 3, 4, 5], salt="s")
    assert m.match_by_tier(req)["disk"] == 4
    assert m.match_by_tier(KVRequest("u", [1, 2, 3, 4, 5]))["disk"] == 0


def test_only_the_newest_that_fit_are_kept():
    m = KVCacheManager(8, BS, cpu_blocks=2, disk_blocks=3)
    old, new = entries([1, 1, 1, 1]), entries([2, 2, 2, 2, 2, 2])
    kept = m.restore_disk(old + new)  # oldest first
    assert kept == [h for h, *_ in new] == disk(m)
    assert m.restore_disk(entries([3, 3])) == []  # full
    m2 = KVCacheManager(8, BS, cpu_blocks=2, disk_blocks=3)
    # The newest 3 are old1, new0, new1: old1's parent old0 is cut, so it is an orphan.
    assert m2.restore_disk(old + new[:2]) == [h for h, *_ in new[:2]]
    with pytest.raises(ValueError, match="disk"):
        KVCacheManager(8, BS, cpu_blocks=2).restore_disk(old)
    with pytest.raises(ValueError, match="disk"):
        KVCacheManager(8, BS).restore_disk(old)


def test_the_restored_tier_follows_the_lru_rules():
    m = KVCacheManager(8, BS, cpu_blocks=1, disk_blocks=2)
    kept = m.restore_disk(entries([1, 1]) + entries([2, 2]))
    m.take_events()
    # Two blocks offloaded to a 1-slot CPU tier: one spills, the oldest restored one goes.
    for i, tokens in enumerate(([3, 3, 0], [4, 4, 0])):
        req = KVRequest(f"r{i}", tokens)
        assert m.allocate_slots(req, 3) is not None
        m.free(req)
    m.pool.free_blocks(m.pool.get_new_blocks(8))
    assert disk(m) == [kept[1], block_hashes([3, 3], BS)[0]]


def test_the_snapshot_covers_every_tier_one_run_per_tier_and_chain():
    m = KVCacheManager(3, BS, cpu_blocks=4, disk_blocks=4)
    m.restore_disk(entries([1, 2, 3, 4, 5, 6]))
    # Compute a chain, evict it to the CPU; keep another on the device.
    req = KVRequest("r", [1, 2, 3, 4, 5])
    assert m.allocate_slots(req, 5) is not None
    m.free(req)
    m.pool.free_blocks(m.pool.get_new_blocks(3))  # both blocks go to the CPU
    dev = KVRequest("d", [8, 8, 8])
    assert m.allocate_slots(dev, 3) is not None
    snap = m.cached_block_hashes()
    a = block_hashes([1, 2, 3, 4, 5, 6], BS)
    d0 = block_hashes([8, 8], BS)[0]
    assert snap.seq == m.pool.last_seq
    got = {t: dict(zip(h, p, strict=True)) for t, (h, p) in snap.by_tier().items()}
    assert got == {"gpu": {d0: None}, "cpu": {a[0]: None, a[1]: a[0]},
                   "disk": {a[0]: None, a[1]: a[0], a[2]: a[1]}}
    assert snap.tiers.count("cpu") == 2 and len(snap.tiers) == len(snap.block_hashes) == 6
    # On the wire: one run per tier (the CPU's LRU order lists a chain tail first).
    assert [h for h, t in zip(snap.block_hashes, snap.tiers, strict=True) if t == "cpu"] == [
        a[1], a[0]]
    blocks = snapshot_blocks(snap)
    assert [(b.tier, list(b.block_hashes), b.parent_hash) for b in blocks] == [
        (index_pb2.TIER_GPU, [d0], b""),
        (index_pb2.TIER_CPU, a[:2], b""),
        (index_pb2.TIER_DISK, a, b"")]


def test_a_device_only_snapshot_is_as_before():
    m = KVCacheManager(4, BS)
    req = KVRequest("r", [1, 2, 3, 4, 5])
    m.allocate_slots(req, 5)
    snap = m.cached_block_hashes()
    assert snap.tiers == ["gpu", "gpu"] and snap.tier == "gpu"
    blocks = snapshot_blocks(snap)
    assert [(b.tier, list(b.block_hashes)) for b in blocks] == [
        (index_pb2.TIER_GPU, block_hashes([1, 2, 3, 4], BS))]
