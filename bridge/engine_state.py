"""One vLLM engine's cache as the kvmesh index sees it: pure state, no I/O.

Input: the engine's batches in ``seq`` order; output: index events numbered from 1, and
snapshots. Every engine hash maps to the kvmesh chain hash of the same block, rehashed with
the bridge's algo and seed; a block that cannot be rebuilt exactly (and its descendants) is
never indexed: the index may under-claim, never over-claim. Copies are counted per tier, so
the index hears ``stored``/``removed`` only on the first and last copy. ``check(seq)`` places
a batch (next, first, gap, behind).

See docs/architecture.md#bridge-engine-state.
"""
from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from bridge import caps
from bridge.batch_slices import slices, units
from bridge.copies import Copies
from bridge.extra_keys import Unroutable, block_extra, event_lora
from bridge.index_events import IndexEvents, snapshot_runs
from kvmesh.contract import DEFAULT_ALGO, TIERS
from kvmesh.events import vllm as ve
from kvmesh.hashing import Extra, Lora, chain_hashes, compiled_chain, none_hash
from kvmesh.v1 import index_pb2

TIER_INDEX = {t: i for i, t in enumerate(TIERS)}  # positions in PB_TIERS
MEMO_BLOCKS = 65_536  # the memo's default size where the chain hash runs in Python
_MEDIUM_INDEX = {m: TIER_INDEX[t] for m, t in ve.TIERS.items()}


class SeqCheck(enum.Enum):
    FIRST = "first"    # nothing applied since start or the last clear(): accept any seq
    NEXT = "next"      # the expected seq
    GAP = "gap"        # ahead of the expected seq: batches were lost
    BEHIND = "behind"  # at or before the last applied seq: a duplicate, or a restart


@dataclass
class StateStats:
    batches: int = 0
    stored_blocks: int = 0     # physical block copies stored, as the engine reported them
    removed_blocks: int = 0
    unknown_removes: int = 0
    ignored_events: int = 0    # other KV-cache groups, unknown mediums
    clears: int = 0            # VllmCleared received, or clear() called
    rehashed: int = 0          # blocks whose chain hash was computed
    memo_hits: int = 0         # blocks stored again whose chain hash the memo still had
    unroutable: Counter[str] = field(default_factory=Counter)  # by reason, per new block


class EngineState:
    """The index's view of one engine (one data-parallel rank); see the module contract.

    ``bulk=False`` applies every event block by block: the same results, slower (the
    reference the bulk paths are tested against). ``wire=True``: the index events come as
    ``kvmesh.events.wire.Wire`` (the same events, serialized as the link sends them; the bridge
    process's states), else as ``index_pb2.KvEvent`` messages."""

    def __init__(self, *, block_size: int, algo: str = DEFAULT_ALGO, seed: str | None = None,
                 loras: Mapping[str, str] | None = None, group: int = 0,
                 memo_blocks: int | None = None, bulk: bool = True, wire: bool = False,
                 max_blocks: int = caps.MAX_BATCH_BLOCKS) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.max_blocks = max_blocks  # units (``batch_slices.units``) one batch may hold
        self.algo = algo
        self.root = none_hash(algo, seed)
        self.loras = dict(loras or {})
        self.group = group
        self.stats = StateStats()
        self.out_seq = 0
        if memo_blocks is None:  # the module contract says why
            memo_blocks = 0 if compiled_chain(algo) else MEMO_BLOCKS
        self.memo_blocks = memo_blocks
        self.wire = wire
        # token ids left as msgpack bytes where C hashes them (no Python int per id); the
        # reference (bulk=False) decodes them as lists
        self._packed = bulk and compiled_chain(algo)
        self._copies = Copies(memo_blocks, bulk)
        # chain hash -> parent of every chain the index holds (the copies' map, cleared in
        # place, so this stays the same dict)
        self._held = self._copies.parent
        self._expected: int | None = None
        # the engine's timestamp of the last batch ingested (its wall clock); None after clear()
        self.last_ts: float | None = None
        self._anchor: tuple[int, bytes] | None = None

    # --- seq ------------------------------------------------------------------------------

    @property
    def expected(self) -> int | None:
        """The next seq wanted; ``None`` before the first batch and after ``clear()``."""
        return self._expected

    @property
    def replay_from(self) -> int:
        """Where a replay request starts: the last applied seq (its payload proves the engine
        is the same process), or 0 when nothing was applied."""
        return self._anchor[0] if self._anchor else 0

    def check(self, seq: int) -> SeqCheck:
        if self._expected is None:
            return SeqCheck.FIRST
        if seq == self._expected:
            return SeqCheck.NEXT
        return SeqCheck.GAP if seq > self._expected else SeqCheck.BEHIND

    def is_anchor(self, seq: int, payload: bytes) -> bool:
        """Whether (seq, payload) is the last batch applied: same engine process, no loss."""
        return self._anchor is not None and self._anchor == (seq, payload)

    def ingest(self, seq: int, payload: bytes) -> list[index_pb2.KvEvent]:
        """Apply the batch ``seq`` whole: ``ingest_parts``'s index events in one list."""
        out: list[index_pb2.KvEvent] | None = None
        for part in self.ingest_parts(seq, payload):
            if out is None:
                out = part  # (the one part of nearly every batch: no copy)
            else:
                out += part
        return out if out is not None else []

    def ingest_parts(self, seq: int, payload: bytes) -> Iterator[list[index_pb2.KvEvent]]:
        """Apply the batch ``seq`` (FIRST or NEXT only, else ``ValueError``), yielding its
        index events slice by slice (``bridge.batch_slices``: one slice unless the payload
        is over ``caps.SLICE_BYTES``); the seq position moves once the last is out. Between
        two slices the state holds the slices before, and its ``out_seq`` counts exactly
        the events yielded: a snapshot taken meanwhile is consistent.

        Bad input raises ``ve.MalformedBatch`` (a ``ValueError``), whatever failed: a payload
        that does not decode or holds more than ``max_blocks`` units changes nothing; one
        whose events fail to apply leaves slices applied, and the caller must ``clear()``
        (it treats the batch as lost)."""
        kind = self.check(seq)
        if kind not in (SeqCheck.FIRST, SeqCheck.NEXT):
            raise ValueError(f"batch seq {seq} is {kind.value}; expected {self._expected}")
        batch = ve.decode_batch(payload, self._packed)
        events: Iterable[list] = (batch.events,)
        if len(payload) > caps.SLICE_BYTES:  # (a block is a byte at least: under it, few)
            n = units(batch.events)
            if n > self.max_blocks:
                raise ve.MalformedBatch(f"batch {seq} holds {n} blocks and events; the limit "
                                        f"is {self.max_blocks}")
            events = slices(batch.events, caps.SLICE_BLOCKS, self.block_size)
        self.stats.batches += 1
        for part in events:
            try:
                out = self._events(part)
            except Exception as e:  # noqa: BLE001 (crafted events: a lost batch, not a crash)
                raise ve.MalformedBatch(f"batch {seq} does not apply ({type(e).__name__}: "
                                        f"{e!s:.200})") from e
            yield out
        self._expected, self._anchor = seq + 1, (seq, payload)
        self.last_ts = batch.ts

    def clear(self) -> list[index_pb2.KvEvent]:
        """Forget every block and the seq position; the index hears one ``cleared``."""
        self._expected = self._anchor = None
        self.last_ts = None
        runs = IndexEvents(self._next_out, self.wire)
        self._forget(runs)
        return runs.events

    # --- events ---------------------------------------------------------------------------

    def apply(self, batch: ve.KVEventBatch) -> list[index_pb2.KvEvent]:
        """Apply one batch's events (no seq bookkeeping) and return the index events."""
        self.stats.batches += 1
        return self._events(batch.events)

    def _events(self, events: list[ve.VllmEvent]) -> list[index_pb2.KvEvent]:
        runs = IndexEvents(self._next_out, self.wire)
        # vLLM's block pool emits one BlockRemoved per evicted block: consecutive removals of
        # one tier are released as one list (the same result: ``release`` goes in order)
        # (``bulk=False``: each event on its own, the reference)
        gone: list = []
        gone_tier, bulk, group, removed = -1, self._copies.bulk, self.group, ve.VllmRemoved
        for ev in events:
            if ev.__class__ is removed:  # as ``_tier``, inline: there is one per block
                t = _MEDIUM_INDEX.get(ev.medium)
                if t is None or (ev.group_idx or 0) != group:
                    self.stats.ignored_events += 1
                    continue
                if gone and (t != gone_tier or not bulk):
                    self._release(gone, gone_tier, runs)
                    gone = []
                gone_tier = t
                gone += ev.block_hashes
                continue
            if gone:
                self._release(gone, gone_tier, runs)
                gone = []
            if isinstance(ev, ve.VllmStored):
                self._stored(ev, runs)
            else:
                self._forget(runs)
        if gone:
            self._release(gone, gone_tier, runs)
        runs.flush()
        return runs.events

    def _tier(self, ev: ve.VllmStored | ve.VllmRemoved) -> int | None:
        tier = _MEDIUM_INDEX.get(ev.medium)
        if tier is None or (ev.group_idx or 0) != self.group:
            self.stats.ignored_events += 1
            return None
        return tier

    def _stored(self, ev: ve.VllmStored, runs: IndexEvents) -> None:
        t = self._tier(ev)
        if t is None:
            return
        bs, hashes = self.block_size, ev.block_hashes
        n = len(hashes)
        reason: str | None = None
        lora = None
        if ev.block_size != bs or ve.ids_len(ev.token_ids) != n * bs:
            reason = "block_size"
        elif ev.lora_name is not None or ev.lora_id is not None:
            try:
                lora = event_lora(ev.lora_name, ev.lora_id, self.loras)
            except Unroutable as e:
                reason = e.reason
        cp = self._copies
        blocks, memo = cp.chain, cp.memo
        if ev.parent_block_hash is None:
            parent: bytes | None = b""
        else:
            parent = blocks.get(ev.parent_block_hash)
            if ev.parent_block_hash not in blocks and reason is None:
                reason = "orphan"
        self.stats.stored_blocks += n
        if (cp.bulk and n and blocks.keys().isdisjoint(hashes)
                and (not memo or memo.keys().isdisjoint(hashes)) and len(set(hashes)) == n):
            # the common case: a run of new blocks, rebuilt and held in bulk
            chains, _ = self._rebuild(ev, 0, n, parent, lora, reason)
            cp.hold_new(hashes, chains, parent, t, runs)
            return
        i = 0
        while i < n:
            h = hashes[i]
            if h not in blocks and parent is not None and reason is None:
                chain = memo.pop(h, None)
                if chain is not None:
                    blocks[h] = chain
                    self.stats.memo_hits += 1
            if h in blocks:
                parent = cp.hold(h, parent, t, runs)
                i += 1
                continue
            # a run of new engine hashes: rebuilt with one chain_hashes call (each token
            # encoded once), the rest of the event being the common case
            j = i + 1
            while j < n and hashes[j] not in blocks and hashes[j] not in memo:
                j += 1
            chains, reason = self._rebuild(ev, i, j, parent, lora, reason)
            for k in range(i, j):
                blocks.setdefault(hashes[k], chains[k - i])  # a hash repeated in the run
                parent = cp.hold(hashes[k], parent, t, runs)
            i = j

    def _rebuild(self, ev: ve.VllmStored, i: int, j: int, parent: bytes | None,
                 lora: Lora | None, reason: str | None
                 ) -> tuple[list[bytes | None], str | None]:
        """The chain hashes of the event's blocks ``[i, j)`` (all new) below ``parent``
        (``b""``: the root; ``None``: unroutable), ``None`` from the first block that cannot
        be rebuilt on; and the reason that stopped the chain, if any."""
        out: list[bytes | None] = []
        if parent is not None and reason is None:
            keys, first = ev.extra_keys, ev.parent_block_hash is None
            extras: list[Extra] | None = None
            if keys or lora is not None:
                extras = []
                for k in range(i, j):
                    try:
                        extras.append(block_extra(keys[k] if keys and k < len(keys) else None,
                                                  lora, first and k == 0))
                    except Unroutable as e:
                        reason = e.reason
                        break
            bs, tokens = self.block_size, ev.token_ids
            m = j - i if extras is None else len(extras)
            if i or (i + m) * bs != ve.ids_len(tokens):  # the whole event needs no copy
                tokens = ve.ids_list(tokens)[i * bs:(i + m) * bs]
            out = chain_hashes(parent or self.root, tokens, bs, extras, self.algo)
            self.stats.rehashed += m
        if len(out) < j - i:
            self.stats.unroutable[reason or "parent_unroutable"] += j - i - len(out)
            out.extend([None] * (j - i - len(out)))
        return out, reason

    def _release(self, hashes: list, t: int, runs: IndexEvents) -> None:
        unknown = self._copies.release(hashes, t, runs)
        self.stats.unknown_removes += unknown
        self.stats.removed_blocks += len(hashes) - unknown

    def _forget(self, runs: IndexEvents) -> None:
        self.stats.clears += 1
        self._copies.clear()
        runs.cleared()

    def _next_out(self) -> int:
        self.out_seq += 1
        return self.out_seq

    # --- snapshot -------------------------------------------------------------------------

    @property
    def indexed_blocks(self) -> int:
        """Chain hashes the index holds for this engine (any tier)."""
        return len(self._copies.parent)

    def held(self, chain: bytes) -> set[str]:
        """The tiers on which the index holds ``chain`` for this engine."""
        on = self._copies.held_on(chain)
        return {t for t, i in TIER_INDEX.items() if on[i]}

    def snapshot(self) -> tuple[int, list[index_pb2.BlockStored]]:
        """(``out_seq``, the index's whole view) for ``SyncWorker``: per tier, runs of chained
        blocks, each run one ``BlockStored`` whose ``parent_hash`` is its first block's."""
        cp = self._copies
        return self.out_seq, snapshot_runs(
            (chain, parent, cp.held_on(chain)) for chain, parent in cp.parent.items())
