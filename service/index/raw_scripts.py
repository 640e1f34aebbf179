"""The cluster backend's scripts called by SHA inside hand-packed batches (``nodes.py``):
the per-tag steps, and the control slot's begin and end steps of a batch or snapshot
(sent beside the batch's reads, and without redis-py's cluster command path, which cost
more than the step itself). The Lua text: ``cluster_scripts.py``.

A node that answers ``NOSCRIPT`` gets every one of ``RAW_SCRIPTS`` loaded and the calls
sent again (``ClusterBackend.wave``).
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

from service.index import cluster_scripts as cs
from service.index import resp
from service.index.shard_identity import TAG_IDENTITY_LUA

__all__ = ["APPLY_BEGIN", "APPLY_END", "PROV_KEYS", "RAW_SCRIPTS", "SYNC_BEGIN", "SYNC_END",
           "TAG_CLEAN", "TAG_FENCE", "TAG_IDENTITY", "TAG_WRITE", "RawScript"]


class RawScript:
    """A script and its SHA; :meth:`call` packs one ``EVALSHA`` with one key."""

    def __init__(self, script: str) -> None:
        self.script = script
        self.sha = hashlib.sha1(script.encode()).hexdigest().encode()

    def call(self, key: bytes, args: Sequence[bytes]) -> bytes:
        return resp.command(b"EVALSHA", self.sha, b"1", key, *args)


TAG_WRITE, TAG_CLEAN, PROV_KEYS, APPLY_BEGIN, APPLY_END, SYNC_BEGIN, SYNC_END = (
    RawScript(s) for s in (cs.TAG_WRITE, cs.TAG_CLEAN, cs.PROVISIONAL_KEYS, cs.APPLY_BEGIN,
                           cs.APPLY_END, cs.SYNC_BEGIN, cs.SYNC_END))
TAG_FENCE, TAG_IDENTITY = RawScript(cs.TAG_FENCE), RawScript(TAG_IDENTITY_LUA)
RAW_SCRIPTS = (TAG_WRITE, TAG_CLEAN, PROV_KEYS, APPLY_BEGIN, APPLY_END, SYNC_BEGIN, SYNC_END,
               TAG_FENCE, TAG_IDENTITY)
