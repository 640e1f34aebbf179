"""A large batch's events cut into slices of bounded work, applied in order, same result.

:func:`slices` groups the events so no slice holds more than ``size`` units, cutting an event
into consecutive pieces (a stored piece names the previous piece's last block as parent);
applying the slices in order gives the index the same blocks as the batch whole (only the
recorded reason for blocks below an unroutable one may differ).

See docs/architecture.md#bridge-ingest-and-recovery.
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
