"""BlockContent.same_as shares equal prefixes, so comparing two equal chains again is O(1).

Why it matters: a block onboarded from the CPU tier gets a device content equal to, but not
the same object as, its CPU entry's; when it is evicted again the offload compares the two,
and without sharing that walks the whole chain for every block (quadratic in the chain)."""
from __future__ import annotations

from worker.kv_cache import BlockContent


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
