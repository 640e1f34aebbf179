"""The service's one clock: milliseconds since the epoch, read through an injected callable.

Heartbeat times, liveness, purge deadlines, provisional-entry expiry and the degraded period
are all read from the ``Clock`` an ``IndexServicer`` (or ``create_server``) was given, never
from ``time`` directly, so tests drive time instead of sleeping through it. The default,
:func:`wall_ms`, is wall-clock time because replicas compare heartbeat times written by each
other into the shared index (keep their clocks NTP-synced).
"""
from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def wall_ms() -> int:
    """Now, in whole milliseconds since the epoch."""
    return int(time.time() * 1000)
