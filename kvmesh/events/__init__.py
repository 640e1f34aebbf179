"""Block events, named by origin, one converter per boundary.

- ``pool``: a kvmesh worker pool's (``PoolStored``/``PoolRemoved``/``PoolCleared``,
  ``CacheSnapshot``); a removal names a hash once, when its last block goes.
- ``vllm``: vLLM's structs (``VllmStored``/``VllmRemoved``/``VllmCleared``; wire tags vLLM's
  own), their encodings and frames; a removal names every physical copy.
- ``to_index``: pool -> the index's protobuf messages (``kvmesh.v1.index_pb2``); ``wire``:
  the same messages' bytes, hand-encoded for the links' fast path.
Elsewhere: pool -> vLLM is ``worker.vllm.event_map``, vLLM -> index the bridge's
``index_events``, index message -> the service's ``IndexStored``... ``service.validate``.
"""
