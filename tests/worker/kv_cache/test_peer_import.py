"""The manager's side of a peer import: fresh blocks for what the pool does not hold, cached
(and announced) only at commit, hit at admission as "peer" tokens."""
from __future__ import annotations

from kvmesh.events.pool import PoolStored
from worker.kv_cache import KVCacheManager, KVRequest

BS = 4


def req(rid: str, n_tokens: int, salt: str | None = None, base: int = 10) -> KVRequest:
    return KVRequest(rid, list(range(base, base + n_tokens)), salt=salt)


def admit(kv: KVCacheManager, r: KVRequest) -> dict[str, int]:
    hits, n = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, r.num_tokens - n, hits, n) is not None
    return kv.cached_tokens_by_tier(r)


def test_reserve_commit_admit_counts_peer_tokens_and_announces_them():
    kv = KVCacheManager(16, BS)
    r = req("a", 5 * BS + 1, salt="t")
    res = kv.peer.reserve(r, 0, 5)
    assert res is not None and res.first == 0 and len(res.blocks) == 5
    assert kv.get_computed_blocks(r)[1] == 0  # not a hit before commit (KV unwritten)
    kv.take_events()
    assert kv.peer.commit(res) == 5
    (stored,) = kv.take_events()
    assert isinstance(stored, PoolStored) and stored.block_hashes == r.block_hashes[:5]
    assert kv.num_free_blocks == 16  # released, cached
    assert admit(kv, r) == {"gpu": 0, "cpu": 0, "disk": 0, "peer": 5 * BS}


def test_only_blocks_beyond_what_the_pool_holds_are_reserved():
    kv = KVCacheManager(16, BS)
    first = req("a", 2 * BS + 1)
    admit(kv, first)
    kv.free(first)
    r = req("b", 5 * BS + 1)
    res = kv.peer.reserve(r, 1, 4)  # blocks 1..4 planned; 0 and 1 already held
    assert res.first == 2 and len(res.blocks) == 3
    kv.peer.commit(res)
    assert admit(kv, r) == {"gpu": 2 * BS, "cpu": 0, "disk": 0, "peer": 3 * BS}


def test_nothing_to_import_after_a_gap_without_room_or_caching():
    assert KVCacheManager(16, BS).peer.reserve(req("a", 5 * BS + 1), 1, 3) is None  # gap
    full = KVCacheManager(8, BS)
    holder = req("h", 8 * BS - 1)
    admit(full, holder)  # every block referenced
    assert full.peer.reserve(req("a", 5 * BS + 1), 0, 5) is None
    off = KVCacheManager(16, BS, enable_caching=False)
    assert off.peer.reserve(req("a", 5 * BS + 1), 0, 5) is None
    # the last token's block is always computed: never imported
    res = KVCacheManager(16, BS).peer.reserve(req("a", 5 * BS), 0, 5)
    assert len(res.blocks) == 4


def test_an_aborted_import_caches_nothing_and_a_freed_request_forgets_its_imports():
    kv = KVCacheManager(16, BS)
    r = req("a", 3 * BS + 1)
    res = kv.peer.reserve(r, 0, 3)
    kv.peer.abort(res)
    assert kv.pool.num_cached_blocks == 0 and kv.num_free_blocks == 16
    kv.peer.commit(kv.peer.reserve(r, 0, 3))
    kv.free(r)  # gone before its admission: a later request's hits are plain gpu
    assert admit(kv, req("a", 3 * BS + 1)) == {"gpu": 3 * BS, "cpu": 0, "disk": 0}


def test_taking_fresh_blocks_never_evicts_the_held_chain_it_continues():
    kv = KVCacheManager(7, BS)
    head = req("h", 2 * BS + 1)
    admit(kv, head)
    kv.free(head)
    other = req("o", 4 * BS + 1, base=500)
    admit(kv, other)
    kv.free(other)  # the head's two cached blocks are now next in line for eviction
    assert [b.block_hash for b in list(kv.pool.free_queue)[1:3]] == head.block_hashes[1::-1]
    r = req("r", 6 * BS + 1)
    res = kv.peer.reserve(r, 2, 4)
    assert res.first == 2 and len(res.blocks) == 4
    kv.peer.commit(res)
    assert admit(kv, r) == {"gpu": 2 * BS, "cpu": 0, "disk": 0, "peer": 4 * BS}


def test_imported_blocks_are_charged_to_the_importing_requests_tenant():
    kv = KVCacheManager(16, BS)
    r = KVRequest("a", list(range(10, 10 + 3 * BS + 1)), tenant="t")
    kv.peer.commit(kv.peer.reserve(r, 0, 3))
    assert admit(kv, r)["peer"] == 3 * BS
    s = kv.tenant_stats()["t"]
    assert s.tiers["gpu"].blocks == 3 and s.cached_tokens == 3 * BS
    assert s.tiers["gpu"].hit_blocks == 0  # peer tokens are cached, not a tier's hits
