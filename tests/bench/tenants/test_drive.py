"""`bench.tenants.drive`: what each run sends, its salts, and reading a worker's quota."""
from __future__ import annotations

from bench.tenants import drive
from bench.tenants.report import FLOODED, NO_FLOOD, QUOTAS
from bench.tenants.workload import FLOOD, TenantLoad, requests

REQS = requests(TenantLoad(system_tokens=32, question_tokens=4, flood_tokens=64,
                           duration_s=8.0, seed=1))


def test_no_flood_sends_the_victims_only_and_the_others_everything() -> None:
    assert any(r.tenant == FLOOD for r in REQS)
    calm = drive.run_requests(REQS, NO_FLOOD)
    assert calm == [r for r in REQS if r.tenant != FLOOD] and calm
    assert drive.run_requests(REQS, FLOODED) == drive.run_requests(REQS, QUOTAS) == REQS


def test_each_run_salts_apart() -> None:
    r = REQS[0]
    salts = {drive.salted(r, run) for run in (NO_FLOOD, FLOODED, QUOTAS)}
    assert len(salts) == 3 and all(s.startswith(f"{r.tenant}/") for s in salts)


def test_quota_blocks_reads_the_device_tier_of_the_tenant() -> None:
    stats = {"tenants": [
        {"tenant": "alpha", "tiers": [{"tier": "gpu", "quota_blocks": 0}]},
        {"tenant": FLOOD, "tiers": [{"tier": "gpu", "quota_blocks": 48},
                                    {"tier": "cpu", "quota_blocks": 400}]}]}
    assert drive.quota_blocks(stats, FLOOD) == 48
    assert drive.quota_blocks(stats, "alpha") == 0
    assert drive.quota_blocks(stats, "nobody") == 0 and drive.quota_blocks({}, FLOOD) == 0
