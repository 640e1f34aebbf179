"""KVCacheBlock, BlockContent and the intrusive FreeBlockQueue."""
from __future__ import annotations

import pytest

from worker.kv_cache import BlockContent, FreeBlockQueue, KVCacheBlock


def make(n):
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeBlockQueue(blocks)


def test_block_defaults_and_slots():
    b = KVCacheBlock(7)
    assert (b.block_id, b.block_hash, b.ref_cnt, b.prev_free, b.next_free) == (7, None, 0,
                                                                              None, None)
    assert b.token_ids is None and not b.is_free
    with pytest.raises(AttributeError):
        b.something_else = 1  # __slots__: no per-block dict


def test_queue_is_built_once_in_id_order():
    blocks, q = make(5)
    assert [b.block_id for b in q] == [0, 1, 2, 3, 4] and len(q) == 5
    assert all(b.is_free for b in blocks)
    q.check()


def test_popleft_takes_the_head():
    blocks, q = make(3)
    assert q.popleft() is blocks[0]
    assert not blocks[0].is_free and blocks[0].prev_free is None
    assert [b.block_id for b in q] == [1, 2]
    q.check()


def test_popleft_n_is_all_or_nothing():
    _, q = make(3)
    with pytest.raises(ValueError):
        q.popleft_n(4)
    assert [b.block_id for b in q] == [0, 1, 2]
    assert [b.block_id for b in q.popleft_n(2)] == [0, 1]
    assert [b.block_id for b in q] == [2]


def test_popleft_on_empty_raises():
    _, q = make(1)
    q.popleft()
    with pytest.raises(ValueError):
        q.popleft()
    assert len(q) == 0
    q.check()


@pytest.mark.parametrize("victim", [0, 2, 4])
def test_remove_from_head_middle_tail(victim):
    blocks, q = make(5)
    q.remove(blocks[victim])
    assert [b.block_id for b in q] == [i for i in range(5) if i != victim]
    assert not blocks[victim].is_free
    q.check()


def test_remove_a_block_not_in_the_queue_raises():
    blocks, q = make(2)
    q.remove(blocks[1])
    with pytest.raises(ValueError):
        q.remove(blocks[1])
    assert [b.block_id for b in q] == [0]


def test_append_and_appendleft():
    blocks, q = make(4)
    a, b = q.popleft(), q.popleft()
    q.append(a)
    q.appendleft(b)
    assert [b.block_id for b in q] == [1, 2, 3, 0]
    q.check()
    with pytest.raises(ValueError):
        q.append(blocks[2])  # already queued: a double insert would corrupt the links
    q.check()


def test_append_n_keeps_the_given_order():
    blocks, q = make(4)
    taken = q.popleft_n(3)
    q.append_n(reversed(taken))
    assert [b.block_id for b in q] == [3, 2, 1, 0]
    q.check()


def test_drain_and_refill():
    blocks, q = make(3)
    taken = q.popleft_n(3)
    assert list(q) == [] and len(q) == 0
    q.append_n(taken)
    assert [b.block_id for b in q] == [0, 1, 2]
    q.check()


def test_content_equality_is_by_prefix_not_identity():
    a0 = BlockContent(None, (1, 2), None)
    b0 = BlockContent(None, (1, 2), None)
    a1 = BlockContent(a0, (3, 4), None)
    b1 = BlockContent(b0, (3, 4), None)
    assert a1.same_as(b1) and a1.extends(b0, [3, 4], None)
    assert not a1.extends(b0, [3, 5], None)
    assert not a1.extends(None, [3, 4], None)  # same tokens at another position
    assert not a1.extends(BlockContent(None, (9, 2), None), [3, 4], None)
    assert not a0.extends(None, [1, 2], (("cache_salt", "s"),))
    assert not a0.same_as(None) and not a1.same_as(a0)


def test_content_compare_is_iterative_on_deep_chains():
    # Two independently built 5,000-block chains: comparing them must not hit the
    # recursion limit (a nested-tuple == would).
    a = b = None
    for i in range(5000):
        a = BlockContent(a, (i,), None)
        b = BlockContent(b, (i,), None)
    assert a.same_as(b)
    c = BlockContent(b.parent, (-1,), None)
    assert not a.same_as(c)


# --- BlockContent.same_as shares equal prefixes, so comparing two equal chains again is O(1).
# Why it matters: a block onboarded from the CPU tier gets a device content equal to, but not
# the same object as, its CPU entry's; when it is evicted again the offload compares the two,
# and without sharing that walks the whole chain for every block (quadratic in the chain).

def _chain(n: int, salt: int = 0) -> BlockContent:
    node = None
    for i in range(n):
        node = BlockContent(node, (i, i + 1, salt if i == n // 2 else 0), None)
    assert node is not None
    return node


def test_equal_chains_end_up_sharing_their_prefix() -> None:
    a, b = _chain(500), _chain(500)
    assert a.parent is not b.parent
    assert a.same_as(b) and b.same_as(a)
    assert a.parent is b.parent  # the walk left them one prefix
    node, depth = a, 0
    while node is not None:
        node, depth = node.parent, depth + 1
    assert depth == 500  # nothing lost


def _parents(node: BlockContent | None) -> list[int]:
    out = []
    while node is not None:
        out.append(id(node.parent))
        node = node.parent
    return out


def test_different_chains_stay_apart() -> None:
    """Chains equal at the top but not below (a collision deep in the prefix) are unequal,
    and a failed comparison re-points nothing."""
    a, b = _chain(100), _chain(100, salt=7)
    before = (_parents(a), _parents(b))
    assert not a.same_as(b) and not b.same_as(a)
    assert (_parents(a), _parents(b)) == before
