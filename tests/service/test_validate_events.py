"""``validate.events`` builds its KvEvent and Removed objects by setting their slots directly
(a frozen dataclass's __init__ is slow): they must be the very objects the constructors
build, and the fast path must refuse to run once those classes change shape."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmesh.v1 import index_pb2 as pb
from service import validate
from service.config import ServiceConfig
from service.index.base import Cleared, KvEvent, Removed, Stored

hashes = st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=4)
tiers = st.sampled_from((0, 1, 2, 3))
ops = st.one_of(
    st.tuples(st.just("stored"), hashes, st.sampled_from((b"", b"p" * 32)), tiers),
    st.tuples(st.just("removed"), st.lists(st.binary(min_size=32, max_size=32), max_size=4),
              st.just(b""), tiers),
    st.tuples(st.just("cleared"), st.just([]), st.just(b""), st.just(0)),
)


def _msg(seq: int, kind: str, hs: list[bytes], parent: bytes, tier: int) -> pb.KvEvent:
    if kind == "stored":
        return pb.KvEvent(seq=seq, stored=pb.BlockStored(block_hashes=hs, parent_hash=parent,
                                                         tier=tier))
    if kind == "removed":
        return pb.KvEvent(seq=seq, removed=pb.BlockRemoved(block_hashes=hs, tier=tier))
    return pb.KvEvent(seq=seq, cleared=pb.AllBlocksCleared())


def _expected(seq: int, kind: str, hs: list[bytes], parent: bytes, tier: int) -> KvEvent:
    op = (Stored(tuple(hs), parent, tier or 1) if kind == "stored"
          else Removed(tuple(hs), tier) if kind == "removed" else Cleared())
    return KvEvent(seq, op)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(1, 2**40), st.lists(ops, min_size=1, max_size=8))
def test_events_equal_constructed(start: int, batch: list) -> None:
    msgs = [pb.KvEvent.FromString(_msg(start + i, *op).SerializeToString())
            for i, op in enumerate(batch)]
    got = validate.events(msgs, 32, ServiceConfig())
    want = [_expected(start + i, *op) for i, op in enumerate(batch)]
    assert got == want
    for g, w in zip(got, want, strict=True):
        assert type(g) is KvEvent and type(g.op) is type(w.op)
        assert hash(g) == hash(w) and repr(g) == repr(w)
        with pytest.raises(dataclasses.FrozenInstanceError):
            g.op = w.op  # type: ignore[misc]


def test_fast_path_refuses_a_changed_class() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Wider:
        hashes: tuple[bytes, ...]
        tier: int = 0
        extra: int = 0

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        hashes: tuple[bytes, ...]
        tier: int = 0

        def __post_init__(self) -> None:
            pass

    for cls in (Wider, Checked):
        with pytest.raises(TypeError, match="fast path"):
            validate._slot_setters(cls, ("hashes", "tier"))
