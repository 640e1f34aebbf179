"""The Redis index's layout as code outside the service may read it: benchmarks that query
the keyspace their own way (``bench/index``) and tests that build block values by hand.

This is the one seam: such code imports these names from here, never the backend's
modules (``service.index.redis.keys`` may change shape; these names keep their meaning).
Read-only helpers, no I/O:

- :func:`block_key` the key of a block hash; :func:`tag` the tag index it falls under (one
  ``MGET`` per tag is a Redis Cluster's way to read a chain);
- :func:`entries` a block value's holders (handle -> tier bits); :func:`handle_bytes` a
  handle as it sits in a value (block values are sorted 4-byte entries: handle, tier bits);
- :func:`live_key` the namespace's live-handle map; :func:`live_map` its ``HGETALL`` reply
  as (version, handle -> worker id).
"""
from __future__ import annotations

from service.index.redis.keys import block_key, entries, handle_bytes, live_key, live_map, tag

__all__ = ["block_key", "entries", "handle_bytes", "live_key", "live_map", "tag"]
