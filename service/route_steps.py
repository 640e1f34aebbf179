"""The pure steps of a Route, in the order ``service.route.Router.route`` runs them.

1. ``live_groups``: the live workers serving the request's model, by namespace (one chain of
   hashes per namespace: block size and hash algo differ between them);
2. ``hash_in_thread`` decides where a chain is hashed;
3. ``cap_match``: a worker's match, capped at the blocks the request can use from cache;
4. (the policy ranks the views, given ``prefix_key`` when it reads one); ``only`` keeps the
   worker a Route names (``RouteRequest.worker_id``); (the router records provisional
   entries and routed load);
5. ``response``: the answer, cut to ``max_candidates`` (the router adds fetch plans).

None of these touch the backend, the clock or the metrics: the router does, between them.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import grpc
import numpy as np
import xxhash

from kvmesh.hashing import Lora
from kvmesh.v1 import index_pb2 as pb
from service import validate
from service.index.base import BlockMatch, WorkerLoad, WorkerRecord
from service.policy import Ranked
from service.validate import RequestError

KEY_TOKENS = 256
"""Tokens of a prompt that name it for ``consistent_hash``: 16 blocks of 16. A prompt's first
tokens are its system prompt or template, what requests that can share a cache have in
common; 256 reach past a chat template's fixed header (the same in every request, a single
hot key) and stay inside a typical system prompt (so the user's turn, different in every
request, does not split one prompt's requests). Counted in tokens, not blocks: one key for
every namespace's block size and hash algorithm, so a request names the same arc of the ring
whichever namespaces serve its model."""


def prompt_key(tokens: Sequence[int] | np.ndarray, salt: str | None, lora: Lora | None) -> bytes:
    """xxh3-128 of the salt, the LoRA name and the first :data:`KEY_TOKENS` token ids: what
    requests must share to share a cache (a salt or a LoRA changes every block hash). Each
    field is length-prefixed (no two inputs give the same bytes); an empty salt is no salt,
    as in validation; the ids are hashed as little-endian uint64 whatever their array type.
    The service (:func:`prefix_key`) and ``kvmesh bench replay`` both key through here."""
    h = xxhash.xxh3_128()
    for field in ((salt or "").encode(), (lora[0] if lora else "").encode()):
        h.update(len(field).to_bytes(4, "little"))
        h.update(field)
    h.update(np.asarray(tokens[:KEY_TOKENS], dtype="<u8").tobytes())
    return h.digest()


def prefix_key(inp: validate.RouteInput) -> bytes:
    """The key of a validated Route for the policies that read one (:func:`prompt_key`)."""
    return prompt_key(inp.tokens, inp.salt, inp.lora)


def hash_work(n_tokens: int, block_size: int, n_mm: int) -> int:
    """Units of hashing work of one chain: its blocks x (1 + its multimodal items)."""
    return (n_tokens // max(block_size, 1) + 1) * (1 + n_mm)


def hash_in_thread(inp: validate.RouteInput, block_size: int, threshold: int) -> bool:
    """Whether hashing ``inp``'s chain is worth a worker thread (``threshold``: units of
    :func:`hash_work` from which the event loop would stall heartbeats for too long)."""
    return hash_work(len(inp.tokens), block_size, len(inp.mm)) >= threshold


def usable_blocks(n_tokens: int, block_size: int) -> int:
    """Blocks a prompt of ``n_tokens`` can take from cache: the last token is always
    computed, so a block ending on it cannot be used."""
    return (n_tokens - 1) // block_size


def cap_match(m: BlockMatch, blocks: int) -> BlockMatch:
    """At most ``blocks`` matched blocks, dropping the slowest tiers first (offloaded blocks
    are a chain's tail: it is evicted tail first)."""
    extra = m.blocks - blocks
    if extra <= 0:
        return m
    disk = max(m.disk - extra, 0)
    extra -= m.disk - disk
    cpu = max(m.cpu - extra, 0)
    extra -= m.cpu - cpu
    return BlockMatch(blocks, m.gpu - extra, cpu, disk)


def live_groups(live: list[WorkerRecord], model: str) -> dict[str, list[WorkerRecord]]:
    """The ``live`` workers serving ``model`` (empty: the only model served), by namespace.

    Raises INVALID_ARGUMENT when ``model`` is empty and several are served, UNAVAILABLE when
    no live worker serves it."""
    if not model:
        models = sorted({r.model for r in live})
        if len(models) > 1:
            raise RequestError(validate.INVALID, f"several models are served "
                               f"({', '.join(models)}): set RouteRequest.model")
        model = models[0] if models else ""
    groups: dict[str, list[WorkerRecord]] = {}
    for r in live:
        if r.model == model:
            groups.setdefault(r.ns, []).append(r)
    if not groups:
        raise RequestError(grpc.StatusCode.UNAVAILABLE, "no live worker serves model "
                           f"{model!r}" if model else "no live worker is registered")
    return groups


def only(ranked: list[Ranked], worker_id: str) -> list[Ranked]:
    """``ranked`` cut to ``worker_id``'s entry (its fetch may still name another worker as
    its source); all of it when ``worker_id`` is empty. Raises UNAVAILABLE when the worker is
    not among them (it left between the check and the ranking)."""
    if not worker_id:
        return ranked
    kept = [r for r in ranked if r.view.worker_id == worker_id]
    if not kept:
        raise RequestError(grpc.StatusCode.UNAVAILABLE, f"worker {worker_id!r} left routing "
                           "during this Route: retry, or route without worker_id")
    return kept


def pb_load(load: WorkerLoad) -> pb.WorkerLoad:
    """``load`` as its message (a new one: the caller may change it)."""
    return pb.WorkerLoad(running=load.running, waiting=load.waiting,
                         queued_prefill_tokens=load.queued_prefill_tokens,
                         free_blocks=load.free_blocks, total_blocks=load.total_blocks,
                         decode_tokens=load.decode_tokens,
                         prefill_us_per_token=load.prefill_us_per_token,
                         onboard_us_per_block_cpu=load.onboard_us_per_block_cpu,
                         onboard_us_per_block_disk=load.onboard_us_per_block_disk,
                         tier_blocks=load.tier_blocks,
                         free_empty_blocks=load.free_empty_blocks,
                         fetch_us_per_block=load.fetch_us_per_block,
                         fetch_us_per_call=load.fetch_us_per_call, peer_fetch=load.peer_fetch)


@functools.lru_cache(maxsize=4096)
def _shared_load(load: WorkerLoad) -> pb.WorkerLoad:
    """The message of ``load``, built once per distinct load (a worker's changes only with
    its heartbeats). Shared: never changed, only copied into candidates."""
    return pb_load(load)


def response(inp: validate.RouteInput, ranked: list[Ranked], policy: str,
             degraded: bool) -> pb.RouteResponse:
    """The answer: the best ``max_candidates`` (0: all) of ``ranked``, best first."""
    if inp.max_candidates:
        ranked = ranked[:inp.max_candidates]
    out = pb.RouteResponse(degraded=degraded, prompt_tokens=len(inp.tokens), policy=policy)
    for r in ranked:
        view = r.view
        cand = out.candidates.add(worker_id=view.worker_id, address=view.address,
                                  matched_tokens=r.matched_tokens, tier=view.match.tier,
                                  cost=r.cost, load=_shared_load(view.load))
        by_tier = cand.matched_tokens_by_tier  # set one by one: a dict argument is slower
        for tier, tokens in view.matched_tokens_by_tier.items():
            by_tier[tier] = tokens
    return out
