"""A clock the test moves by hand (a ``service.clock.Clock``): time passes only on
``advance``, so a test of liveness, purge or expiry never sleeps through a timeout."""
from __future__ import annotations


class ManualClock:
    """Starts at ``start_ms`` (default: a realistic epoch time) and never moves by itself."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> int:
        """Move ``ms`` forward (never back: heartbeat times only grow); returns the new now."""
        if ms < 0:
            raise ValueError("a clock only moves forward")
        self.now_ms += ms
        return self.now_ms
