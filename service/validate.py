"""Request validation: every RPC input is checked here BEFORE anything touches the index.

Each function returns plain values or raises :class:`RequestError` (a gRPC status code and a
message naming the field and the limit). Codes: INVALID_ARGUMENT for malformed input,
RESOURCE_EXHAUSTED for input over a configured size limit. Unknown workers (NOT_FOUND) and the
root-hash check (FAILED_PRECONDITION) need state and live in the servicer.
"""
from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from kvmesh.contract import ALGOS, DIGEST_BYTES
from kvmesh.hashing import lora_key
from kvmesh.quota import DEFAULT_TENANT, check_tenant
from kvmesh.v1 import index_pb2 as pb
from service.config import POLICIES, ServiceConfig
from service.index.base import (
    IndexCleared,
    IndexEvent,
    IndexRemoved,
    IndexStored,
    WorkerLoad,
)

INVALID = grpc.StatusCode.INVALID_ARGUMENT
TOO_BIG = grpc.StatusCode.RESOURCE_EXHAUSTED
WORKER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}")
# host:port, the host bracketed when IPv6; the port ASCII digits (str.isdigit takes "²")
_ADDRESS = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]{2,45})\]|(?P<host>[^\[\]:]{1,253})):"
                      r"(?P<port>[0-9]{1,5})", re.ASCII)
# RFC 1123 hostname: dot-separated labels of letters, digits and inner hyphens, <= 63 each
_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(?:\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*",
                       re.ASCII)
_DOTTED = re.compile(r"[0-9.]+")
MAX_SEQ = 2**53  # seqs travel through Lua numbers (doubles)
_U32_MAX = 2**32 - 1
_TIERS = frozenset(pb.Tier.values())


class RequestError(Exception):
    """A request rejected with ``code`` and ``message``; nothing was changed."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def worker_id(value: str) -> str:
    if not WORKER_ID.fullmatch(value):
        raise RequestError(INVALID, f"worker_id {value[:140]!r} is invalid: 1-128 characters "
                           "of letters, digits and . _ : @ / -, starting with a letter or digit")
    return value


_COSTS = ("prefill_us_per_token", "onboard_us_per_block_cpu", "onboard_us_per_block_disk",
          "fetch_us_per_block", "fetch_us_per_call")


def load(msg: pb.WorkerLoad) -> WorkerLoad:
    """The load of a Register/Heartbeat; its measured costs must be finite and >= 0 (0:
    not measured), else the cost model could credit a match by NaN."""
    if msg.total_blocks and msg.free_blocks > msg.total_blocks:
        raise RequestError(INVALID, f"load.free_blocks ({msg.free_blocks}) exceeds "
                           f"load.total_blocks ({msg.total_blocks})")
    if msg.free_empty_blocks > msg.free_blocks:
        raise RequestError(INVALID, f"load.free_empty_blocks ({msg.free_empty_blocks}) "
                           f"exceeds load.free_blocks ({msg.free_blocks})")
    for name in _COSTS:
        value = getattr(msg, name)
        if not (math.isfinite(value) and value >= 0.0):
            raise RequestError(INVALID, f"load.{name} ({value}) must be a finite number of "
                               "microseconds >= 0 (0: not measured)")
    return WorkerLoad(msg.running, msg.waiting, msg.queued_prefill_tokens, msg.free_blocks,
                      msg.total_blocks, msg.decode_tokens, msg.prefill_us_per_token,
                      msg.onboard_us_per_block_cpu, msg.onboard_us_per_block_disk,
                      msg.tier_blocks, msg.free_empty_blocks, msg.fetch_us_per_block,
                      msg.fetch_us_per_call, msg.peer_fetch)


def address(value: str) -> str:
    """A worker's ``host:port``: the host an RFC 1123 hostname, an IPv4 address or a
    bracketed IPv6 one (``[::1]:50051``), the port 1-65535; an HTTP engine's is the same
    after ``http://`` or ``https://`` (``kvmesh.rpc.engine_address``). Anything else (newlines,
    spaces, ``@``, a path) is refused: addresses reach logs, clients and gRPC targets."""
    bare = value.partition("://")[2] if value.startswith(("http://", "https://")) else value
    m = _ADDRESS.fullmatch(bare) if len(value) <= 256 else None
    ok = m is not None and 0 < int(m["port"]) < 65536
    if ok and m["v6"] is not None:
        try:
            ipaddress.IPv6Address(m["v6"])
        except ValueError:
            ok = False
    elif ok:  # all digits and dots: an IPv4 address, not a hostname ("1.2.3.999")
        host = m["host"]
        ok = _is_ipv4(host) if _DOTTED.fullmatch(host) else bool(_HOSTNAME.fullmatch(host))
    if not ok:
        raise RequestError(INVALID, f"address {value[:64]!r} must be host:port with a "
                           "hostname, an IPv4 address or a bracketed IPv6 address, and a "
                           "port in [1, 65535]")
    return value


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def register(req: pb.RegisterWorkerRequest) -> None:
    """Shape checks of RegisterWorker (the root hash VALUE is checked by the servicer)."""
    worker_id(req.worker_id)
    address(req.address)
    if not req.model or len(req.model) > 256:
        raise RequestError(INVALID, "model must be 1-256 characters")
    if not 1 <= req.block_size <= 65536:
        raise RequestError(INVALID, f"block_size {req.block_size} must be in [1, 65536]")
    if req.hash_algo not in ALGOS:
        raise RequestError(INVALID, f"hash_algo {req.hash_algo[:32]!r} is unknown; valid: "
                           f"{', '.join(ALGOS)}")
    want = DIGEST_BYTES[req.hash_algo]
    if len(req.root_hash) != want:
        raise RequestError(INVALID, f"root_hash is {len(req.root_hash)} bytes; {req.hash_algo} "
                           f"hashes are {want} bytes")
    load(req.load)


class _Bad(ValueError):
    """A malformed event; the caller prefixes where it is (built only when raising: the
    per-event f-string was a measurable part of a valid batch's cost)."""


def _hashes(raw: Sequence[bytes], digest: int) -> tuple[bytes, ...]:
    hs = tuple(raw[:])  # a slice copies a protobuf repeated field at C speed, tuple() does not
    # one C-level pass; the offender is looked for only on failure
    if not set(map(len, hs)) <= {digest}:
        i = next(i for i, h in enumerate(hs) if len(h) != digest)
        raise _Bad(f"block_hashes[{i}] is {len(hs[i])} bytes; this worker's hashes are "
                   f"{digest} bytes")
    return hs


def _stored(msg: pb.BlockStored, digest: int) -> IndexStored:
    if not msg.block_hashes:
        raise _Bad("BlockStored has no block_hashes")
    parent = msg.parent_hash
    if parent and len(parent) != digest:
        raise _Bad(f"parent_hash is {len(parent)} bytes; expected {digest} (or empty for a "
                   "chain starting at block 0)")
    tier = msg.tier
    if tier not in _TIERS:
        raise _Bad(f"unknown tier {tier}")
    return IndexStored(_hashes(msg.block_hashes, digest), bytes(parent), tier or 1)


def _where(i: int, seq: int) -> str:
    return f"events[{i}] (seq {seq})"


def events(msgs: list[pb.KvEvent], digest: int, cfg: ServiceConfig) -> list[IndexEvent]:
    """Typed events with consecutive seqs >= 1; raises on anything malformed (the first
    offending event, checks in a fixed order, so the message is deterministic)."""
    if len(msgs) > cfg.max_batch_events:
        raise RequestError(TOO_BIG, f"{len(msgs)} events in one batch; the limit is "
                           f"{cfg.max_batch_events} (--max-batch-events)")
    out: list[IndexEvent] = []
    n_hashes = 0
    max_hashes = cfg.max_batch_hashes
    prev = 0
    for i, ev in enumerate(msgs):
        seq = ev.seq
        if not 1 <= seq < MAX_SEQ:
            raise RequestError(INVALID, f"{_where(i, seq)}: seq must be in [1, 2**53)")
        if i and seq != prev + 1:
            raise RequestError(INVALID, f"{_where(i, seq)}: out of order, seqs in a batch must "
                               f"be consecutive (previous was {prev})")
        prev = seq
        kind = ev.WhichOneof("event")
        op: IndexStored | IndexRemoved | IndexCleared
        try:
            if kind == "removed":
                rm = ev.removed
                tier = rm.tier
                if tier not in _TIERS:
                    raise _Bad(f"unknown tier {tier}")
                op = IndexRemoved(_hashes(rm.block_hashes, digest), tier)
                n_hashes += len(op.hashes)
            elif kind == "stored":
                op = _stored(ev.stored, digest)
                n_hashes += len(op.hashes)
            elif kind == "cleared":
                op = IndexCleared()
            else:
                raise _Bad("no stored/removed/cleared set")
        except _Bad as e:
            raise RequestError(INVALID, f"{_where(i, seq)}: {e}") from None
        if n_hashes > max_hashes:
            raise RequestError(TOO_BIG, f"more than {max_hashes} block hashes in "
                               "one batch (--max-batch-hashes); split it")
        out.append(IndexEvent(seq, op))
    return out


def snapshot(req: pb.SyncWorkerRequest, digest: int, cfg: ServiceConfig) -> list[IndexStored]:
    if req.seq >= MAX_SEQ:
        raise RequestError(INVALID, "seq must be below 2**53")
    total = sum(len(b.block_hashes) for b in req.blocks)
    if total > cfg.max_snapshot_blocks:
        raise RequestError(TOO_BIG, f"snapshot of {total} blocks; the limit is "
                           f"{cfg.max_snapshot_blocks} (--max-snapshot-blocks)")
    out: list[IndexStored] = []
    for i, b in enumerate(req.blocks):
        try:
            out.append(_stored(b, digest))
        except _Bad as e:
            raise RequestError(INVALID, f"blocks[{i}]: {e}") from None
    return out


@dataclass(frozen=True, slots=True)
class RouteInput:
    """A validated prompt. ``tokens``: a 1-D array of ids >= 0, uint32 (uint64 only when the
    old ``token_ids`` field carried an id of 2**32 or more); read-only, never copied."""

    tokens: np.ndarray
    salt: str | None
    lora: tuple[str, str] | None
    mm: tuple[tuple[str, int, int], ...]
    model: str
    policy: str
    max_candidates: int
    dry_run: bool = False  # inspect only: record no provisional entries or routed work
    worker_id: str = ""    # non-empty: the only worker to consider (service.route)
    # whom the request is for (kvmesh.quota): a label, never part of a hash or index key
    tenant: str = DEFAULT_TENANT


def token_ids(ids: Sequence[int], packed: bytes, cfg: ServiceConfig,
              what: str = "token_ids") -> np.ndarray:
    """The prompt's ids from the repeated ``token_ids`` field and/or ``token_ids_packed``
    (little-endian uint32), checked with array operations (no Python step per token):
    packed bytes a multiple of 4, at least one token, at most ``max_prompt_tokens``, no
    negative id, and when both fields are set, the same ids in both."""
    if len(packed) % 4:
        raise RequestError(INVALID, f"{what}_packed is {len(packed)} bytes, not a multiple of "
                           "4 (one little-endian uint32 per token)")
    n = len(packed) // 4 or len(ids)
    if n == 0:
        raise RequestError(INVALID, f"{what} is empty")
    if n > cfg.max_prompt_tokens:
        raise RequestError(TOO_BIG, f"prompt of {n} tokens exceeds the limit of "
                           f"{cfg.max_prompt_tokens} (--max-prompt-tokens)")
    tokens = np.frombuffer(packed, dtype="<u4") if packed else None
    if len(ids):
        old = np.array(ids, dtype=np.int64)
        if old.min() < 0:
            i = int(np.argmax(old < 0))
            raise RequestError(INVALID, f"{what}[{i}] = {old[i]} is negative")
        if tokens is not None:
            if len(old) != n or not np.array_equal(old, tokens):
                raise RequestError(INVALID, f"{what} and {what}_packed are both set and "
                                   "differ: send one of them")
        else:
            tokens = old.astype(np.uint32 if old.max() <= _U32_MAX else np.uint64)
            tokens.flags.writeable = False
    assert tokens is not None
    return tokens


def _prompt(ids: Sequence[int], packed: bytes, salt: str, lora_msg: pb.Lora,
            items: list[pb.MultimodalItem], cfg: ServiceConfig, what: str = "token_ids",
            ) -> tuple[np.ndarray, str | None, tuple[str, str] | None, tuple]:
    """The checks every prompt takes (Route's and a pinned prefix's): tokens, salt, LoRA,
    multimodal items."""
    tokens = token_ids(ids, packed, cfg, what)
    n = len(tokens)
    if len(salt.encode()) > cfg.max_salt_bytes:
        raise RequestError(INVALID, f"salt is {len(salt.encode())} bytes; the limit is "
                           f"{cfg.max_salt_bytes}")
    try:
        lora = lora_key(lora_msg.name, lora_msg.path)  # unset message: "" and "", no LoRA
    except ValueError as e:
        raise RequestError(INVALID, str(e)) from None
    if len(items) > cfg.max_mm_items:
        raise RequestError(INVALID, f"{len(items)} multimodal items; the limit is "
                           f"{cfg.max_mm_items} per request (--max-mm-items)")
    mm = []
    for i, item in enumerate(items):
        if not item.identifier or len(item.identifier) > 1024:
            raise RequestError(INVALID, f"mm[{i}].identifier must be 1-1024 characters")
        if item.offset < 0 or item.length < 1 or item.offset + item.length > n:
            raise RequestError(INVALID, f"mm[{i}] covers [{item.offset}, "
                               f"{item.offset + item.length}), outside the prompt [0, {n})")
        mm.append((item.identifier, item.offset, item.length))
    return tokens, salt or None, lora, tuple(mm)


def route(req: pb.RouteRequest, cfg: ServiceConfig) -> RouteInput:
    tokens, salt, lora, mm = _prompt(req.token_ids, req.token_ids_packed, req.salt, req.lora,
                                     list(req.mm), cfg)
    policy = req.policy or cfg.policy
    if policy not in POLICIES:
        raise RequestError(INVALID, f"unknown policy {req.policy[:64]!r}; valid: "
                           f"{', '.join(POLICIES)}")
    return RouteInput(tokens, salt, lora, mm, req.model, policy, req.max_candidates,
                      req.dry_run, worker_id(req.worker_id) if req.worker_id else "",
                      tenant(req.tenant))


def tenant(value: str) -> str:
    """The tenant a request names (``""``: :data:`kvmesh.quota.DEFAULT_TENANT`); refused
    with ``check_tenant``'s own message, so the caller learns which rule the name broke."""
    try:
        return check_tenant(value)
    except ValueError as e:
        raise RequestError(INVALID, f"{e} (RouteRequest.tenant: 1-64 bytes of printable "
                           "characters without spaces; empty: the default tenant)") from None


@dataclass(frozen=True, slots=True)
class PrefixInput:
    """A prefix to pin: ``tokens`` (with their salt, LoRA and multimodal items, hashed per
    namespace like a Route's prompt) or, when ``tokens`` is None, its chain ``hashes``."""

    tokens: RouteInput | None
    hashes: tuple[bytes, ...]
    model: str


@dataclass(frozen=True, slots=True)
class PinInput:
    prefix: PrefixInput
    ttl_s: float           # resolved: the service's default when the request gave none
    max_workers: int       # 0: every live holder


def prefix(ref: pb.PrefixRef, cfg: ServiceConfig) -> PrefixInput:
    """Exactly one of token ids or block hashes; hashes carry salt, LoRA and multimodal
    items already, so those must be unset with them. Hashes: 16 or 32 bytes, all alike, at
    most ``max_batch_hashes``."""
    if ref.block_hashes:
        if ref.token_ids or ref.salt or ref.HasField("lora") or ref.mm:
            raise RequestError(INVALID, "prefix: give token_ids (with salt, lora, mm) or "
                               "block_hashes, not both")
        if len(ref.block_hashes) > cfg.max_batch_hashes:
            raise RequestError(TOO_BIG, f"prefix of {len(ref.block_hashes)} block hashes; the "
                               f"limit is {cfg.max_batch_hashes} (--max-batch-hashes)")
        width = len(ref.block_hashes[0])
        for i, h in enumerate(ref.block_hashes):
            if len(h) != width or width not in set(DIGEST_BYTES.values()):
                raise RequestError(INVALID, f"prefix.block_hashes[{i}] is {len(h)} bytes; "
                                   "hashes are 16 or 32 bytes, all of one size")
        return PrefixInput(None, tuple(ref.block_hashes), ref.model)
    tokens, salt, lora, mm = _prompt(ref.token_ids, b"", ref.salt, ref.lora, list(ref.mm),
                                     cfg, "prefix.token_ids")
    inp = RouteInput(tokens, salt, lora, mm, ref.model, "kvmesh", 0, dry_run=True)
    return PrefixInput(inp, (), ref.model)


def pin(req: pb.PinPrefixRequest, cfg: ServiceConfig) -> PinInput:
    ttl = req.ttl_s
    if not (math.isfinite(ttl) and 0.0 <= ttl <= cfg.max_pin_ttl_s):
        raise RequestError(INVALID, f"ttl_s ({ttl}) must be in [0, {cfg.max_pin_ttl_s}] "
                           "seconds (0: the service's default, --pin-ttl-s)")
    return PinInput(prefix(req.prefix, cfg), ttl or cfg.pin_ttl_s, req.max_workers)


def unpin(req: pb.UnpinPrefixRequest, cfg: ServiceConfig) -> PrefixInput:
    return prefix(req.prefix, cfg)
