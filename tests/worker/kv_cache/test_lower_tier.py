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
