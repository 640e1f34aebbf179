"""PinPrefix / UnpinPrefix: find the live workers that should keep a prefix in their device
tier, and have each pin (or unpin) it through its own ``WorkerService.Pin``.

``max_workers == 0`` pins on every holder; ``N`` on the N best-ranked workers, which warm what
they lack. Unpin goes to every live worker of the model. Calls run concurrently under
``pin_timeout_s``; a worker's failure is an error string in the answer, never a failed RPC.
Only the service (or the worker's own access token) can produce a worker's pin credential.

See docs/architecture.md#the-service-process.
"""
from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from kvmesh.contract import DIGEST_BYTES
from kvmesh.rpc.auth import worker_access_token, worker_pin_token
from kvmesh.rpc.channel import Dialer
from kvmesh.rpc.tls import TlsFiles
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import worker_pb2, worker_pb2_grpc
from service import worker_tokens
from service.config import ServiceConfig
from service.index.base import BlockMatch, WorkerRecord
from service.liveness import WorkerTable
from service.policy import Policy, WorkerView
from service.route_steps import live_groups
from service.validate import PinInput, PrefixInput, RequestError, RouteInput

log = logging.getLogger("kvmesh.service")
Lookup = Callable[[str, list[bytes], list[WorkerRecord], int], Awaitable[dict[str, BlockMatch]]]
Hasher = Callable[[RouteInput, int, str], Awaitable[list[bytes]]]
MAX_ERROR_CHARS = 300


@dataclass(frozen=True, slots=True)
class Target:
    """One worker to call and whether it must warm (prefill) the prefix first."""

    worker_id: str
    address: str
    warm: bool = False


def choose(ranked: list[WorkerView], max_workers: int, can_warm: bool) -> list[Target]:
    """The workers a pin goes to, from ``ranked`` (every live worker, best first); see the
    module docstring."""
    holders = [v for v in ranked if v.match.blocks]
    if max_workers == 0:
        return [Target(v.worker_id, v.address) for v in holders]
    chosen = holders[:max_workers]
    if can_warm:
        chosen += [v for v in ranked if not v.match.blocks][:max_workers - len(chosen)]
    return [Target(v.worker_id, v.address, warm=can_warm) for v in chosen]


def pin_credentials(cfg: ServiceConfig, worker_id: str) -> list[str | None]:
    """The tokens to present to ``worker_id``'s Pin, tried in order (the next one after an
    UNAUTHENTICATED): derived from each credential it may present to this service."""
    creds: list[str] = []
    if cfg.worker_secret:
        creds.append(worker_tokens.mint(cfg.worker_secret, worker_id))
    if cfg.worker_token:
        creds.append(cfg.worker_token)
    if creds:
        return [worker_pin_token(c) for c in creds]
    return [worker_access_token(cfg.token, worker_id) if cfg.token else None]


def worker_dialer(cfg: ServiceConfig) -> Dialer:
    """Channels to workers: TLS verified against the service's CA (presenting its own
    certificate for mutual TLS) when it has one, else plaintext."""
    if cfg.tls_ca_file is None:
        return Dialer()
    return Dialer.from_tls(TlsFiles(cert=cfg.tls_cert_file, key=cfg.tls_key_file,
                                    ca=cfg.tls_ca_file))


class PinService:
    """The two admin RPCs over the servicer's worker table, index lookup and hashing."""

    def __init__(self, cfg: ServiceConfig, table: WorkerTable, lookup: Lookup,
                 hashes: Hasher, policy: Policy, rng: random.Random,
                 clock: Callable[[], int]) -> None:
        self.cfg = cfg
        self.table = table
        self.lookup = lookup
        self.hashes = hashes
        self.policy = policy
        self.rng = rng
        self.clock = clock
        self._dialer: Dialer | None = None  # made on first use: it reads the TLS files

    @property
    def dialer(self) -> Dialer:
        if self._dialer is None:
            self._dialer = worker_dialer(self.cfg)
        return self._dialer

    async def pin(self, inp: PinInput) -> pb.PinPrefixResponse:
        now = self.clock()
        views, tokens, blocks = await self._views(inp.prefix, self._groups(inp.prefix, now),
                                                  now)
        if not blocks:
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"a prefix of {tokens} "
                               "tokens has no full block: there is nothing to pin")
        ranked = [r.view for r in self.policy.rank(tokens, views, self.rng)]
        targets = choose(ranked, inp.max_workers, can_warm=inp.prefix.tokens is not None)
        results = await self._send(targets, inp.prefix, ttl_s=inp.ttl_s, unpin=False)
        log.info("pinned a prefix of %d blocks (ttl %.0f s) on %d of %d targets (%d cut "
                 "short by a pin cap)", blocks, inp.ttl_s, sum(not r.error for r in results),
                 len(results), sum(r.cap_reached for r in results))
        return pb.PinPrefixResponse(chain_blocks=blocks, workers=results)

    async def unpin(self, prefix: PrefixInput) -> pb.UnpinPrefixResponse:
        groups = self._groups(prefix, self.clock())
        targets = [Target(r.worker_id, r.address) for recs in groups.values() for r in recs]
        results = await self._send(targets, prefix, ttl_s=0.0, unpin=True)
        log.info("unpinned a prefix on %d of %d workers", sum(not r.error for r in results),
                 len(results))
        return pb.UnpinPrefixResponse(workers=results)

    def _groups(self, prefix: PrefixInput, now: int) -> dict[str, list[WorkerRecord]]:
        """Live workers of the prefix's model by namespace; with block hashes, only the
        namespaces whose hashes have their size."""
        groups = live_groups(self.table.live(now), prefix.model)
        if prefix.tokens is None:
            width = len(prefix.hashes[0])
            groups = {ns: recs for ns, recs in groups.items()
                      if DIGEST_BYTES[recs[0].algo] == width}
            if not groups:
                raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"no live worker of "
                                   f"this model uses {width}-byte block hashes")
        return groups

    async def _views(self, prefix: PrefixInput, groups: dict[str, list[WorkerRecord]],
                     now: int) -> tuple[list[WorkerView], int, int]:
        """Every live worker with its (uncapped) match of the chain; the prefix's tokens
        (to rank by) and its full blocks."""
        views: list[WorkerView] = []
        tokens = blocks = 0
        for ns, recs in groups.items():
            bs, algo = recs[0].block_size, recs[0].algo
            if prefix.tokens is not None:
                chain = await self.hashes(prefix.tokens, bs, algo)
                tokens = len(prefix.tokens.tokens)
            else:
                chain = list(prefix.hashes)
                tokens = max(tokens, len(chain) * bs)
            blocks = max(blocks, len(chain))
            matches = await self.lookup(ns, chain, recs, now) if chain else {}
            views += [WorkerView(r.worker_id, r.address, self.table.load(r),
                                 matches.get(r.worker_id, BlockMatch()), bs, ns) for r in recs]
        return views, tokens, blocks

    async def _send(self, targets: list[Target], prefix: PrefixInput, *, ttl_s: float,
                    unpin: bool) -> list[pb.PinnedWorker]:
        requests = [pin_request(prefix, ttl_s=ttl_s, warm=t.warm, unpin=unpin)
                    for t in targets]
        return list(await asyncio.gather(*(self._call(t, r)
                                           for t, r in zip(targets, requests, strict=True))))

    async def _call(self, target: Target, request: worker_pb2.PinRequest) -> pb.PinnedWorker:
        """One worker's Pin; any failure becomes that worker's error string."""
        out = pb.PinnedWorker(worker_id=target.worker_id)
        try:
            async with self.dialer.aio(target.address) as channel:
                stub = worker_pb2_grpc.WorkerServiceStub(channel)
                for token in pin_credentials(self.cfg, target.worker_id):
                    metadata = (("authorization", f"Bearer {token}"),) if token else ()
                    try:
                        res = await stub.Pin(request, timeout=self.cfg.pin_timeout_s,
                                             metadata=metadata)
                    except grpc.aio.AioRpcError as e:
                        out.error = f"{e.code().name}: {e.details() or ''}"[:MAX_ERROR_CHARS]
                        if e.code() != grpc.StatusCode.UNAUTHENTICATED:
                            break
                    else:
                        out.error = ""
                        out.pinned_blocks = res.pinned_blocks
                        out.chain_blocks = res.chain_blocks
                        out.cap_reached = res.cap_reached
                        break
        except Exception as e:  # a worker's failure is its entry's, never the RPC's
            out.error = f"{type(e).__name__}: {e}"[:MAX_ERROR_CHARS]
        if out.error:
            log.warning("pin on worker %r failed: %s", target.worker_id, out.error)
        elif out.cap_reached:
            log.warning("pin on worker %r cut short by its pin cap: %d of %d blocks",
                        target.worker_id, out.pinned_blocks, out.chain_blocks)
        return out


def pin_request(prefix: PrefixInput, *, ttl_s: float, warm: bool,
                unpin: bool) -> worker_pb2.PinRequest:
    """The worker's ``PinRequest`` for ``prefix``: its token ids (the worker hashes them
    with its own algorithm) or its block hashes."""
    req = worker_pb2.PinRequest(block_hashes=prefix.hashes, ttl_s=ttl_s, warm=warm,
                                unpin=unpin)
    inp = prefix.tokens
    if inp is not None:
        req.token_ids.extend(inp.tokens.tolist())
        req.salt = inp.salt or ""
        if inp.lora is not None:
            req.lora.name, req.lora.path = inp.lora
        req.mm.extend(pb.MultimodalItem(identifier=i, offset=o, length=n)
                      for i, o, n in inp.mm)
    return req
