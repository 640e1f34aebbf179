"""Protobuf <-> plain Python for the kvmesh client: request building and result conversion.

Shared by the sync and asyncio clients so both build identical requests and return identical
results. Nothing here does I/O.
"""
from __future__ import annotations

import array
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from client.errors import BrokenStream
from client.results import (
    Candidate,
    FetchPlan,
    GenerateResult,
    PinnedWorker,
    PinResult,
    RouteResult,
)
from kvmesh.quota import check_tenant
from kvmesh.rpc.auth import WorkerAccess
from kvmesh.v1 import index_pb2, worker_pb2

_U32 = "I" if array.array("I").itemsize == 4 else "L"  # the array typecode of a uint32
LoraSpec = str | tuple[str, str] | Mapping[str, str] | index_pb2.Lora | None
MmSpec = tuple[str, int, int] | Mapping[str, Any] | index_pb2.MultimodalItem


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata carrying ``token`` as ``authorization: Bearer <token>`` (or none)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def worker_metadata(access: WorkerAccess | None, worker_id: str,
                    ) -> tuple[tuple[str, str], ...]:
    """The call metadata for worker ``worker_id``: its own access token minted by
    ``access`` (``kvmesh.rpc.auth.WorkerAccess`` of the router token; None: an open cluster),
    never the router token itself, which lets its holder Route and read Stats, nor a token
    valid on any other worker: the index names the workers a client calls, so a worker is
    trusted less than the service, and less than its peers."""
    return auth_metadata(access.token(worker_id) if access is not None else None)


def _lora(spec: LoraSpec) -> index_pb2.Lora | None:
    """A LoRA adapter given as a name, ``(name, path)``, a mapping or a ``Lora`` message."""
    if spec is None or spec == "":
        return None
    if isinstance(spec, index_pb2.Lora):
        return spec
    if isinstance(spec, str):
        return index_pb2.Lora(name=spec)
    if isinstance(spec, Mapping):
        return index_pb2.Lora(name=str(spec.get("name", "")), path=str(spec.get("path", "")))
    name, path = spec
    return index_pb2.Lora(name=name, path=path)


def _mm(items: Iterable[MmSpec]) -> list[index_pb2.MultimodalItem]:
    """Multimodal items given as ``(identifier, offset, length)``, mappings or messages."""
    out = []
    for item in items:
        if isinstance(item, index_pb2.MultimodalItem):
            out.append(item)
        elif isinstance(item, Mapping):
            out.append(index_pb2.MultimodalItem(identifier=str(item["identifier"]),
                                                offset=int(item["offset"]),
                                                length=int(item["length"])))
        else:
            ident, offset, length = item
            out.append(index_pb2.MultimodalItem(identifier=ident, offset=int(offset),
                                                length=int(length)))
    return out


def _token_list(token_ids: Iterable[int]) -> Iterable[int]:
    """Token ids for a repeated int64 field; protobuf itself rejects non-integers (TypeError).

    Passed through unconverted (a per-token ``int()`` triples the cost of an 8K prompt); a str
    or bytes prompt is a caller bug, not a token list.
    """
    if isinstance(token_ids, str | bytes):
        raise TypeError("token_ids must be a sequence of ints, not text; tokenize it first")
    return token_ids


def route_request(token_ids: Iterable[int], salt: str | None = None, lora: LoraSpec = None,
                  mm: Iterable[MmSpec] = (), policy: str | None = None,
                  max_candidates: int = 0, model: str | None = None,
                  dry_run: bool = False, packed: bool = True,
                  worker_id: str | None = None,
                  tenant: str | None = None) -> index_pb2.RouteRequest:
    """Build a ``RouteRequest``; ``None`` means the service's default for every option
    (``worker_id``: answer only that worker, which may still be planned a peer fetch;
    ``tenant``: the default tenant). Raises ``ValueError`` for a tenant name the service
    would refuse (:func:`kvmesh.quota.check_tenant`), before anything is sent.

    The prompt goes as ``token_ids_packed`` (:func:`pack_tokens`) when every id fits a
    uint32, else (or with ``packed=False``, for a service older than the field) as the
    repeated ``token_ids``, which the service still reads and checks."""
    tenant = wire_tenant(tenant)
    ids = _token_list(token_ids)
    if not isinstance(ids, Sequence) and not hasattr(ids, "dtype"):
        ids = list(ids)  # an iterator: it is read twice when it cannot be packed
    raw = pack_tokens(ids) if packed else None
    return index_pb2.RouteRequest(
        token_ids=ids if raw is None else (), token_ids_packed=raw or b"", salt=salt or "",
        lora=_lora(lora), mm=_mm(mm), model=model or "", policy=policy or "",
        max_candidates=max(0, int(max_candidates)), dry_run=dry_run,
        worker_id=worker_id or "", tenant=tenant)


def wire_tenant(tenant: str | None) -> str:
    """``tenant`` as ``RouteRequest.tenant`` carries it (``""``: the default tenant); raises
    ``ValueError`` with :func:`kvmesh.quota.check_tenant`'s message for a name the service
    would refuse, before anything is sent."""
    return check_tenant(tenant) if tenant else ""


def pack_tokens(token_ids: Sequence[int]) -> bytes | None:
    """``token_ids`` as little-endian uint32 bytes (``RouteRequest.token_ids_packed``);
    None when one is not an int in ``[0, 2**32)``. A C loop over a list (``array``), no
    Python step per token."""
    kind = getattr(getattr(token_ids, "dtype", None), "kind", None)
    if kind is not None:  # a numpy array: its own vectorised checks and conversion
        a: Any = token_ids
        ok = kind in "iu" and a.ndim == 1 and (not a.size or (a.min() >= 0
                                                               and a.max() < 1 << 32))
        return a.astype("<u4").tobytes() if ok else None
    try:
        arr = array.array(_U32, token_ids)
    except (OverflowError, TypeError):
        return None
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


def unpack_tokens(raw: bytes) -> list[int]:
    """The token ids of ``token_ids_packed`` bytes (the inverse of :func:`pack_tokens`)."""
    arr = array.array(_U32)
    arr.frombytes(raw[:len(raw) - len(raw) % 4])
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tolist()


def route_tokens(route: index_pb2.RouteRequest) -> list[int]:
    """The prompt of ``route``, whichever field carries it."""
    if route.token_ids_packed:
        return unpack_tokens(route.token_ids_packed)
    return list(route.token_ids)


def prefix_ref(token_ids: Iterable[int] | None, salt: str | None = None,
               lora: LoraSpec = None, mm: Iterable[MmSpec] = (), model: str | None = None,
               block_hashes: Iterable[bytes] | None = None) -> index_pb2.PrefixRef:
    """A prefix for ``PinPrefix`` / ``UnpinPrefix``: token ids (+ salt, LoRA, mm) or, with
    ``token_ids=None``, its chain of block hashes."""
    return index_pb2.PrefixRef(
        token_ids=_token_list(token_ids) if token_ids is not None else (),
        salt=salt or "", lora=_lora(lora), mm=_mm(mm), model=model or "",
        block_hashes=list(block_hashes or ()))


def pin_result(resp: index_pb2.PinPrefixResponse | index_pb2.UnpinPrefixResponse
               ) -> PinResult:
    """A pin or unpin answer as a ``PinResult``."""
    workers = [PinnedWorker(w.worker_id, int(w.pinned_blocks), w.error,
                            int(getattr(w, "chain_blocks", 0)),
                            bool(getattr(w, "cap_reached", False))) for w in resp.workers]
    return PinResult(int(getattr(resp, "chain_blocks", 0)), workers)


def generate_request(route: index_pb2.RouteRequest, max_tokens: int = 16,
                     temperature: float = 0.0, seed: int | None = None,
                     ignore_eos: bool = False,
                     request_id: str | None = None) -> worker_pb2.GenerateRequest:
    """Build the worker's ``GenerateRequest`` for the same prompt, salt, LoRA, mm items and
    tenant."""
    sampling = worker_pb2.SamplingParams(max_tokens=int(max_tokens),
                                         temperature=float(temperature), ignore_eos=ignore_eos)
    if seed is not None:
        sampling.seed = int(seed)
    req = worker_pb2.GenerateRequest(request_id=request_id or uuid.uuid4().hex,
                                     token_ids=route_tokens(route), sampling=sampling,
                                     salt=route.salt, mm=route.mm, tenant=route.tenant)
    if route.HasField("lora"):
        req.lora.CopyFrom(route.lora)
    return req


def message_to_dict(msg: Message) -> dict[str, Any]:
    """Every field of ``msg`` (defaults included) as plain Python; enums become their names.

    Unlike ``json_format.MessageToDict`` 64-bit integers stay ints, not strings.
    """
    out: dict[str, Any] = {}
    for fd in msg.DESCRIPTOR.fields:
        value = getattr(msg, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            out[fd.name] = {k: _plain(fd.message_type.fields_by_name["value"], v)
                            for k, v in value.items()}
        elif _is_repeated(fd):
            out[fd.name] = [_plain(fd, v) for v in value]
        else:
            out[fd.name] = _plain(fd, value)
    return out


def _is_repeated(fd: FieldDescriptor) -> bool:
    # ``is_repeated`` replaces the deprecated ``label`` in newer protobuf releases.
    flag = getattr(fd, "is_repeated", None)
    return bool(flag) if flag is not None else fd.label == FieldDescriptor.LABEL_REPEATED


def _plain(fd: FieldDescriptor, value: Any) -> Any:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return message_to_dict(value)
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return fd.enum_type.values_by_number[value].name if value in \
            fd.enum_type.values_by_number else value
    return value


def fetch_plan(p: index_pb2.FetchPlan) -> FetchPlan:
    """A protobuf ``FetchPlan`` as the client's dataclass."""
    return FetchPlan(source_worker_id=p.source_worker_id, source_address=p.source_address,
                     start_block=int(p.start_block), block_hashes=tuple(p.block_hashes),
                     tokens=int(p.tokens), est_s=float(p.est_s), ticket=bytes(p.ticket))


def fetch_message(plan: FetchPlan) -> index_pb2.FetchPlan:
    """The client's ``FetchPlan`` as the message ``GenerateRequest.fetch`` carries."""
    return index_pb2.FetchPlan(source_worker_id=plan.source_worker_id,
                               source_address=plan.source_address,
                               start_block=plan.start_block, block_hashes=plan.block_hashes,
                               tokens=plan.tokens, est_s=plan.est_s, ticket=plan.ticket)


def candidate(c: index_pb2.Candidate) -> Candidate:
    """A protobuf ``Candidate`` as the client's dataclass."""
    return Candidate(worker_id=c.worker_id, address=c.address,
                     matched_tokens=int(c.matched_tokens), cost=float(c.cost),
                     tier=index_pb2.Tier.Name(c.tier) if c.tier in index_pb2.Tier.values()
                     else str(c.tier),
                     load=message_to_dict(c.load),
                     matched_tokens_by_tier={k: int(v) for k, v in
                                             c.matched_tokens_by_tier.items()},
                     fetch=fetch_plan(c.fetch) if c.HasField("fetch") else None)


def route_result(resp: index_pb2.RouteResponse) -> RouteResult:
    """A ``RouteResponse`` as a ``RouteResult``; with no candidates the chosen fields are empty.

    Callers that need a worker check ``candidates`` (the clients raise UNAVAILABLE then).
    """
    cands = [candidate(c) for c in resp.candidates]
    best = cands[0] if cands else None
    return RouteResult(worker_id=best.worker_id if best else "",
                       address=best.address if best else "",
                       matched_tokens=best.matched_tokens if best else 0,
                       candidates=cands, degraded=resp.degraded,
                       prompt_tokens=int(resp.prompt_tokens), policy=resp.policy,
                       matched_tokens_by_tier=dict(best.matched_tokens_by_tier) if best else {})


def stats_dict(resp: index_pb2.StatsResponse, service: str = "") -> dict[str, Any]:
    """``IndexService.Stats`` as a dict: ``workers`` (load fields flattened into each worker),
    ``counters``, ``degraded`` and ``service`` (the replica that answered)."""
    workers = []
    for w in resp.workers:
        row = message_to_dict(w)
        row.update(row.pop("load"))
        workers.append(row)
    return {"service": service, "degraded": resp.degraded, "workers": workers,
            "counters": dict(resp.counters)}


def worker_stats_dict(resp: worker_pb2.WorkerStatsResponse, address: str = "") -> dict[str, Any]:
    """``WorkerService.Stats`` as a dict with nested ``load`` and ``cache`` dicts."""
    out = message_to_dict(resp)
    out["address"] = address
    return out


class StreamAssembler:
    """Collects one Generate stream; ``result()`` only succeeds once ``finished`` arrived."""

    def __init__(self, cand: Candidate, attempts: int) -> None:
        self._cand = cand
        self._attempts = attempts
        self._tokens: list[int] = []
        self._final: worker_pb2.GenerateResponse | None = None
        self._start = time.perf_counter()

    def feed(self, msg: worker_pb2.GenerateResponse) -> bool:
        """Add one stream message; True once the final message was seen."""
        if self._final is None:
            self._tokens.extend(msg.token_ids)
            if msg.finished:
                self._final = msg
        return self._final is not None

    def result(self) -> GenerateResult:
        """The complete result; raises ``BrokenStream`` if the stream ended early."""
        final = self._final
        if final is None:
            raise BrokenStream(f"worker {self._cand.worker_id or self._cand.address} ended the "
                               "stream before its final message")
        return GenerateResult(
            worker_id=final.worker_id or self._cand.worker_id, token_ids=self._tokens,
            num_cached_tokens=int(final.num_cached_tokens), ttft_s=float(final.ttft_s),
            finish_reason=final.finish_reason, prompt_tokens=int(final.prompt_tokens),
            address=self._cand.address,
            e2e_s=float(final.e2e_s) or time.perf_counter() - self._start,
            matched_tokens=self._cand.matched_tokens, attempts=self._attempts,
            cached_tokens_by_tier={k: int(v) for k, v in final.cached_tokens_by_tier.items()})
