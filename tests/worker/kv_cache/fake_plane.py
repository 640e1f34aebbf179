"""A fake data plane for the tier bookkeeping tests: "bytes" are content keys.

Every device block, CPU slot and disk file holds the key of the prefix its KV was computed
from (salt/extra keys and every token of the chain up to it). The plane executes the
manager's transfer orders in order, as the real one must, and tests compare what each
place holds with what the manager's books say it holds: a wrong slot, an order run too
late or a slot reused while a copy reads it shows up as a wrong key.

Failures, as the real executor (worker/kv_io/copy_executor.py) has them: ``fail("offload")`` makes
the next batch of consecutive offloads fail (their slots hold garbage and are bad),
``fail("write")`` the next spill's file write (a partial file is left). A spill of a bad slot
writes nothing; an onboard reading a bad slot or a missing/partial file fails. Each copy
that did not happen is reported to the manager (``copies_lost``) at the end of :meth:`run`,
as the engine does after executing a step's orders.
"""
from __future__ import annotations

from kvmesh.events.pool import PoolRemoved, PoolStored
from kvmesh.hashing import block_hashes, extra_keys
from worker.kv_cache import (
    BlockContent,
    Drop,
    KVCacheManager,
    KVRequest,
    Lost,
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
        self.failing: set[str] = set()  # "offload" / "write": the next one fails
        self.bad: set[int] = set()       # CPU slots whose offload failed
        self.slot_hash: dict[int, bytes] = {}
        self.lost: list[Lost] = []       # every copy reported lost, in order

    def fail(self, kind: str) -> None:
        """Make the next offload batch (``"offload"``) or file write (``"write"``) fail."""
        assert kind in ("offload", "write")
        self.failing.add(kind)

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
        """Execute the manager's pending orders; the onboards' sources are read now. Copies
        that failed are reported to the manager at the end (and the orders that causes,
        the ``Drop`` of a lost disk entry, run too)."""
        orders = self.m.take_transfers()
        lost: list[Lost] = []
        batch_fails = False  # the current run of consecutive offloads fails as one
        for k, order in enumerate(orders):
            if isinstance(order, Offload):
                if k == 0 or not isinstance(orders[k - 1], Offload):
                    batch_fails = "offload" in self.failing
                    self.failing.discard("offload")
                self.slot_hash[order.slot] = order.block_hash
                if batch_fails:
                    self.cpu[order.slot] = ("garbage",)
                    self.bad.add(order.slot)
                    lost.append(Lost("cpu", order.block_hash, order.slot))
                else:
                    self.cpu[order.slot] = self.device.get(order.block_id, ("garbage",))
                    self.bad.discard(order.slot)
            elif isinstance(order, Spill):
                good = (order.cpu_slot not in self.bad
                        and self.slot_hash.get(order.cpu_slot) == order.block_hash)
                if good and "write" in self.failing:
                    self.failing.discard("write")
                    self.disk[order.block_hash] = ("garbage",)  # a partial file
                    good = False
                if good:
                    self.disk[order.block_hash] = self.cpu.get(order.cpu_slot, ("garbage",))
                else:
                    lost.append(Lost("disk", order.block_hash))
            elif isinstance(order, Drop):
                self.disk.pop(order.block_hash, None)
            else:
                assert isinstance(order, Onboard)
                self.onboards[order.request_id] = [
                    (block_id, self._read(tier, src), self._readable(tier, src))
                    for tier, src, block_id in order.copies]
        self.orders += orders
        if lost:
            self.lost += lost
            self.m.copies_lost(lost)
            orders += self.run()
        return orders

    def _readable(self, tier: str, src: int | bytes) -> bool:
        if tier == "cpu":
            return src not in self.bad
        return self.disk.get(src, ("garbage",)) != ("garbage",)

    def _read(self, tier: str, src: int | bytes) -> tuple:
        if tier == "cpu":
            assert isinstance(src, int)
            return self.cpu.get(src, ("garbage",))
        assert tier == "disk" and isinstance(src, bytes)
        return self.disk.get(src, ("garbage",))

    def finish(self, request_id: str, ok: bool = True, failed=()) -> None:
        """The copy of ``request_id`` ends: its sources are read again (a source reused
        meanwhile would differ) and written to the device blocks. A copy whose source was
        unreadable when read fails the onboard (named in ``failed``), whatever ``ok``."""
        order = next(o for o in reversed(self.orders)
                     if isinstance(o, Onboard) and o.request_id == request_id)
        copies = self.onboards.pop(request_id)
        failed = set(failed)
        for (tier, src, _), (_, _, readable) in zip(order.copies, copies, strict=True):
            if not readable:  # the real copy stops at the first that raises
                ok = False
                failed.add((tier, self.slot_hash[src] if tier == "cpu" else src))
                break
        if ok:
            for (tier, src, block_id), (_, first, _) in zip(order.copies, copies, strict=True):
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

    def run(self, tokens, name=None, free=True, tenant="default"):
        """Admit a request of ``tenant`` for ``tokens``, compute it all (the forward), free
        it."""
        if name is not None:
            self.chain(name, tokens)
        req = KVRequest(f"r{self.n}", list(tokens), tenant=tenant)
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
            if isinstance(e, PoolStored):
                out.append(("stored", e.tier, [self.names.get(h, "?") for h in e.block_hashes]))
            elif isinstance(e, PoolRemoved):
                out.append(("removed", e.tier, [self.names.get(h, "?") for h in e.block_hashes]))
            else:
                out.append(("cleared",))
        return out

    def lower(self, tier):
        """The tier's hashes, least recently used first."""
        t = self.m.offloader.cpu if tier == "cpu" else self.m.offloader.disk
        return [self.names.get(e.block_hash, "?") for e in t]
