"""The vLLM bridge: index a vLLM engine's blocks from its own KV events.

A floor beside ``worker/``, ``service/`` and ``client/``: it imports only ``kvmesh/`` and
itself, and never torch. ``engine_state`` turns one engine's event stream into kvmesh index
events; ``subscriber`` reads that stream over ZMQ, with replay for gaps and restarts.
"""
