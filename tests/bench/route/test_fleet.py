"""``bench.route.fleet``: the prefixes the route bench indexes for its workers."""
from __future__ import annotations

from bench.route.fleet import index_prompts


def test_fleet_prefixes_shrink_across_workers() -> None:
    """Worker i of W holds ceil((i+1)/W) of the chain: the last one holds it all."""
    class Recorder:
        ids = ["a", "b", "c", "d"]

        def __init__(self) -> None:
            self.held: dict[str, list[int]] = {w: [] for w in self.ids}

        def store(self, wid: str, chain: list[bytes]) -> None:
            self.held[wid].append(len(chain))

    rec = Recorder()
    chains = index_prompts(rec, {16: list(range(16)), 160: list(range(160))})  # type: ignore[arg-type]
    assert [len(c) for c in chains.values()] == [1, 10]
    assert rec.held == {"a": [1, 3], "b": [1, 5], "c": [1, 8], "d": [1, 10]}
