"""The engine's side of a peer fetch: the source's read of the blocks it serves and the
receiver's write of the blocks it pulled. Both run on the engine thread between steps (a
run held on the device alone is read beside the step instead: ``worker.engine.peer_read``).

Source (:func:`snapshot`): the longest run of the asked hashes, from the first, that this
worker holds in chain order on any tier (device pool, host slots, disk files), copied into
host memory with each block's token ids. Running between steps is the read lease: no step
can evict or overwrite a block while it is read, and once copied nothing the source does
later can change what the receiver gets.

Receiver (:func:`import_landed`): the blocks that landed, written into fresh device blocks
and cached (``worker.kv_cache.peer_import``); the offloads that taking those blocks ordered
run first, so an evicted block's KV reaches its host slot before it is overwritten.

See docs/architecture.md#peer-kv-transfer-the-worker-side.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from worker.kv_cache import KVRequest

if TYPE_CHECKING:
    from worker.engine.engine import Engine

log = logging.getLogger("kvmesh.worker.peer")


@dataclass(frozen=True)
class Layout:
    """One block's KV as it travels: ``block_shape`` ``[layers, 2, block_size, kv_heads,
    head_dim]`` of ``dtype`` (torch's name without ``torch.``), ``block_bytes`` bytes."""

    block_shape: tuple[int, ...]
    dtype: str
    block_bytes: int


def layout(engine: Engine) -> Layout:
    cache = engine.kv_cache
    return Layout((cache.shape[0], cache.shape[1], *cache.shape[3:]),
                  str(cache.dtype).removeprefix("torch."),
                  cache[:, :, 0].numel() * cache.element_size())


@dataclass
class Snapshot:
    """What a source serves: ``count`` blocks' KV in ``data`` (contiguous, block after
    block) and their token ids; ``tiers``: blocks read from each tier."""

    data: torch.Tensor
    count: int
    token_ids: list[int]
    tiers: dict[str, int] = field(default_factory=dict)

    def blocks(self) -> list[memoryview]:
        """Each block's bytes (views of ``data``, no copy)."""
        flat = memoryview(self.data.reshape(-1).view(torch.uint8).numpy())
        size = len(flat) // self.count if self.count else 0
        return [flat[i * size:(i + 1) * size] for i in range(self.count)]


def snapshot(engine: Engine, hashes: Sequence[bytes]) -> Snapshot:
    """The longest held run of ``hashes`` (block ``i + 1`` must be block ``i``'s child),
    copied to host memory. A lower-tier block that cannot be read ends the run there."""
    kv, cache = engine.kv, engine.kv_cache
    lower = kv.offloader.tiers if kv.offloader is not None else []
    found: list[tuple[str, int | bytes]] = []  # ("gpu", block id) or (tier, slot / hash)
    tokens: list[int] = []
    prev: bytes | None = None
    for i, h in enumerate(hashes):
        src = _find(kv.pool.cached.get(h, {}).values(), lower, h, prev, i == 0)
        if src is None:
            break
        found.append(src[:2])
        tokens.extend(src[2])
        prev = h
    lay = layout(engine)
    out = torch.empty((len(found), *lay.block_shape), dtype=cache.dtype)
    device = [(n, bid) for n, (tier, bid) in enumerate(found) if tier == "gpu"]
    if device and cache.device.type != "cpu":  # one gather on the device, one copy down
        idx = torch.tensor([bid for _, bid in device], device=cache.device)
        rows = cache[:, :, idx].movedim(2, 0).contiguous().to("cpu")
        for j, (n, _) in enumerate(device):
            out[n].copy_(rows[j])
    else:  # block by block: each is 2 x layers contiguous runs (a strided gather is slower)
        for n, bid in device:
            out[n].copy_(cache[:, :, bid])
    count = len(found)
    tiers: dict[str, int] = {"gpu": len(device)} if device else {}
    for n, (tier, src) in enumerate(found):
        if tier == "gpu":
            continue
        try:
            out[n] = engine.copies.read_block(tier, src)
        except Exception as e:  # unreadable: serve the run before it
            log.warning("peer fetch: %s block %d unreadable (%s): serving %d blocks",
                        tier, n, e, n)
            count = n
            engine.settle_copies()
            break
        tiers[tier] = tiers.get(tier, 0) + 1
    bs = engine.block_size
    return Snapshot(out[:count], count, tokens[:count * bs], tiers)


def _find(device, lower, h: bytes, prev: bytes | None, first: bool):
    """Where ``h`` is held as ``prev``'s child (any parent for the run's first block):
    ``(tier, block id / slot / hash, token ids)``, the device first; ``None``: nowhere."""
    for block in device:
        if block.content is not None and (first or block.parent_hash == prev):
            return "gpu", block.block_id, block.content.token_ids
    for tier in lower:
        entry = tier.get(h)
        if entry is not None and (first or entry.parent_hash == prev):
            return tier.name, (entry.slot if tier.name == "cpu" else h), entry.content.token_ids
    return None


def import_landed(engine: Engine, req: KVRequest, start: int, data: bytearray,
                  count: int) -> int:
    """Import the ``count`` landed blocks (chain blocks ``[start, start + count)`` of
    ``req``, their KV in ``data``) that this worker does not hold; returns how many.
    Raises if writing fails (nothing is cached then)."""
    kv, cache = engine.kv, engine.kv_cache
    res = kv.peer.reserve(req, start, count)
    if res is None:
        return 0
    lay = layout(engine)
    try:
        if engine.copies is not None:  # the evicted blocks' offloads read them first
            engine.copies.execute(kv.take_transfers())
        off, n = res.first - start, len(res.blocks)
        raw = torch.frombuffer(data, dtype=torch.uint8)[off * lay.block_bytes:
                                                        (off + n) * lay.block_bytes]
        rows = raw.view(cache.dtype).view(n, *lay.block_shape).to(cache.device)
        for j, block in enumerate(res.blocks):
            cache[:, :, block.block_id].copy_(rows[j])
    except BaseException:
        kv.peer.abort(res)
        raise
    finally:
        engine.settle_copies()
    return kv.peer.commit(res)
