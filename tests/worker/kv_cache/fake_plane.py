"""A fake data plane for the tier bookkeeping tests: "bytes" are content keys.

Every device block, CPU slot and disk file holds the key of the prefix its KV was computed
from (salt/extra keys and every token of the chain up to it). The plane executes the
manager's transfer orders in order, as the real one must, and tests compare what each
place holds with what the manager's books say it holds: a wrong slot, an order run too
late or a slot reused while a copy reads it shows up as a wrong key.
"""
from __future__ import annotations

from kvmesh.hashing import block_hashes, extra_keys
from worker.kv_cache import (
    BlockContent,
    BlockRemoved,
    BlockStored,
    Drop,
    KVCacheManager,
    KVRequest,
    Offload,
    Onboard,
    Spill,
)

BS = 2


def key_of(content: BlockContent | None) -> tuple:
    """The chain a content describes: ((tokens, extra keys) of block 0, ..., of this one)."""
    out = []
    while content is not None:
        out.append((content.token_ids, content.extra_keys))
        content = content.parent
    return tuple(reversed(out))


class FakePlane:
    def __init__(self, m: KVCacheManager) -> None:
        self.m = m
        self.device: dict[int, tuple] = {}
        self.cpu: dict[int, tuple] = {}
        self.disk: dict[bytes, tuple] = {}
        self.onboards: dict[str, list[tuple]] = {}  # request id -> what the copies read
        self.orders: list = []

    def prefix_keys(self, req: KVRequest, num_blocks: int) -> list[tuple]:
        """The content key of each of the first ``num_blocks`` blocks of ``req``."""
        bs = self.m.block_size
        chain: list = []
        out = []
        for i in range(num_blocks):
            start = i * bs
            chain.append((tuple(req.token_ids[start:start + bs]),
                          extra_keys(start, start + bs, salt=req.salt, lora=req.lora,
                                     mm=req.mm)))
            out.append(tuple(chain))
        return out

    def write(self, req: KVRequest) -> None:
        """The forward of ``req``: its full, computed blocks hold their prefix's KV."""
        ids = self.m.get_block_ids(req)
        n = min(req.num_computed_tokens // self.m.block_size, len(ids))
        for block_id, key in zip(ids, self.prefix_keys(req, n), strict=False):
            self.device[block_id] = key

    def check_hits(self, req: KVRequest, hits) -> None:
        """The KV of each cache hit is the request's own prefix (what attention will read)."""
        want = self.prefix_keys(req, len(hits))
        assert [self.device.get(b.block_id) for b in hits] == want

    def run(self) -> list:
        """Execute the manager's pending orders; the onboards' sources are read now."""
        orders = self.m.take_transfers()
        for order in orders:
            if isinstance(order, Offload):
                self.cpu[order.slot] = self.device.get(order.block_id, ("garbage",))
            elif isinstance(order, Spill):
                self.disk[order.block_hash] = self.cpu.get(order.cpu_slot, ("garbage",))
            elif isinstance(order, Drop):
                self.disk.pop(order.block_hash, None)
            else:
                assert isinstance(order, Onboard)
                self.onboards[order.request_id] = [
                    (block_id, self._read(tier, src)) for tier, src, block_id in order.copies]
        self.orders += orders
        return orders

    def _read(self, tier: str, src: int | bytes) -> tuple:
        if tier == "cpu":
            assert isinstance(src, int)
            return self.cpu.get(src, ("garbage",))
        assert tier == "disk" and isinstance(src, bytes)
        return self.disk.get(src, ("garbage",))

    def finish(self, request_id: str, ok: bool = True, failed=()) -> None:
        """The copy of ``request_id`` ends: its sources are read again (a source reused
        meanwhile would differ) and written to the device blocks."""
        order = next(o for o in reversed(self.orders)
                     if isinstance(o, Onboard) and o.request_id == request_id)
        copies = self.onboards.pop(request_id)
        if ok:
            for (tier, src, block_id), (_, first) in zip(order.copies, copies, strict=True):
                assert self._read(tier, src) == first, "a source changed during its copy"
                self.device[block_id] = first
        self.m.finish_onboard(request_id, ok, failed)

    def check(self) -> None:
        """What every place holds is what the manager's books say."""
        for holders in self.m.pool.cached.values():
            for block in holders.values():
                assert self.device.get(block.block_id) == key_of(block.content), block
        lower = self.m.offloader
        if lower is None:
            return
        for entry in lower.cpu:
            assert self.cpu.get(entry.slot) == key_of(entry.content), entry
        if lower.disk is not None:
            for entry in lower.disk:
                assert self.disk.get(entry.block_hash) == key_of(entry.content), entry


class Run:
    """A manager, its fake data plane and readable names for hashes."""

    def __init__(self, gpu=4, cpu=4, disk=0):
        self.m = KVCacheManager(gpu, BS, cpu_blocks=cpu, disk_blocks=disk)
        self.plane = FakePlane(self.m)
        self.names: dict[bytes, str] = {}
        self.n = 0

    def chain(self, name, tokens):
        """Name the full blocks of ``tokens`` ``name0``, ``name1``, ..."""
        hashes = block_hashes(tokens, BS)
        for i, h in enumerate(hashes):
            self.names[h] = f"{name}{i}"
        return hashes

    def run(self, tokens, name=None, free=True):
        """Admit a request for ``tokens``, compute it all (the forward), free it."""
        if name is not None:
            self.chain(name, tokens)
        req = KVRequest(f"r{self.n}", list(tokens))
        self.n += 1
        hits, n = self.m.get_computed_blocks(req)
        assert self.m.allocate_slots(req, req.num_tokens - n, hits, n) is not None
        req.num_computed_tokens = req.num_tokens
        self.plane.run()
        self.plane.write(req)
        if free:
            self.m.free(req)
        return req

    def events(self):
        out = []
        for e in self.m.take_events():
            if isinstance(e, BlockStored):
                out.append(("stored", e.tier, [self.names.get(h, "?") for h in e.block_hashes]))
            elif isinstance(e, BlockRemoved):
                out.append(("removed", e.tier, [self.names.get(h, "?") for h in e.block_hashes]))
            else:
                out.append(("cleared",))
        return out

    def lower(self, tier):
        """The tier's hashes, least recently used first."""
        t = self.m.offloader.cpu if tier == "cpu" else self.m.offloader.disk
        return [self.names.get(e.block_hash, "?") for e in t]
