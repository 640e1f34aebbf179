"""LowerTier: the LRU of one lower tier (slots, verified lookups, readers, dropped entries)."""
import pytest

from worker.kv_cache import BlockContent, LowerTier


def content(*tokens, parent=None):
    return BlockContent(parent, tuple(tokens), None)


def add(tier, name, parent_hash=None, tokens=(1, 2)):
    return tier.add(name.encode(), parent_hash, content(*tokens))


def lru(tier):
    return [e.block_hash.decode() for e in tier]


def test_slots_are_handed_out_from_zero_and_freed_on_remove():
    tier = LowerTier("cpu", 3)
    a, b, c = (add(tier, x) for x in "abc")
    assert [a.slot, b.slot, c.slot] == [0, 1, 2] and tier.num_free_slots == 0
    with pytest.raises(ValueError, match="full"):
        add(tier, "d")
    tier.remove(b)
    assert tier.num_free_slots == 1 and b"b" not in tier and len(tier) == 2
    assert add(tier, "d").slot == 1  # the freed slot


def test_a_hash_lives_in_one_entry():
    tier = LowerTier("disk", 2)
    add(tier, "a")
    with pytest.raises(ValueError, match="already holds"):
        add(tier, "a")


def test_lru_order_touch_and_victim():
    tier = LowerTier("cpu", 4)
    entries = {x: add(tier, x) for x in "abc"}
    assert lru(tier) == ["a", "b", "c"] and tier.victim() is entries["a"]
    tier.touch(entries["a"])
    assert lru(tier) == ["b", "c", "a"] and tier.victim() is entries["b"]


def test_an_entry_being_read_is_never_the_victim():
    tier = LowerTier("cpu", 2)
    a, b = add(tier, "a"), add(tier, "b")
    tier.read(a)
    assert tier.victim() is b
    tier.read(b)
    assert tier.victim() is None
    tier.release(a)
    assert tier.victim() is a
    with pytest.raises(ValueError, match="released more often"):
        tier.release(a)


def test_removing_an_entry_being_read_keeps_its_slot_until_the_last_reader():
    tier = LowerTier("cpu", 2)
    a = add(tier, "a")
    tier.read(a)
    tier.read(a)
    tier.remove(a)
    assert b"a" not in tier and a.dropped and tier.num_free_slots == 1
    b = add(tier, "b")
    assert b.slot == 1  # slot 0 is still being read
    with pytest.raises(ValueError, match="full"):
        add(tier, "c")
    tier.release(a)
    assert tier.num_free_slots == 0
    tier.release(a)
    assert tier.num_free_slots == 1 and add(tier, "c").slot == 0
    a2 = add(LowerTier("cpu", 1), "a")
    with pytest.raises(ValueError, match="does not hold"):
        tier.remove(a2)


def test_lookup_verifies_content_not_just_the_hash():
    tier = LowerTier("cpu", 2)
    root = content(1, 2)
    entry = tier.add(b"h", b"p", BlockContent(root, (3, 4), None))
    assert tier.lookup(b"h", root, [3, 4], None) is entry
    assert tier.lookup(b"h", content(1, 2), (3, 4), None) is entry  # equal, not identical
    assert tier.lookup(b"h", root, [3, 5], None) is None          # other tokens: collision
    assert tier.lookup(b"h", content(9, 9), [3, 4], None) is None  # other prefix
    assert tier.lookup(b"h", root, [3, 4], (("cache_salt", "s"),)) is None
    assert tier.lookup(b"x", root, [3, 4], None) is None


def test_clear_refuses_while_read_and_resets_slots():
    tier = LowerTier("disk", 2)
    a, _ = add(tier, "a"), add(tier, "b")
    tier.read(a)
    with pytest.raises(ValueError, match="being read"):
        tier.clear()
    tier.remove(a)
    with pytest.raises(ValueError, match="being read"):
        tier.clear()  # a dropped entry still reads its slot
    tier.release(a)
    assert [e.block_hash for e in tier.clear()] == [b"b"]
    assert len(tier) == 0 and tier.num_free_slots == 2


def test_bad_size():
    with pytest.raises(ValueError):
        LowerTier("cpu", 0)


def test_entries_are_charged_to_their_owner_and_counted_when_evicted():
    tier = LowerTier("cpu", 4)
    a = tier.add(b"a", None, content(1, 2), owner="t")
    tier.add(b"b", None, content(3, 4), owner="u")
    assert tier.ledger.blocks == {"t": 1, "u": 1}
    tier.evicted(a)
    tier.remove(a)
    assert tier.ledger.blocks == {"t": 0, "u": 1} and tier.ledger.evictions == {"t": 1}
    assert tier.evictions == 1
    tier.clear()
    assert tier.ledger.blocks == {"t": 0, "u": 0}


def test_with_quotas_the_victim_is_the_over_quota_owners_lru_unread_entry():
    from kvmesh.quota import Quota, Quotas

    tier = LowerTier("cpu", 10)
    t = [tier.add(f"t{i}".encode(), None, content(i, i), owner="t") for i in range(3)]
    u = [tier.add(f"u{i}".encode(), None, content(9, i), owner="u") for i in range(4)]
    assert tier.victim() is t[0]  # no quotas: the LRU
    tier.ledger.set_quotas(Quotas(tenants={"u": Quota(cpu=0.2), "t": Quota(cpu=0.3)}))
    assert list(tier.ledger.over) == ["u"]
    assert tier.victim() is u[0] and tier.victim("x") is u[0]
    tier.touch(u[0])
    tier.read(u[1])  # being read: never the victim
    assert tier.victim() is u[2]
    assert tier.victim("t") is t[0]  # t is at its quota (3 of 3): its own go first
    tier.read(t[0])
    assert tier.victim("t") is t[1]
    tier.ledger.set_quotas(Quotas(tenants={"u": Quota(cpu=0.2), "t": Quota(cpu=0.1)}))
    assert tier.victim() is t[1]  # t and u both over by 2: the smaller name...
    tier.evicted(t[1])
    tier.remove(t[1])
    assert tier.victim() is u[2]  # ...then u is the most over
