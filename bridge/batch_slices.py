"""A large batch's events cut into slices of bounded work, applied in order, same result.

``EngineState`` applies a batch larger than ``caps.SLICE_BYTES`` slice by slice so that the
subscriber can give the shared ingest loop a turn in between (``bridge.caps`` says why).

Contract of :func:`slices`: the events in order, grouped so that no slice holds more than
``size`` units (a block hash is one unit; an event with none, such as ``VllmCleared``,
is one); an event of more than ``size`` blocks is cut into consecutive pieces. Applying the
slices one after the other gives the index the same blocks as applying the batch whole:

- a ``VllmRemoved`` piece holds the next hashes of the event (removals go in order);
- a ``VllmStored`` piece after the first names the last block of the piece before as its
  parent (held by then: the same chain), with its tokens and extra keys; a piece after the
  first never starts a chain, as no block but an event's first does. An event whose tokens
  do not cover its blocks exactly (or of another block size) cannot be rebuilt whole or in
  pieces: its pieces carry no tokens, so each is unroutable for the same reason.

Only the reason recorded for blocks below an unroutable block may differ (a later piece
counts them as ``parent_unroutable``); which blocks the index holds does not.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import msgspec

from kvmesh.events import vllm as ve


def units(events: Sequence[ve.VllmEvent]) -> int:
    """The work of a batch's events: block hashes, plus one per event without any."""
    return sum(len(ev.block_hashes) or 1 if ev.__class__ is not ve.VllmCleared else 1
               for ev in events)


def slices(events: Sequence[ve.VllmEvent], size: int, block_size: int
           ) -> Iterator[list[ve.VllmEvent]]:
    """``events`` in slices of at most ``size`` units (see the module contract)."""
    part: list[ve.VllmEvent] = []
    room = size
    for ev in events:
        for piece in _pieces(ev, size, block_size):
            n = len(piece.block_hashes) or 1 if piece.__class__ is not ve.VllmCleared else 1
            if n > room:
                yield part
                part, room = [], size
            part.append(piece)
            room -= n
    if part:
        yield part


def _pieces(ev: ve.VllmEvent, size: int, block_size: int) -> Iterator[ve.VllmEvent]:
    if ev.__class__ is ve.VllmCleared or len(ev.block_hashes) <= size:
        yield ev
        return
    hashes = ev.block_hashes
    n = len(hashes)
    if not isinstance(ev, ve.VllmStored):
        for i in range(0, n, size):
            yield msgspec.structs.replace(ev, block_hashes=hashes[i:i + size])
        return
    bs = block_size
    whole = ev.block_size == bs and ve.ids_len(ev.token_ids) == n * bs
    ids = ve.ids_list(ev.token_ids) if whole else []  # (not whole: no piece is rebuilt)
    keys = ev.extra_keys
    for i in range(0, n, size):
        j = min(i + size, n)
        yield msgspec.structs.replace(
            ev, block_hashes=hashes[i:j],
            parent_block_hash=ev.parent_block_hash if i == 0 else hashes[i - 1],
            token_ids=ids[i * bs:j * bs], extra_keys=None if keys is None else keys[i:j])
