"""vLLM's KV-event wire format: the structs, both payload encodings, the ZMQ frames, replay.

The structs are declared as vLLM declares them (tags, field order, options, later optional
fields appended), so ``encode_batch`` writes vLLM's exact bytes; ``decode_batch`` reads both
the map and the array encodings and ignores fields and event types it does not know. Only the
Python names differ (``VllmStored``...); ``VllmRemoved`` lists one entry per evicted physical
block.

See docs/architecture.md#event-forms-and-wire-formats.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from kvmesh.contract import TIERS as KV_TIERS

try:
    from kvmesh._chain import msgpack_len as _msgpack_len
except ImportError:  # not built: no packed ids (``decode_batch(packed=True)`` decodes them)
    _msgpack_len = None

ExternalBlockHash = bytes | int
END_SEQ = (-1).to_bytes(8, "big", signed=True)
REPLAY_BUFFER = 10_000  # vLLM's default ``buffer_steps``
MEDIUMS = dict(zip(KV_TIERS, ("GPU", "CPU", "STORAGE"), strict=True))  # vLLM's, per tier
TIERS: dict[str | None, str] = {None: KV_TIERS[0], **{m: t for t, m in MEDIUMS.items()}}


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the three event types. Each names its tag (``"type"`` on the wire) explicitly:
    vLLM's class name, so the Python names (``Vllm*``, by origin) never reach the bytes."""


class VllmStored(KVCacheEvent, tag="BlockStored"):
    """Full blocks cached, in chain order; ``token_ids`` covers all of them;
    ``parent_block_hash`` is the parent of the first (``None``: the chain starts at block 0);
    ``extra_keys`` has one entry per block (``None``: none)."""
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None  # deprecated by vLLM in favour of lora_name
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


class VllmPackedStored(VllmStored, tag="BlockStored"):
    """``VllmStored`` whose ``token_ids`` stay the msgpack bytes of the array (a zero-copy
    slice of the payload), checked to be an array of ints: what ``decode_batch(packed=True)``
    gives, for a consumer that hashes them in C (``kvmesh.hashing.chain_hashes`` takes it)
    rather than building a Python int per id. ``ids_len``/``ids_list`` read either kind."""
    token_ids: msgspec.Raw  # type: ignore[assignment]


class VllmRemoved(KVCacheEvent, tag="BlockRemoved"):
    """One entry per evicted physical block: a hash held twice is removed twice."""
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class VllmCleared(KVCacheEvent, tag="AllBlocksCleared"):
    pass


class KVEventBatch(EventBatch):
    events: list[VllmStored | VllmRemoved | VllmCleared]


class _PackedBatch(EventBatch):
    events: list[VllmPackedStored | VllmRemoved | VllmCleared]


VllmEvent = VllmStored | VllmRemoved | VllmCleared
EVENT_TYPES: dict[str, type[VllmEvent]] = {  # by wire tag
    cls.__struct_config__.tag: cls for cls in (VllmStored, VllmRemoved, VllmCleared)}

# Fields declared without a default that older releases did not publish (``medium`` and
# ``lora_name`` came after the first releases with events); absent means None.
_ABSENT_IS_NONE: dict[type, tuple[str, ...]] = {
    VllmStored: ("parent_block_hash", "lora_id", "medium", "lora_name"),
    VllmRemoved: ("medium",),
}
_encoder = msgspec.msgpack.Encoder()
_typed = msgspec.msgpack.Decoder(KVEventBatch)
_packed = msgspec.msgpack.Decoder(_PackedBatch)
_untyped = msgspec.msgpack.Decoder()


def encode_batch(batch: KVEventBatch) -> bytes:
    """The payload vLLM would publish for ``batch`` (current map encoding)."""
    return _encoder.encode(batch)


class MalformedBatch(ValueError):
    """A payload that is not a KV event batch, whatever made it fail: msgspec's errors, and
    also what crafted bytes raise besides them (``RecursionError`` for arrays nested
    thousands deep, ``MemoryError``, ``OverflowError``, ...). The cause is chained."""


def decode_batch(payload: bytes, packed: bool = False) -> KVEventBatch:
    """A payload in any known encoding, as the current structs.

    Unknown fields and unknown event types are dropped. Raises ``MalformedBatch`` (a
    ``ValueError``) for a payload that is not a batch, and only that: bytes from an engine's
    socket are anyone's, so no exception of theirs may pass for a bug of the caller's.

    ``packed``: stored events of the current encoding come as ``VllmPackedStored`` where
    ``kvmesh._chain`` is built (as ``VllmStored`` otherwise, and in the older encodings);
    the same batches decode, and the same ones raise.
    """
    try:
        return _decode(payload, packed)
    except MalformedBatch:
        raise
    except Exception as e:  # noqa: BLE001 (the contract: every failure is a malformed batch)
        raise MalformedBatch(f"not a KV event batch ({type(e).__name__}: {e!s:.200})") from e


def _decode(payload: bytes, packed: bool) -> KVEventBatch:
    if packed and _msgpack_len is not None:
        try:
            batch = _packed.decode(payload)
        except msgspec.ValidationError:
            return _decode(payload, False)
        # a Raw takes any value: where one is not an int array, the typed decode's verdict
        if None not in map(_msgpack_len, [ev.token_ids for ev in batch.events
                                          if ev.__class__ is VllmPackedStored]):
            return batch  # type: ignore[return-value]
        return _decode(payload, False)
    try:
        return _typed.decode(payload)  # the current encoding: one C call
    except msgspec.ValidationError:
        pass
    raw = _untyped.decode(payload)
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list) and 2 <= len(raw) <= 3:
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) == 3 else None
    else:
        raise msgspec.ValidationError("a KV event batch is [ts, events, data_parallel_rank]")
    if not isinstance(events, list):
        raise msgspec.ValidationError("a KV event batch's events must be an array")
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise msgspec.ValidationError("a KV event batch's ts must be a number")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
        raise msgspec.ValidationError("a KV event batch's data_parallel_rank must be an int")
    out = [ev for ev in (_event(e) for e in events) if ev is not None]
    return KVEventBatch(ts=float(ts), events=out, data_parallel_rank=rank)


def _event(raw: Any) -> VllmEvent | None:
    """One event in the map or the array encoding; ``None`` for a type we do not know."""
    if isinstance(raw, dict):
        cls = EVENT_TYPES.get(raw.get("type"))  # type: ignore[arg-type]
        fields = raw
    elif isinstance(raw, list) and raw and isinstance(raw[0], str):
        cls = EVENT_TYPES.get(raw[0])
        if cls is None:
            return None
        # array_like: fields in declaration order; later releases append, so zip stops early
        fields = dict(zip(cls.__struct_fields__, raw[1:], strict=False))
    else:
        raise msgspec.ValidationError(f"a KV event must be a map or an array, got {raw!r:.80}")
    if cls is None:
        return None
    known = {k: v for k, v in fields.items() if k in cls.__struct_fields__}
    for name in _ABSENT_IS_NONE.get(cls, ()):
        known.setdefault(name, None)  # older releases did not have the field yet
    return msgspec.convert(known, cls)


def ids_len(ids: list[int] | msgspec.Raw) -> int:
    """How many token ids a stored event has, packed or not."""
    return _msgpack_len(ids, False) if ids.__class__ is msgspec.Raw else len(ids)


def ids_list(ids: list[int] | msgspec.Raw) -> list[int]:
    """A stored event's token ids as ints, packed or not."""
    return msgspec.msgpack.decode(ids) if ids.__class__ is msgspec.Raw else ids


# --- block hashes -------------------------------------------------------------------------

def external_hash(digest: bytes, as_int: bool = True) -> ExternalBlockHash:
    """A digest as vLLM publishes it: the low 8 bytes big-endian as an int, or the bytes."""
    return int.from_bytes(digest[-8:], "big") if as_int else bytes(digest)


def hash_bytes(h: ExternalBlockHash) -> bytes:
    """A published hash as bytes: an int as its 8 bytes big-endian, bytes as they are."""
    return h.to_bytes(8, "big") if isinstance(h, int) else bytes(h)


def tier_of(medium: str | None) -> str | None:
    """kvmesh's tier name for a ``medium`` (``None`` is GPU); ``None`` for an unknown one."""
    return TIERS.get(medium)


# --- frames -------------------------------------------------------------------------------

def pack_message(topic: bytes, seq: int, payload: bytes) -> list[bytes]:
    """The three frames of one published batch."""
    return [topic, seq.to_bytes(8, "big"), payload]


def unpack_message(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """(topic, seq, payload) of a published message; ``ValueError`` if malformed."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise ValueError(f"a KV event message is [topic, seq(8), payload], got "
                         f"{len(frames)} frames")
    return bytes(frames[0]), int.from_bytes(frames[1], "big"), bytes(frames[2])


def replay_request(start_seq: int) -> list[bytes]:
    """What a DEALER sends to ask for every buffered batch with ``seq >= start_seq``."""
    return [b"", start_seq.to_bytes(8, "big")]


def replay_reply(topic: bytes, seq: int, payload: bytes) -> list[bytes]:
    """One replayed batch as a DEALER receives it (the ROUTER prepends the identity)."""
    return [b"", topic, seq.to_bytes(8, "big"), payload]


def replay_end() -> list[bytes]:
    """The end-of-replay marker as a DEALER receives it."""
    return [b"", b"", END_SEQ, b""]


def parse_replay_reply(frames: Sequence[bytes]) -> tuple[int, bytes] | None:
    """(seq, payload) of one replayed batch, ``None`` for the end marker.

    Both framings: ``[b"", topic, seq, payload]`` and the older ``[b"", seq, payload]``.
    ``ValueError`` if malformed."""
    if len(frames) == 4 and frames[0] == b"":
        seq_frame, payload = frames[2], frames[3]
    elif len(frames) == 3 and frames[0] == b"":
        seq_frame, payload = frames[1], frames[2]
    else:
        raise ValueError(f"a replay reply is [b'', topic, seq, payload], got {len(frames)} "
                         "frames")
    if len(seq_frame) != 8:
        raise ValueError(f"replay seq frame is {len(seq_frame)} bytes, not 8")
    if seq_frame == END_SEQ:
        return None
    return int.from_bytes(seq_frame, "big"), bytes(payload)
