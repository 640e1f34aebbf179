"""The token encoder's edges: negative ids, ids past the table (it grows) or past its cap, one
token, none; every path against cbor2's canonical encoding."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvmesh import hashing
from kvmesh.hashing import chain_hashes, hash_block, hash_value

ids = st.lists(st.one_of(st.integers(-2**63, -1), st.integers(0, 30), st.integers(0, 2**18 + 9),
                         st.integers(0, 2**64 - 1)), max_size=24)


def check(tokens: list[int], block_size: int) -> None:
    parent = b"p" * 32
    assert hash_block(parent, tokens, None, "sha256_cbor") == hash_value(
        "sha256_cbor", (parent, tuple(tokens), None))
    want, prev = [], parent
    for i in range(len(tokens) // block_size):
        block = tuple(tokens[i * block_size:(i + 1) * block_size])
        prev = hash_value("sha256_cbor", (prev, block, None))
        want.append(prev)
    assert chain_hashes(parent, tokens, block_size, None, "sha256_cbor") == want


@settings(max_examples=200, deadline=None)
@given(tokens=ids, fresh=st.booleans(), block_size=st.integers(1, 5))
def test_token_paths_match_cbor2(tokens, fresh, block_size) -> None:
    table = hashing._UINT
    if fresh:
        hashing._UINT = ()  # an empty table: the first id past it grows it
    try:
        check(tokens, block_size)
    finally:
        hashing._UINT = table


def test_one_token_and_none() -> None:
    for tokens in ([], [0], [23], [24], [2**18], [-1], [2**64 - 1]):
        check(tokens, 1)
