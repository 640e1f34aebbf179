"""What a link asks of the side it speaks for: its events, its load, its snapshot.

A kvmesh worker (its engine's pool) and the vLLM bridge (an ``EngineState`` fed by a vLLM
engine) each implement this for :class:`kvmesh.link.link.Link`. Events reach the link by
:meth:`Link.queue` on its events loop; everything here is asked by the link.

Contract: event seqs are consecutive (1, 2, 3, ...); a snapshot taken at seq S reflects
every event up to S and none after, so the link drops the queued events up to S and sends
the later ones, nothing applied twice or missed.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from kvmesh.link.request import Framed
from kvmesh.v1 import index_pb2

E = TypeVar("E")


class Feed(Protocol[E]):
    """The data source of one link (``E``: the side's event type; how many block hashes
    one carries is the link's ``Backlog``'s to say)."""

    def wire(self, batch: Sequence[E]) -> Sequence[index_pb2.KvEvent | Framed]:
        """``batch`` as ``PublishEvents`` carries it, in order, seqs kept."""
        ...

    async def load(self) -> index_pb2.WorkerLoad | None:
        """The load to heartbeat (or register with); None: none can be told now (the
        engine does not answer), so no heartbeat is sent."""
        ...

    def load_changed(self, since: index_pb2.WorkerLoad) -> bool:
        """Whether the load moved since the heartbeat that carried ``since`` enough to
        beat early (any thread; cheap)."""
        ...

    def model(self) -> str | None:
        """The model to register with (asked after :meth:`load`); None: not known yet."""
        ...

    async def snapshot(self) -> tuple[int, Sequence[index_pb2.BlockStored]]:
        """(seq, every block held as of that seq) for ``SyncWorker``."""
        ...

    async def quotas(self, quotas: index_pb2.TenantQuotas) -> None:
        """Apply the tenant quotas a heartbeat answer carries (or acknowledge them, for a
        side that cannot enforce them). Raises ``ValueError`` for quotas it cannot apply
        (``kvmesh.quota.Quotas.from_proto``): the side keeps what it has."""
        ...
