"""Peer fetch in the replay (``--peer-fetch``): a worker pulls a prefix from its holder.

When the kvmesh policy's route carries a fetch (``Ranked.fetch``), the chosen worker W, as
the request reaches the head of its queue and before it is admitted, imports the source's
blocks into its real ``KVCacheManager``: :func:`pull` allocates fresh device blocks and
caches them with the chain's hashes (a pseudo-request through the manager's own
``allocate_slots``, freed at once), so they are announced by W's ``PoolStored`` events and
hit afterwards exactly like W's own blocks. Only what the source still holds at that moment
is imported (it may have evicted part of it since the route), and W imports from its own
match on (it may have lost blocks of its own since). Nothing is copied: W's step is charged
``call + n * block`` seconds (:class:`FetchCost`, synchronous: the step that reads the
blocks waits for them) and the source a device gather of the blocks it serves.
"""
from __future__ import annotations

from dataclasses import dataclass

from service.policy.fetch import FetchCosts
from worker.kv_cache import KVCacheBlock, KVCacheManager, KVRequest

# The per-call figure is the groundwork's default (service.policy.fetch): ~1.2 ms for the
# control call, the ticket check and the source's read lease, until the data plane measures it.
CALL_S = 1.2e-3
# One RDMA NIC per GPU (200-400 Gb/s, GPUDirect: NIXL or Mooncake's transfer engine) moves a
# paged 2 MiB block at ~25 GB/s, the figure CostModel takes for the PCIe hop the block ends
# on: 84 us a block, 0.10x its 800 us recompute (the ratio the data plane's goal sets for a
# fetched block against its recompute, kvmesh bench transfer on the 8-layer model).
# `--fetch-us-per-block 2000` is the other figure reported: 1 GB/s, loopback on one host.
BYTES_PER_S = 25e9
# A device gather (read and write each byte once at the H100's 3.35 TB/s) stages the source's
# paged blocks for the NIC; the NIC reads device memory without the source's kernels.
GATHER_BYTES_PER_S = 1.6e12


@dataclass(frozen=True)
class FetchCost:
    """Seconds of one fetch, per call and per block of the replay's block size."""

    call_s: float
    block_s: float
    source_block_s: float

    @classmethod
    def of(cls, block_bytes: int, us_per_block: float | None = None,
           us_per_call: float | None = None) -> FetchCost:
        """The cost at ``block_bytes`` a block: the defaults above, or the given figures."""
        return cls(CALL_S if us_per_call is None else us_per_call / 1e6,
                   block_bytes / BYTES_PER_S if us_per_block is None else us_per_block / 1e6,
                   block_bytes / GATHER_BYTES_PER_S)

    def seconds(self, blocks: int) -> float:
        return self.call_s + blocks * self.block_s

    def costs(self, min_fetch_blocks: int) -> FetchCosts:
        """The router's settings (what the workers would report, the same figures)."""
        return FetchCosts(enabled=True, min_fetch_blocks=min_fetch_blocks,
                          us_per_call=self.call_s * 1e6, us_per_block=self.block_s * 1e6)


@dataclass
class FetchTotals:
    """Fetches a worker made: how many, the blocks planned and imported, their seconds."""

    fetches: int = 0
    planned_blocks: int = 0
    blocks: int = 0
    seconds: float = 0.0

    def add(self, other: FetchTotals) -> None:
        self.fetches += other.fetches
        self.planned_blocks += other.planned_blocks
        self.blocks += other.blocks
        self.seconds += other.seconds


@dataclass(frozen=True)
class Plan:
    """A route's fetch: blocks up to ``end`` (exclusive) of the chain, from ``source``."""

    source: int
    end: int
    blocks: int  # as planned, from the route's start block


def held(kv: KVCacheManager, req: KVRequest, end: int) -> list[KVCacheBlock]:
    """The device blocks holding the leading blocks of ``req``'s chain (at most ``end``) in
    ``kv`` now (its verified prefix, as an admission would hit it); changes nothing."""
    probe = KVRequest(req.request_id, req.token_ids[:end * kv.block_size + 1], salt=req.salt,
                      lora=req.lora, block_hashes=req.block_hashes[:end])
    return kv.get_computed_blocks(probe)[0]


def pull(dest: KVCacheManager, source: KVCacheManager, req: KVRequest,
         end: int) -> tuple[int, int]:
    """Import blocks of ``req``'s chain up to ``end`` that ``source`` holds and ``dest``
    lacks into ``dest`` (fresh device blocks, cached with the chain's hashes, left free
    like a finished request's); returns ``dest``'s match before and how many it imported
    (from there on). ``req`` must not be admitted yet, and its
    prompt must be longer than ``end`` blocks (a route's usable chain is)."""
    bs = dest.block_size
    end = len(held(source, req, end))
    hits = held(dest, req, end)
    start = len(hits)
    room = dest.num_free_blocks - sum(1 for b in hits if b.ref_cnt == 0)
    end = min(end, start + room)  # what fits, from the chain's start on
    if end <= start:
        return start, 0
    probe = KVRequest(f"{req.request_id}/fetch", req.token_ids[:end * bs], salt=req.salt,
                      lora=req.lora, block_hashes=req.block_hashes[:end],
                      num_prompt_tokens=end * bs)
    if dest.allocate_slots(probe, (end - start) * bs, hits, start * bs) is None:
        return start, 0
    dest.free(probe)
    return start, end - start
