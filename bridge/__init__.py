"""The vLLM bridge: index vLLM engines' blocks from their own KV events (``kvmesh bridge vllm``).

A floor beside ``worker/``, ``service/`` and ``client/``: it imports only ``kvmesh/`` and
itself, and never torch. Per engine rank: ``subscriber`` reads the event stream over ZMQ
(replay for gaps and restarts) into an ``engine_state`` (engine hash -> kvmesh chain hash,
copy counts, index events and snapshots; ``extra_keys`` rebuilds salts, LoRA and multimodal
keys; ``index_events`` builds the messages), and ``link`` keeps the index in step
(register, heartbeat the load ``engine_load`` scrapes from ``/metrics``, publish, resync;
``pending`` holds what waits). ``config`` says what is bridged, ``main`` runs it, ``metrics``
reports on it, ``cli`` is the verb. ``docs/vllm.md`` is the operator's page.
"""
