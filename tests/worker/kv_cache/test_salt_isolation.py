"""Property: no request ever reuses a block cached under another salt (tenant isolation).

Random requests with random salts go through the KV cache manager (and, fewer, through the
engine); every prefix hit must be explained by an EARLIER request with the SAME salt that
shares those whole blocks of tokens. A request whose salt nobody used before hits nothing.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker import Engine
from worker.kv_cache import KVCacheManager, KVRequest

BS = 4
SALTS = st.one_of(st.none(), st.sampled_from(["a", "b", "A", "tenant-1"]),
                  st.text(min_size=1, max_size=4))
PROMPTS = st.lists(st.integers(0, 2), min_size=1, max_size=5 * BS + 1)  # shared prefixes


def shared_blocks(a: list[int], b: list[int]) -> int:
    """Whole blocks of tokens ``a`` and ``b`` have in common from the start."""
    n = 0
    while (n + 1) * BS <= min(len(a), len(b)) and a[n * BS:(n + 1) * BS] == b[n * BS:(n + 1) * BS]:
        n += 1
    return n


def allowed_hit(prompt: list[int], salt: str | None,
                earlier: list[tuple[list[int], str | None]]) -> int:
    """The most tokens the cache may serve: whole blocks shared with an earlier prompt of
    the same salt, and never the last token."""
    blocks = max((shared_blocks(prompt, p) for p, s in earlier if s == salt), default=0)
    return min(blocks * BS, (len(prompt) - 1) // BS * BS)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(PROMPTS, SALTS), min_size=1, max_size=14))
def test_manager_hits_only_same_salt_blocks(requests: list[tuple[list[int], str | None]]) -> None:
    m = KVCacheManager(num_blocks=128, block_size=BS)  # big enough that nothing is evicted
    earlier: list[tuple[list[int], str | None]] = []
    for i, (prompt, salt) in enumerate(requests):
        req = KVRequest(f"r{i}", list(prompt), salt=salt)
        hits, n = m.get_computed_blocks(req)
        assert n == allowed_hit(prompt, salt, earlier), (prompt, salt, earlier)
        assert m.allocate_slots(req, len(prompt) - n, hits, n) is not None
        m.free(req)
        earlier.append((prompt, salt))


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=3 * BS + 1),
                          SALTS), min_size=2, max_size=6))
def test_engine_serves_cached_tokens_only_from_the_same_salt(
        requests: list[tuple[list[int], str | None]]) -> None:
    engine = Engine.from_pretrained("tiny", block_size=BS, num_blocks=64)
    earlier: list[tuple[list[int], str | None]] = []
    for prompt, salt in requests:
        done = engine.generate([prompt], max_tokens=1, salt=salt)[0]
        assert done.num_cached_tokens == allowed_hit(prompt, salt, earlier)
        earlier.append((prompt, salt))
