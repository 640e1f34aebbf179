"""The KV tiers and eviction orders, named once for every layer (CLIs, worker, service).

A worker holds KV blocks in up to three tiers: ``gpu`` (the device pool the model reads; the
name stays ``gpu`` on a CPU-only worker), ``cpu`` (host memory) and ``disk`` (files). Its
device pool hands out free cached blocks in one of the ``EVICTIONS`` orders: ``lru`` (vLLM's)
or ``layered`` (decode-generated blocks before prefill-computed ones).
"""
from __future__ import annotations

TIERS = ("gpu", "cpu", "disk")
EVICTIONS = ("lru", "layered")
