"""THE index link of a worker (kvmesh's own, or a vLLM engine's through the bridge).

:class:`Link` registers, heartbeats, publishes and resyncs over a :class:`Feed` of the
worker's events, load and snapshot; ``backlog`` bounds the events waiting for the service,
``conn`` moves between service replicas, ``request`` serializes ``PublishEvents``, and
``beat_thread`` gives the heartbeats a loop of their own.
"""
from kvmesh.link.backlog import Backlog, BatchLimits
from kvmesh.link.beat_thread import BeatThread
from kvmesh.link.feed import Feed
from kvmesh.link.link import Link
from kvmesh.link.request import Framed, publish_head, publish_request

__all__ = ["Backlog", "BatchLimits", "BeatThread", "Feed", "Framed", "Link", "publish_head",
           "publish_request"]
