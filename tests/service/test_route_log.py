"""``--route-log``: one JSON line per routing decision, private, with no prompt content."""
from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest

from kvmesh.ops.file_perms import UnsafePath, open_private_append
from service.config import ServiceConfig
from tests.service.manual_clock import ManualClock
from tests.service.protocol_worker import ProtocolWorker, route, serve

SALT = "tenant-secret-salt"
PROMPT = list(range(70_001, 70_041))  # 40 tokens, 10 blocks of 4; ids no load figure has


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_route_is_one_line_of_candidates_costs_loads_and_ages(tmp_path: Path) -> None:
    log = tmp_path / "replica.jsonl"
    clock = ManualClock()

    async def main() -> list[bytes]:
        async with serve(ServiceConfig(route_log=str(log)), clock=clock) as svc:
            a, b = ProtocolWorker(svc.stub, "a", port=9001), ProtocolWorker(svc.stub, "b",
                                                                            port=9002)
            await a.join(total_blocks=100, free_blocks=90, free_empty_blocks=50,
                         queued_prefill_tokens=8, running=1, decode_tokens=30)
            await b.join(total_blocks=100, free_blocks=100, free_empty_blocks=100)
            chain = await a.store(PROMPT, salt=SALT)
            clock.advance(250)
            await route(svc.stub, PROMPT, salt=SALT)                 # a: holds the prefix
            clock.advance(10)
            await route(svc.stub, PROMPT, salt=SALT)                 # a again, a pending
            await route(svc.stub, PROMPT, salt=SALT, dry_run=True)   # not logged
            await route(svc.stub, PROMPT, salt=SALT, policy="round_robin")
            return chain

    chain = asyncio.run(main())
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600
    first, second, rr = _lines(log)
    assert (first["policy"], first["prompt_tokens"], first["degraded"]) == ("kvmesh", 40, False)
    assert first["t_ms"] == clock() - 10
    best, other = first["candidates"]
    assert (best["worker"], other["worker"]) == ("a", "b")
    assert best["matched"] == {"gpu": 9, "cpu": 0, "disk": 0}  # the last token is computed
    assert best["load"] == {"running": 1, "waiting": 0, "queued_prefill_tokens": 8,
                            "free_blocks": 90, "free_empty_blocks": 50, "decode_tokens": 30,
                            "fetch_us_per_block": 0.0, "fetch_us_per_call": 0.0,
                            "peer_fetch": False}
    assert "fetch" not in best  # peer fetch is off by default
    assert best["load_age_ms"] == 250 and best["pending"] == {"requests": 0, "tokens": 0}
    for cand in first["candidates"]:
        assert sum(cand["terms"].values()) == pytest.approx(cand["cost"])
    assert best["cost"] < other["cost"]
    # the second decision saw the first one's routed work on top of a's reported load
    a2 = second["candidates"][0]
    assert a2["worker"] == "a" and a2["load_age_ms"] == 260
    assert a2["pending"] == {"requests": 1, "tokens": 4}
    assert a2["load"]["waiting"] == 1 and a2["load"]["queued_prefill_tokens"] == 8 + 4
    assert rr["policy"] == "round_robin" and "terms" not in rr["candidates"][0]
    # privacy: neither the salt, nor a token id, nor a block hash
    text = log.read_text()
    assert SALT not in text and "tenant" not in text
    assert not any(str(t) in text for t in PROMPT)
    assert not any(h.hex()[:16] in text for h in chain)


def test_off_by_default_and_no_file(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(ServiceConfig()) as svc:
            assert svc.server.servicer.router.route_log is None
            w = ProtocolWorker(svc.stub, "a")
            await w.join(total_blocks=10, free_blocks=10)
            await route(svc.stub, PROMPT)

    asyncio.run(main())
    assert list(tmp_path.iterdir()) == []


def test_the_file_is_appended_private_and_never_followed(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("old\n")
    path.chmod(0o644)
    fd = open_private_append(path, "--route-log")
    os.write(fd, b"new\n")
    os.close(fd)
    assert path.read_text() == "old\nnew\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # narrowed
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)
    with pytest.raises(OSError):
        open_private_append(link, "--route-log")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises((UnsafePath, OSError)):
        open_private_append(tmp_path / "fifo", "--route-log")
