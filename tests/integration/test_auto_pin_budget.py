"""Automatic pins and the admin's pins share the cap, over real processes (Valkey, a service with
router and admin tokens, one
worker started with ``--auto-pin``): traffic under the caller's own salt fills the worker's
pin cap with automatic pins, yet the admin's ``PinPrefix`` still pins (automatic pins give
way), and a pin the cap cuts short says so all the way to the client and the CLI."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from client.cli import app
from deploy.local import ClusterSpec, LocalCluster
from deploy.waiting import wait_until
from worker.kv_cache.tier_config import TierConfig

ROUTER, ADMIN = "autopin-router-token", "autopin-admin-token"
BS = 4
CAP = 4  # 10% of 40 blocks
SYSTEM = list(b"SYSTEM: You are ACME support. Be kind.  ")  # 10 full blocks
OTHER = list(b"Another system prompt, nothing in common")  # 10 full blocks


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster(ClusterSpec(workers=1, num_blocks=40, block_size=BS, token=ROUTER,
                                 tiers=TierConfig(auto_pin=True),
                                 extra_service_args=["--admin-token", ADMIN]))
    c.start(timeout=120)
    yield c
    c.stop()


def test_hot_traffic_cannot_starve_the_admins_pin(cluster: LocalCluster) -> None:
    with cluster.client(admin_token=ADMIN) as client:
        address = cluster.workers[0].address

        def pinned() -> int:
            return client.worker_stats(address)["pinned_blocks"]

        attacker = [ord("x")] * 24 + [ord("!")]  # 6 full blocks, hot after 8 hits
        for _ in range(10):
            client.generate(attacker, max_tokens=1, salt="attacker-own-salt")
        wait_until(lambda: pinned() == CAP, timeout=10)  # automatic pins fill the cap
        res = client.pin(SYSTEM, ttl_s=600, max_workers=1)
        [w] = res.workers
        assert not w.error and w.pinned_blocks == CAP  # the automatic pins gave way
        assert (w.chain_blocks, w.cap_reached) == (10, True) and res.capped == [w]
        assert pinned() == CAP
        # the cap is now full of explicit pins: hot traffic takes none of it back...
        for _ in range(10):
            client.generate(attacker, max_tokens=1, salt="attacker-own-salt")
        assert client.pin(SYSTEM, ttl_s=600).workers[0].pinned_blocks == CAP
        # ...and another explicit pin is told the cap stopped it, not handed a silent 0
        res = client.pin(OTHER, ttl_s=600, max_workers=1)
        assert [(w.pinned_blocks, w.chain_blocks, w.cap_reached, w.error)
                for w in res.workers] == [(0, 10, True, "")]
    env = {"KVMESH_SERVICE": ",".join(cluster.service_addresses), "KVMESH_TOKEN": ROUTER,
           "KVMESH_ADMIN_TOKEN": ADMIN}
    out = CliRunner().invoke(app, ["pin", "--text", bytes(OTHER).decode(), "--max-workers",
                                   "1"], env=env)
    assert out.exit_code == 1, out.output
    assert "pinned 0 of 10 blocks: pin cap reached" in out.stdout
