"""Copies per tier of one engine's blocks, counted by engine hash and by chain hash.

``EngineState``'s bookkeeping: the index hears ``stored`` when a (chain hash, tier) goes from
no copy to one and ``removed`` when it goes back to none. The bulk forms give exactly the
state and events of the per-block forms, and run only when their preconditions hold.

See docs/architecture.md#bridge-engine-state.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from itertools import repeat

from bridge.index_events import IndexEvents


class Copies:
    """One engine's copies (see the module docstring). ``bulk=False``: every change block by
    block, the reference the bulk forms are tested against."""

    def __init__(self, memo_blocks: int, bulk: bool = True) -> None:
        self.memo_blocks = memo_blocks
        self.bulk = bulk
        self.chain: dict[Hashable, bytes | None] = {}
        self.copies: tuple[set, set, set] = (set(), set(), set())
        self.extra: tuple[dict, dict, dict] = ({}, {}, {})
        self.parent: dict[bytes, bytes] = {}
        self.on: tuple[set, set, set] = (set(), set(), set())
        self.more: tuple[dict, dict, dict] = ({}, {}, {})
        # an OrderedDict: finding a plain dict's oldest entry scans every slot deleted before
        # it, which made a full memo (65,536 blocks) cost more than the rest of the bridge
        self.memo: OrderedDict[Hashable, bytes] = OrderedDict()

    def clear(self) -> None:
        for part in (self.chain, self.parent, self.memo, *self.copies, *self.extra, *self.on,
                     *self.more):
            part.clear()

    def held_on(self, chain: bytes) -> tuple[bool, bool, bool]:
        """Whether ``chain`` is held, per tier."""
        on = self.on
        return chain in on[0], chain in on[1], chain in on[2]

    # --- storing --------------------------------------------------------------------------

    def hold(self, h: Hashable, parent: bytes | None, t: int, runs: IndexEvents
             ) -> bytes | None:
        """One more copy on tier ``t`` of ``h`` (``chain[h]`` already set; ``parent``: the
        chain hash of the block before it). Returns ``h``'s chain hash: the next parent."""
        chain = self.chain[h]
        ct = self.copies[t]
        if h in ct:
            xt = self.extra[t]
            xt[h] = xt.get(h, 0) + 1
            return chain
        ct.add(h)
        if chain is not None:
            on_t = self.on[t]
            if chain in on_t:
                mt = self.more[t]
                mt[chain] = mt.get(chain, 0) + 1
            else:
                on_t.add(chain)
                p = self.parent.get(chain)
                if p is None:
                    p = self.parent[chain] = parent or b""
                runs.stored(chain, p, t)
        return chain

    def hold_new(self, hashes: Sequence[Hashable], chains: list[bytes | None],
                 parent: bytes | None, t: int, runs: IndexEvents) -> None:
        """``hold`` of each of ``hashes`` in order, with ``chains`` their chain hashes: a
        chained run below ``parent`` whose routable blocks come first. Precondition: the
        hashes are distinct and none is held on any tier."""
        self.chain.update(zip(hashes, chains, strict=True))
        self.copies[t].update(hashes)
        m = len(chains)
        if chains[-1] is None:
            m = chains.index(None)
            chains = chains[:m]
        if not m:
            return
        pmap = self.parent
        if len(set(chains)) == m and pmap.keys().isdisjoint(chains):
            pmap.update(zip(chains, [parent or b"", *chains[:-1]], strict=True))
            self.on[t].update(chains)
            runs.stored_run(chains, parent or b"", t)
            return
        on_t, mt = self.on[t], self.more[t]
        for chain in chains:  # a chain hash held already: count it per block
            if chain in on_t:
                mt[chain] = mt.get(chain, 0) + 1
            else:
                on_t.add(chain)
                p = pmap.get(chain)
                if p is None:
                    p = pmap[chain] = parent or b""
                runs.stored(chain, p, t)
            parent = chain

    # --- removing -------------------------------------------------------------------------

    def release(self, hashes: Sequence[Hashable], t: int, runs: IndexEvents) -> int:
        """One copy fewer on tier ``t`` of each of ``hashes``, in order; returns how many of
        them had no copy there (unknown removes, which change nothing)."""
        ct, xt = self.copies[t], self.extra[t]
        if ct.isdisjoint(hashes):  # none held there (stored before a clear): change nothing
            return len(hashes)
        if self.bulk and self._release_fast(hashes, t, runs):
            return 0
        unknown = 0
        for h in hashes:
            if h not in ct:
                unknown += 1
                continue
            x = xt.get(h)
            if x:
                if x == 1:
                    del xt[h]
                else:
                    xt[h] = x - 1
                continue
            ct.discard(h)
            chain = self.chain[h]
            if chain is not None:
                self._drop_chain(chain, t, runs)
            c0, c1, c2 = self.copies
            if h not in c0 and h not in c1 and h not in c2:
                del self.chain[h]
                if chain is not None:
                    self._remember([h], [chain])
        return unknown

    def _drop_chain(self, chain: bytes, t: int, runs: IndexEvents) -> None:
        mt = self.more[t]
        y = mt.get(chain)
        if y:
            if y == 1:
                del mt[chain]
            else:
                mt[chain] = y - 1
            return
        on = self.on
        on[t].discard(chain)
        runs.removed(chain, t)
        if chain not in on[0] and chain not in on[1] and chain not in on[2]:
            del self.parent[chain]

    def _release_fast(self, hashes: Sequence[Hashable], t: int, runs: IndexEvents) -> bool:
        """The whole removal in bulk when it is the common case: distinct hashes, each the
        only copy on tier ``t`` of a hash held on no other tier, whose chain hashes (distinct)
        no other engine hash or tier holds. ``False`` (nothing changed) otherwise."""
        hs = set(hashes)
        ct = self.copies[t]
        if len(hs) != len(hashes) or not hs <= ct:
            return False
        xt, mt, on_t = self.extra[t], self.more[t], self.on[t]
        if xt and not xt.keys().isdisjoint(hs):
            return False
        for o in self.copies:
            if o and o is not ct and not o.isdisjoint(hs):
                return False
        chain = self.chain
        chains = list(map(chain.pop, hashes))
        routable = chains if None not in chains else [c for c in chains if c is not None]
        cs = set(routable)
        # two of the hashes with one chain hash would have put it in ``more[t]``
        ok = not (mt and not mt.keys().isdisjoint(cs))
        for o in self.on:
            if ok and o and o is not on_t and not o.isdisjoint(cs):
                ok = False
        if not ok:
            chain.update(zip(hashes, chains, strict=True))  # as it was: go block by block
            return False
        ct.difference_update(hs)
        on_t.difference_update(cs)
        deque(map(self.parent.pop, routable), 0)
        runs.removed_run(routable, t)
        if routable is chains:
            self._remember(hashes, chains)
        else:
            kept = [h for h, c in zip(hashes, chains, strict=True) if c is not None]
            self._remember(kept, routable)
        return True

    def _remember(self, hashes: Sequence[Hashable], chains: Sequence[bytes]) -> None:
        """Engine hashes whose last copy went, with their chain hashes, newest last; the
        oldest go past ``memo_blocks``."""
        cap, memo = self.memo_blocks, self.memo
        if not cap:
            return
        memo.update(zip(hashes, chains, strict=True))
        if len(memo) > cap:
            deque(map(memo.popitem, repeat(False, len(memo) - cap)), 0)  # the oldest
