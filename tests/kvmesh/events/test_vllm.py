"""vLLM's KV-event wire format: golden payloads from structs declared as vLLM declares them.

The producer structs here are declared independently of ``kvmesh.events.vllm`` (as vLLM's
``vllm/distributed/kv_events.py`` declares them in two generations: tagged maps, and the older
``array_like`` events), so a change to the module's structs that vLLM did not make fails here.
"""
from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import pytest

from kvmesh.events import vllm as ve

# --- the producer: current releases (events are tagged maps) -------------------------------


class Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class Event(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(Event):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[int] | None = None


class BlockRemoved(Event):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(Event):
    pass


class FutureStored(Event, tag="BlockStored"):
    """A later release: one more field than kvmesh knows."""
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    brand_new_field: dict[str, int] | None = None


class FutureEvent(Event):
    """A later release: an event type kvmesh does not know."""
    detail: str


# --- the producer: older releases (array_like events, commit b4e69e0) ----------------------


class OldBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class OldStored(OldEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class OldRemoved(OldEvent, tag="BlockRemoved"):
    block_hashes: list[int]


class OldCleared(OldEvent, tag="AllBlocksCleared"):
    pass


_enc = msgspec.msgpack.Encoder()
DIGEST_A = hashlib.sha256(b"a").digest()
DIGEST_B = hashlib.sha256(b"b").digest()


def _ints(*digests: bytes) -> list[int]:
    # vLLM's maybe_convert_block_hash, written out: the low 64 bits of the big-endian digest
    return [int.from_bytes(d, "big") & ((1 << 64) - 1) for d in digests]


@pytest.mark.parametrize("as_int", [True, False], ids=["int-hashes", "bytes-hashes"])
def test_current_map_encoding_both_hash_forms(as_int: bool) -> None:
    hashes = _ints(DIGEST_A, DIGEST_B) if as_int else [DIGEST_A, DIGEST_B]
    payload = _enc.encode(Batch(ts=12.5, data_parallel_rank=1, events=[
        BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=list(range(8)),
                    block_size=4, lora_id=None, medium="CPU", lora_name="ad",
                    extra_keys=[("ad", "salt"), ("ad", ("img", -2))], group_idx=0),
        BlockRemoved(block_hashes=hashes[1:], medium="STORAGE"),
        AllBlocksCleared()]))
    batch = ve.decode_batch(payload)
    assert batch.ts == 12.5 and batch.data_parallel_rank == 1
    stored, removed, cleared = batch.events
    assert isinstance(stored, ve.VllmStored) and stored.block_hashes == hashes
    assert stored.token_ids == list(range(8)) and stored.block_size == 4
    assert stored.lora_name == "ad" and stored.group_idx == 0
    assert [list(k) for k in stored.extra_keys] == [["ad", "salt"], ["ad", ["img", -2]]]
    assert ve.tier_of(stored.medium) == "cpu"
    assert isinstance(removed, ve.VllmRemoved) and removed.block_hashes == hashes[1:]
    assert ve.tier_of(removed.medium) == "disk"
    assert isinstance(cleared, ve.VllmCleared)
    assert [ve.hash_bytes(h)[-8:] for h in stored.block_hashes] == [DIGEST_A[-8:],
                                                                     DIGEST_B[-8:]]


def test_encoder_writes_exactly_what_vllm_writes() -> None:
    args = dict(block_hashes=_ints(DIGEST_A), parent_block_hash=7, token_ids=[1, 2],
                block_size=2, lora_id=None, medium=None, lora_name=None,
                extra_keys=[None], locality="LOCAL", session_id="s")
    theirs = _enc.encode(Batch(ts=3.0, events=[BlockStored(**args),
                                               BlockRemoved(block_hashes=[7], medium="GPU"),
                                               AllBlocksCleared()], data_parallel_rank=0))
    ours = ve.encode_batch(ve.KVEventBatch(ts=3.0, events=[
        ve.VllmStored(**args), ve.VllmRemoved(block_hashes=[7], medium="GPU"),
        ve.VllmCleared()], data_parallel_rank=0))
    assert ours == theirs


def test_older_array_encoding() -> None:
    payload = _enc.encode(OldBatch(ts=1.0, events=[
        OldStored(block_hashes=_ints(DIGEST_A, DIGEST_B), parent_block_hash=5,
                  token_ids=[9] * 32, block_size=16, lora_id=None),
        OldRemoved(block_hashes=_ints(DIGEST_B)), OldCleared()]))
    assert msgspec.msgpack.decode(payload)[1][0][0] == "BlockStored"  # really the old form
    batch = ve.decode_batch(payload)
    assert batch.data_parallel_rank is None
    stored, removed, cleared = batch.events
    assert isinstance(stored, ve.VllmStored)
    assert stored.block_hashes == _ints(DIGEST_A, DIGEST_B) and stored.parent_block_hash == 5
    assert stored.block_size == 16 and stored.medium is None and stored.lora_name is None
    assert ve.tier_of(stored.medium) == "gpu"
    assert isinstance(removed, ve.VllmRemoved) and removed.block_hashes == _ints(DIGEST_B)
    assert isinstance(cleared, ve.VllmCleared)


def test_array_events_with_bytes_hashes_and_later_fields() -> None:
    # an array-encoded event with more fields than the first releases, bytes hashes
    raw = [2.0, [["BlockStored", [DIGEST_A], None, [1, 2], 2, None, "CPU", None, [None], 3],
                 ["BlockRemoved", [DIGEST_A], "CPU", 3]], 0]
    batch = ve.decode_batch(msgspec.msgpack.encode(raw))
    stored, removed = batch.events
    assert stored.block_hashes == [DIGEST_A] and stored.medium == "CPU"
    assert stored.group_idx == 3 and removed.group_idx == 3


def test_unknown_fields_and_event_types_are_ignored() -> None:
    payload = _enc.encode(Batch(ts=1.0, events=[
        FutureEvent(detail="x"),
        FutureStored(block_hashes=[1], parent_block_hash=None, token_ids=[1], block_size=1,
                     lora_id=None, medium=None, lora_name=None, brand_new_field={"a": 1}),
        BlockRemoved(block_hashes=[1], medium=None)], data_parallel_rank=0))
    batch = ve.decode_batch(payload)
    assert [type(e) for e in batch.events] == [ve.VllmStored, ve.VllmRemoved]
    assert batch.events[0].block_hashes == [1]
    old_unknown = msgspec.msgpack.encode([1.0, [["Teleported", 1, 2], ["AllBlocksCleared"]]])
    assert [type(e) for e in ve.decode_batch(old_unknown).events] == [ve.VllmCleared]


def test_batch_encoded_as_a_map_and_trailing_rank_omitted() -> None:
    ev = {"type": "BlockRemoved", "block_hashes": [3], "medium": None}
    as_map = msgspec.msgpack.encode({"ts": 1.0, "events": [ev], "data_parallel_rank": 2})
    assert ve.decode_batch(as_map).data_parallel_rank == 2
    two = msgspec.msgpack.encode([1.0, [ev]])
    assert ve.decode_batch(two).data_parallel_rank is None


@pytest.mark.parametrize("payload", [
    b"\xc1", msgspec.msgpack.encode("text"), msgspec.msgpack.encode([1.0]),
    msgspec.msgpack.encode(["x", []]), msgspec.msgpack.encode([1.0, [5]]),
    msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved"}]]),
    msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": "no"}]]),
])
@pytest.mark.parametrize("packed", [False, True])
def test_garbage_is_a_value_error(payload: bytes, packed: bool) -> None:
    with pytest.raises(ValueError):
        ve.decode_batch(payload, packed)



_TS = b"\xcb\x3f\xf0" + b"\x00" * 6  # the float 1.0
_DEEP = 3000  # past the interpreter's recursion limit: msgspec raised RecursionError


@pytest.mark.parametrize("payload", [
    b"\x93" + _TS + b"\x91" * _DEEP + b"\x90\x00",          # events nested 3,000 deep
    b"\x91" * _DEEP + b"\x90",                               # the batch itself
    b"\x93" + _TS + b"\x91" + b"\x81\xa1k" * _DEEP + b"\xc0\x00",  # maps in an event
    b"\x93" + _TS + b"\x91\x82\xa4type\xabBlockStored\xaaextra_keys"
    + b"\x91" * _DEEP + b"\x90\x00",                         # a stored event's extra keys
], ids=["events", "batch", "maps", "extra_keys"])
@pytest.mark.parametrize("packed", [False, True])
def test_any_decode_failure_is_a_malformed_batch(payload: bytes, packed: bool) -> None:
    """A decode failure of any kind is malformed: whatever crafted bytes make the decoder raise
    (here RecursionError,
    which escaped the bridge's ``except ValueError`` and ended the process) is
    ``MalformedBatch``, a ``ValueError``, with the cause chained."""
    with pytest.raises(ve.MalformedBatch) as err:
        ve.decode_batch(payload, packed)
    assert isinstance(err.value, ValueError)
    assert isinstance(err.value.__cause__, RecursionError)

# A batch as vLLM 0.3x puts it on the wire, byte by byte. Never regenerate this from the
# encoder: it pins the format independently of the code.
PINNED = bytes.fromhex(
    "93"                                    # KVEventBatch: array of 3
    "cb3ff8000000000000"                    # ts = 1.5 (float 64)
    "93"                                    # events: array of 3
    "de0008"                                # BlockStored: map16 (15 fields + tag), 8 present
    "a474797065" "ab426c6f636b53746f726564"  # "type": "BlockStored"
    "ac626c6f636b5f686173686573" "91cf0102030405060708"  # "block_hashes": [uint64]
    "b1706172656e745f626c6f636b5f68617368" "c0"        # "parent_block_hash": nil
    "a9746f6b656e5f696473" "920102"                    # "token_ids": [1, 2]
    "aa626c6f636b5f73697a65" "02"                       # "block_size": 2
    "a76c6f72615f6964" "c0"                             # "lora_id": nil
    "a66d656469756d" "a3475055"                         # "medium": "GPU"
    "a96c6f72615f6e616d65" "c0"                         # "lora_name": nil
    "83"                                    # BlockRemoved: fixmap of 3
    "a474797065" "ac426c6f636b52656d6f766564"          # "type": "BlockRemoved"
    "ac626c6f636b5f686173686573" "91cf0102030405060708"  # "block_hashes": [uint64]
    "a66d656469756d" "c0"                               # "medium": nil
    "81" "a474797065" "b0416c6c426c6f636b73436c6561726564"  # {"type": "AllBlocksCleared"}
    "00"                                    # data_parallel_rank = 0
)


def test_pinned_bytes() -> None:
    batch = ve.decode_batch(PINNED)
    stored, removed, cleared = batch.events
    assert batch.ts == 1.5 and batch.data_parallel_rank == 0
    assert stored.block_hashes == [0x0102030405060708] and stored.token_ids == [1, 2]
    assert ve.hash_bytes(stored.block_hashes[0]) == bytes(range(1, 9))
    assert removed.block_hashes == stored.block_hashes and removed.medium is None
    assert isinstance(cleared, ve.VllmCleared)
    assert ve.encode_batch(batch) == PINNED


def test_tags_are_vllms_class_names_whatever_ours_are_called() -> None:
    """The Python names say the origin (``Vllm*``); the wire tags stay vLLM's class names."""
    tags = {cls: cls.__struct_config__.tag for cls in (
        ve.VllmStored, ve.VllmPackedStored, ve.VllmRemoved, ve.VllmCleared)}
    assert tags == {ve.VllmStored: "BlockStored", ve.VllmPackedStored: "BlockStored",
                    ve.VllmRemoved: "BlockRemoved", ve.VllmCleared: "AllBlocksCleared"}
    assert {cls.__struct_config__.tag: cls for cls in (BlockStored, BlockRemoved,
            AllBlocksCleared)}.keys() == ve.EVENT_TYPES.keys()


def test_hash_forms() -> None:
    assert ve.external_hash(DIGEST_A) == _ints(DIGEST_A)[0]
    assert ve.external_hash(DIGEST_A, as_int=False) == DIGEST_A
    assert ve.hash_bytes(ve.external_hash(DIGEST_A)) == DIGEST_A[-8:]
    assert ve.hash_bytes(DIGEST_B) == DIGEST_B
    assert ve.hash_bytes((1 << 64) - 1) == b"\xff" * 8


def test_mediums() -> None:
    assert [ve.tier_of(m) for m in (None, "GPU", "CPU", "STORAGE", "NVME")] == [
        "gpu", "gpu", "cpu", "disk", None]
    assert {ve.tier_of(m) for m in ve.MEDIUMS.values()} == set(ve.MEDIUMS)


def test_frames() -> None:
    frames = ve.pack_message(b"kv", 258, b"p")
    assert frames == [b"kv", b"\x00" * 6 + b"\x01\x02", b"p"]
    assert ve.unpack_message(frames) == (b"kv", 258, b"p")
    with pytest.raises(ValueError):
        ve.unpack_message([b"kv", b"\x01", b"p"])
    with pytest.raises(ValueError):
        ve.unpack_message([b"kv", b"p"])
    assert ve.replay_request(5) == [b"", b"\x00" * 7 + b"\x05"]
    assert ve.parse_replay_reply(ve.replay_reply(b"t", 9, b"x")) == (9, b"x")
    assert ve.parse_replay_reply([b"", (9).to_bytes(8, "big"), b"x"]) == (9, b"x")  # older
    assert ve.replay_end() == [b"", b"", b"\xff" * 8, b""]
    assert ve.parse_replay_reply(ve.replay_end()) is None
    assert ve.parse_replay_reply([b"", b"\xff" * 8, b""]) is None  # older end marker
    for bad in ([b"x", b"t", b"\x00" * 8, b""], [b""], [b"", b"t", b"\x00", b"p"]):
        with pytest.raises(ValueError):
            ve.parse_replay_reply(bad)


# --- packed token ids (the bridge's decode) ------------------------------------------------

needs_c = pytest.mark.skipif(ve._msgpack_len is None, reason="kvmesh._chain is not built")


def _fields(ev: Any) -> dict:
    out = {f: getattr(ev, f) for f in ev.__struct_fields__}
    out["token_ids"] = ve.ids_list(out["token_ids"])
    return out


@needs_c
def test_packed_ids_are_the_payloads_bytes_and_the_rest_is_the_same() -> None:
    stored = BlockStored(block_hashes=[1, 2], parent_block_hash=None,
                         token_ids=[0, 127, 128, 2**16, 2**32, 2**64 - 1, -1, -2**63],
                         block_size=4, lora_id=None, medium="CPU", lora_name="ad",
                         extra_keys=[("ad", "salt"), None], group_idx=0)
    for payload in (PINNED, _enc.encode(Batch(ts=2.0, events=[stored, AllBlocksCleared()]))):
        lists, packed = ve.decode_batch(payload), ve.decode_batch(payload, packed=True)
        assert (packed.ts, packed.data_parallel_rank) == (lists.ts, lists.data_parallel_rank)
        ev = packed.events[0]
        assert type(ev) is ve.VllmPackedStored and isinstance(ev, ve.VllmStored)
        assert isinstance(ev.token_ids, msgspec.Raw)
        assert bytes(ev.token_ids) in payload  # a slice of it, not a re-encoding
        assert ve.ids_len(ev.token_ids) == len(lists.events[0].token_ids)
        assert _fields(ev) == _fields(lists.events[0])
        assert packed.events[1:] == lists.events[1:]
    assert ve.encode_batch(ve.decode_batch(PINNED, packed=True)) == PINNED


def test_older_encodings_decode_packed_as_lists() -> None:
    raw = [2.0, [["BlockStored", [DIGEST_A], None, [1, 2], 2, None, "CPU"]], 0]
    stored = ve.decode_batch(msgspec.msgpack.encode(raw), packed=True).events[0]
    assert type(stored) is ve.VllmStored and stored.token_ids == [1, 2]
    assert ve.ids_len(stored.token_ids) == 2 and ve.ids_list(stored.token_ids) == [1, 2]


@pytest.mark.parametrize("token_ids", [
    ["x"], [1.5], None, "abc", [[1]], [True], [1, None], {}, [], [-1, 2**64 - 1, -2**63],
    b"\x01\x02"])
@pytest.mark.parametrize("older", [False, True])
def test_packed_decodes_and_refuses_what_lists_do(token_ids, older: bool) -> None:
    """A Raw takes any value; packed must still refuse (and accept) what list[int] does."""
    if older:
        ev = ["BlockStored", [5], None, token_ids, 2, None, None, None]
    else:
        ev = {"type": "BlockStored", "block_hashes": [5], "parent_block_hash": None,
              "token_ids": token_ids, "block_size": 2, "lora_id": None, "medium": None,
              "lora_name": None}
    payload = msgspec.msgpack.encode([1.0, [ev, {"type": "AllBlocksCleared"}], 0])

    def outcome(packed: bool) -> Any:
        try:
            return [_fields(e) if isinstance(e, ve.VllmStored) else e
                    for e in ve.decode_batch(payload, packed).events]
        except ValueError as e:
            return type(e)
    assert outcome(True) == outcome(False)
