"""Offload: blocks evicted from the device pool move down the lower tiers instead of vanishing.

:class:`Offloader` owns the CPU and optional disk tier of one worker, hooks the pool's
evictions and records the copy orders the data plane executes. A hash moves down when its
LAST device block goes; orphans are never offloaded; events go through the pool's one seq
stream, arrival below before departure above; a copy reported lost takes its entry out at
once, so a block whose bytes were never written is never announced or onboarded. A block
keeps its owner (the tenant charged for it) all the way down; a tier making room for one
tenant's block picks its victim by the quota rules (``LowerTier.victim``).

See docs/architecture.md#worker-kv-cache.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from kvmesh.hashing import hash_block, none_hash

from .block import BlockContent, Extra
from .block_pool import BlockPool, Evicted
from .lower_tier import LowerTier, TierEntry
from .transfers import Drop, Lost, Offload, Spill, Transfer

# A block read back from a disk file at start: (block_hash, parent_hash, token_ids, extra_keys).
DiskEntry = tuple[bytes, bytes | None, Sequence[int], Extra]


class Offloader:
    """The lower tiers below one device pool (``cpu_blocks`` > 0; ``disk_blocks`` >= 0)."""

    def __init__(self, pool: BlockPool, cpu_blocks: int, disk_blocks: int = 0) -> None:
        self.pool = pool
        self.cpu = LowerTier("cpu", cpu_blocks)
        self.disk = LowerTier("disk", disk_blocks) if disk_blocks else None
        self.tiers = [self.cpu] if self.disk is None else [self.cpu, self.disk]
        self.device_offloads = 0  # hashes moved from the device pool down to the CPU tier
        self._transfers: list[Transfer] = []
        self._files_read: dict[bytes, int] = {}  # dropped disk entries still read, per hash
        pool.on_evict = self.offload

    def take_transfers(self) -> list[Transfer]:
        """Orders recorded since the last call, oldest first."""
        out, self._transfers = self._transfers, []
        return out

    def order(self, transfer: Transfer) -> None:
        self._transfers.append(transfer)

    def holds(self, block_hash: bytes) -> bool:
        """Whether any tier (device included) holds ``block_hash``."""
        return (block_hash in self.pool.cached
                or any(block_hash in tier for tier in self.tiers))

    # --- offload ----------------------------------------------------------------------

    def offload(self, evicted: list[Evicted]) -> None:
        """The pool's eviction hook: move these hashes (gone from the device) to the CPU."""
        batch = {e.block_hash: e for e in evicted}
        reachable: dict[bytes, bool] = {}
        for e in evicted:
            self._carry_class(e)
            if not self._reachable(e.block_hash, batch, reachable):
                continue
            held = self.cpu.get(e.block_hash)
            if held is not None:  # inclusive tiers: it came back from here, or a collision
                if held.content.same_as(e.content):
                    self.cpu.touch(held)
                    self._moved(e)
                continue
            if not self._make_room(self.cpu, e.owner):
                continue  # every CPU entry is being read: the block is dropped
            entry = self.cpu.add(e.block_hash, e.parent_hash, e.content, e.decoded, e.owner)
            self.order(Offload(e.block_id, entry.slot, e.block_hash))
            self.pool.emit_stored([e.block_hash], e.parent_hash, list(e.content.token_ids),
                                  "cpu")
            self._moved(e)

    def _moved(self, e: Evicted) -> None:
        """The device eviction ``e`` is held below: a move down, not a drop."""
        self.device_offloads += 1
        self.pool.ledger.moved_down(e.owner)

    def _carry_class(self, e: Evicted) -> None:
        """The device's latest eviction class (``decoded``: a hit inside a prompt may have
        cleared it since the block came up) wins on every tier holding the same block."""
        for tier in self.tiers:
            held = tier.get(e.block_hash)
            if held is not None and held.content.same_as(e.content):
                held.decoded = e.decoded

    def _reachable(self, block_hash: bytes, batch: dict[bytes, Evicted],
                   memo: dict[bytes, bool]) -> bool:
        """Whether ``block_hash`` (of ``batch``) hangs from block 0 through held blocks or
        reachable blocks of the same batch. Iterative: a batch may be one long chain."""
        path: list[bytes] = []
        h: bytes | None = block_hash
        result = True
        while h is not None and h in batch and h not in memo:
            path.append(h)
            parent = batch[h].parent_hash
            if parent is None:
                h = None
            elif parent in batch:
                h = parent
            else:
                result = self.holds(parent)
                h = None
        if h is not None and h in memo:
            result = memo[h]
        for p in path:
            memo[p] = result
        return memo[block_hash]

    def _make_room(self, tier: LowerTier, owner: str) -> bool:
        """Free a slot of ``tier`` if it is full, for a block of ``owner``: move its victim
        (``LowerTier.victim``) down or drop it. ``False`` when every entry is being read."""
        if tier.num_free_slots:
            return True
        victim = tier.victim(owner)
        if victim is None:
            return False
        if tier is self.cpu and self._spill(victim):
            tier.offloads += 1
        else:
            tier.evicted(victim)
        self._remove(tier, victim)
        return True

    def _spill(self, entry: TierEntry) -> bool:
        """Put a CPU entry on disk (before it leaves the CPU); whether it is held there now."""
        disk = self.disk
        if disk is None:
            return False
        held = disk.get(entry.block_hash)
        if held is not None:
            if not held.content.same_as(entry.content):
                return False
            disk.touch(held)
            held.decoded = entry.decoded
            return True
        if not self._make_room(disk, entry.owner):
            return False
        disk.add(entry.block_hash, entry.parent_hash, entry.content, entry.decoded, entry.owner)
        content = entry.content
        self.order(Spill(entry.slot, entry.block_hash, entry.parent_hash, content.token_ids,
                         content.extra_keys))
        self.pool.emit_stored([entry.block_hash], entry.parent_hash, list(content.token_ids),
                              "disk")
        return True

    def _remove(self, tier: LowerTier, entry: TierEntry) -> None:
        tier.remove(entry)
        self.pool.emit_removed([entry.block_hash], tier.name)
        if tier is not self.disk:
            return
        h = entry.block_hash
        if entry.dropped:  # a copy still reads its file: delete it after the last one
            self._files_read[h] = self._files_read.get(h, 0) + 1
        elif h not in self._files_read:
            self.order(Drop(h))

    def release(self, tier: LowerTier, entry: TierEntry) -> None:
        """A copy reading ``entry`` is done; the file of a dropped disk entry is deleted
        once nothing reads it (unless the hash is back on disk: then it is that entry's)."""
        if not tier.release(entry) or tier is not self.disk:
            return
        h = entry.block_hash
        self._files_read[h] -= 1
        if not self._files_read[h]:
            del self._files_read[h]
            if h not in tier:
                self.order(Drop(h))

    def drop(self, tier: LowerTier, entry: TierEntry) -> None:
        """Drop ``entry`` from ``tier`` (a failed copy read it): ``PoolRemoved(<tier>)``.
        A no-op if the entry already left the tier."""
        if tier.get(entry.block_hash) is entry:
            tier.evicted(entry)
            self._remove(tier, entry)

    def forget_lost(self, lost: Iterable[Lost]) -> int:
        """Drop the entries these failed copies were to fill (see the module docstring);
        an entry that already left its tier, or is another copy's now (a CPU hash in
        another slot), is left alone. Returns how many entries were dropped."""
        n = 0
        for item in lost:
            tier = self.cpu if item.tier == "cpu" else self.disk
            entry = None if tier is None else tier.get(item.block_hash)
            if entry is None or (item.slot is not None and entry.slot != item.slot):
                continue
            self.drop(tier, entry)
            n += 1
        return n

    def clear(self) -> None:
        """Forget every lower entry, without events (``PoolCleared`` covers them)."""
        for tier in self.tiers:
            for entry in tier.clear():
                if tier is self.disk:
                    self.order(Drop(entry.block_hash))

    # --- restart ----------------------------------------------------------------------

    def restore_disk(self, entries: Iterable[DiskEntry], block_size: int, hash_algo: str,
                     hash_seed: str | None) -> list[bytes]:
        """Rebuild the disk tier from its files at start (``entries`` oldest first).

        Kept: entries whose hash is the hash of their parent, tokens and extra keys (so a
        file of another seed or algo, or a corrupted header, is never served), with
        ``block_size`` tokens, hanging from block 0 through kept entries, the newest that
        fit. One ``PoolStored(disk)`` per chain run. Returns the kept hashes; the caller
        deletes the other files.
        """
        disk = self.disk
        if disk is None:
            raise ValueError("no disk tier (disk_blocks=0)")
        root = none_hash(hash_algo, hash_seed)
        valid: dict[bytes, tuple[bytes | None, tuple[int, ...], Extra]] = {}
        for block_hash, parent_hash, token_ids, extra in entries:
            parent_hash = parent_hash or None  # a file format may write block 0's as b""
            tokens, extra = tuple(int(t) for t in token_ids), _tuples(extra)
            if (len(tokens) == block_size and block_hash not in valid and block_hash not in disk
                    and hash_block(parent_hash or root, tokens, extra, hash_algo) == block_hash):
                valid[block_hash] = (parent_hash, tokens, extra)
        newest = list(valid)[-disk.num_free_slots:] if disk.num_free_slots else []
        kept = dict.fromkeys(newest)
        contents: dict[bytes, BlockContent] = {}
        for h in newest:
            self._restore_chain(h, kept, valid, contents)
        restored = [h for h in newest if h in contents]
        for h in restored:
            disk.add(h, valid[h][0], contents[h])
        for run in _chain_runs(restored, {h: valid[h][0] for h in restored}):
            self.pool.emit_stored(run, valid[run[0]][0],
                                  [t for h in run for t in valid[h][1]], "disk")
        return restored

    def _restore_chain(self, block_hash: bytes, kept: dict[bytes, None],
                       valid: dict[bytes, tuple[bytes | None, tuple[int, ...], Extra]],
                       contents: dict[bytes, BlockContent]) -> None:
        """Build the content of ``block_hash`` and its kept ancestors, parents first; an
        entry whose ancestor is missing gets none (an orphan)."""
        path: list[bytes] = []
        h: bytes | None = block_hash
        parent: BlockContent | None = None
        while h is not None and h not in contents:
            if h not in kept:  # an ancestor is missing: the whole path is orphaned
                for p in path:
                    del kept[p]  # later walks stop here at once
                return
            path.append(h)
            h = valid[h][0]
            if h is None:
                break
        if h is not None:
            parent = contents[h]
        for p in reversed(path):
            _, tokens, extra = valid[p]
            parent = contents[p] = BlockContent(parent, tokens, extra)


def _tuples(extra: object) -> Extra:
    """Extra keys as nested tuples (a file format may have turned them into lists)."""
    if extra is None:
        return None
    return tuple(tuple(k) for k in extra)  # type: ignore[union-attr]


def _chain_runs(hashes: list[bytes], parents: dict[bytes, bytes | None]) -> Iterator[list[bytes]]:
    """``hashes`` ordered parents first and cut into runs of consecutive chain blocks."""
    children: dict[bytes | None, list[bytes]] = {}
    for h in hashes:
        children.setdefault(parents[h], []).append(h)
    stack = [h for h in reversed(hashes) if parents[h] not in parents]
    run: list[bytes] = []
    while stack:
        h = stack.pop()
        if run and parents[h] != run[-1]:
            yield run
            run = []
        run.append(h)
        stack.extend(reversed(children.get(h, ())))
    if run:
        yield run
