"""The index's view of one worker, rebuilt from the index events a bridge emits."""
from __future__ import annotations

from kvmesh.v1 import index_pb2


class IndexView:
    """Applies index events as the index does: ``held`` is ``{(hash, tier): parent}``.

    Fails on what the index must never see: a (hash, tier) stored twice without a removal in
    between, a removal of what is not held, an event seq that does not follow the last one."""

    def __init__(self, check_seq: bool = True) -> None:
        self.held: dict[tuple[bytes, int], bytes] = {}
        self.seq = 0
        self.cleared = 0
        self.check_seq = check_seq

    def apply(self, events: list[index_pb2.KvEvent]) -> IndexView:
        for ev in events:
            if self.check_seq:
                assert ev.seq == self.seq + 1, f"index event seq {ev.seq} after {self.seq}"
            self.seq = ev.seq
            which = ev.WhichOneof("event")
            if which == "stored":
                parent = ev.stored.parent_hash
                for h in ev.stored.block_hashes:
                    assert (h, ev.stored.tier) not in self.held, "stored twice, no removal"
                    self.held[(h, ev.stored.tier)] = parent
                    parent = h
            elif which == "removed":
                for h in ev.removed.block_hashes:
                    del self.held[(h, ev.removed.tier)]  # KeyError: never stored
            else:
                self.held.clear()
                self.cleared += 1
        return self


def view(events: list[index_pb2.KvEvent], check_seq: bool = True) -> dict:
    """``held`` after applying ``events`` to an empty view."""
    return IndexView(check_seq).apply(events).held
