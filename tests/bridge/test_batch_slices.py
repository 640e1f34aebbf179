"""A large batch applied in slices (``bridge.batch_slices``) gives the index what applying it
whole gives; past ``max_blocks`` a batch is malformed and changes nothing."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge import caps
from bridge.batch_slices import slices, units
from bridge.engine_state import EngineState
from kvmesh.events import vllm as ve
from tests.bridge.index_view import IndexView
from tests.bridge.test_engine_state_bulk import BS, LORAS, Engine, engines, ops


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), size=st.integers(1, 5))
def test_sliced_batches_index_what_whole_ones_do(monkeypatch, data, size) -> None:
    """The bulk test's random engines (salts, LoRA, multimodal, unroutable keys, aliases,
    repeated hashes, every tier, clears), each batch cut into slices of ``size`` blocks."""
    chains, loras = data.draw(engines())
    whole = EngineState(block_size=BS, loras=LORAS)
    cut = EngineState(block_size=BS, loras=LORAS)
    a, b, engine = IndexView(), IndexView(), Engine(chains, loras)
    for seq, batch_ops in enumerate(data.draw(ops(len(chains), dups=True))):
        events = [e for op in batch_ops for e in engine.events(op)]
        payload = ve.encode_batch(ve.KVEventBatch(ts=1.0, events=events))
        a.apply(whole.ingest(seq, payload))
        monkeypatch.setattr(caps, "SLICE_BYTES", 0)  # every payload is "large"
        monkeypatch.setattr(caps, "SLICE_BLOCKS", size)
        parts = list(cut.ingest_parts(seq, payload))
        monkeypatch.undo()
        for part in parts:
            b.apply(part)  # in order, never stored twice, never a removal of what is not held
        assert a.held == b.held
        assert a.cleared <= b.cleared  # (a slice may clear where the batch cleared once)
        assert whole.indexed_blocks == cut.indexed_blocks
        assert cut.expected == whole.expected == seq + 1
        for chain in {h for h, _ in a.held}:
            assert whole.held(chain) == cut.held(chain)


def test_slices_bound_the_work_and_cut_large_events() -> None:
    tokens = list(range(10 * BS))
    big = ve.VllmStored(block_hashes=list(range(1, 11)), parent_block_hash=None,
                        token_ids=tokens, block_size=BS, lora_id=None, medium=None,
                        lora_name=None, extra_keys=[("s",), *[None] * 9])
    events = [big, ve.VllmRemoved(block_hashes=list(range(1, 8)), medium=None),
              ve.VllmCleared()]
    parts = list(slices(events, 3, BS))
    assert all(units(p) <= 3 for p in parts)
    assert [units(p) for p in parts] == [3, 3, 3, 1, 3, 3, 2] and units(events) == 18
    pieces = [e for p in parts for e in p if isinstance(e, ve.VllmStored)]
    assert [e.block_hashes for e in pieces] == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]]
    assert [e.parent_block_hash for e in pieces] == [None, 3, 6, 9]
    assert [e.token_ids for e in pieces] == [tokens[0:12], tokens[12:24], tokens[24:36],
                                             tokens[36:40]]
    assert pieces[0].extra_keys == [("s",), None, None] and pieces[3].extra_keys == [None]


def test_a_batch_past_max_blocks_is_malformed_and_changes_nothing(monkeypatch) -> None:
    monkeypatch.setattr(caps, "SLICE_BYTES", 0)
    state = EngineState(block_size=BS, max_blocks=100)
    ok = ve.encode_batch(ve.KVEventBatch(ts=1.0, events=[ve.VllmStored(
        block_hashes=[1], parent_block_hash=None, token_ids=[1] * BS, block_size=BS,
        lora_id=None, medium=None, lora_name=None)]))
    state.ingest(0, ok)
    held = state.indexed_blocks
    over = ve.encode_batch(ve.KVEventBatch(ts=1.0, events=[
        ve.VllmRemoved(block_hashes=[1] + list(range(1000, 1100)), medium=None)]))
    with pytest.raises(ve.MalformedBatch, match="101 blocks"):
        state.ingest(1, over)
    assert state.indexed_blocks == held and state.expected == 1
    # as many events without blocks count as much
    with pytest.raises(ve.MalformedBatch):
        state.ingest(1, ve.encode_batch(ve.KVEventBatch(
            ts=1.0, events=[ve.VllmCleared()] * 101)))
    assert state.indexed_blocks == held


def test_default_caps_take_a_ten_megabyte_batch() -> None:
    """The caps leave room for what the liveness test sends: a 10 MB batch of stores."""
    assert caps.MAX_MESSAGE_BYTES > 10_000_000
    per_block = len(ve.encode_batch(ve.KVEventBatch(ts=1.0, events=[ve.VllmStored(
        block_hashes=[2**63 + 5], parent_block_hash=None, token_ids=[60_000] * 16,
        block_size=16, lora_id=None, medium=None, lora_name=None)])))
    assert caps.MAX_BATCH_BLOCKS * per_block > 10_000_000
