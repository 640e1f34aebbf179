"""Tenant quotas over the heartbeat (``kvmesh.link.beats``), against both adapters: a
heartbeat carries the version the side applies; quotas in an answer are applied (a kvmesh
worker's pool) or acknowledged (a bridge rank: vLLM cannot enforce them), after which the
answers stop carrying them; malformed quotas are ignored and the old version kept."""
from __future__ import annotations

import asyncio

from kvmesh.quota import Quota, Quotas
from kvmesh.v1 import index_pb2 as pb
from tests.kvmesh.link.fake_index import FakeIndex
from tests.kvmesh.link.test_link import linked, side, until  # noqa: F401 - side: a fixture

QUOTAS = Quotas(Quota(gpu=0.8), {"a": Quota(gpu=0.3, cpu=0.5)})


def test_a_heartbeat_answer_with_quotas_is_applied_then_acknowledged(side) -> None:  # noqa: F811
    async def main():
        index = FakeIndex()
        async with linked(side, index) as link:
            assert all(b.quota_version == 0 for b in index.of("Heartbeat"))
            index.quotas = QUOTAS.to_proto()
            await until(lambda: link.quota_version == QUOTAS.version, lambda: link.counters)
            if side.name == "worker":  # the pool's own quotas; the bridge only acknowledges
                assert side.runner.engine.kv.quotas == QUOTAS
            n = len(index.of("Heartbeat"))
            await until(lambda: len(index.of("Heartbeat")) >= n + 2)
            assert index.of("Heartbeat")[-1].quota_version == QUOTAS.version
            assert link.counters["quota_updates"] == 1  # sent once, applied once
            index.quotas = Quotas().to_proto()  # cleared: version 0 again
            await until(lambda: link.quota_version == 0, lambda: link.counters)
            if side.name == "worker":
                assert side.runner.engine.kv.quotas == Quotas()

    asyncio.run(main())


def test_malformed_quotas_are_ignored_and_the_old_kept(side) -> None:  # noqa: F811
    async def main():
        index = FakeIndex()
        async with linked(side, index) as link:
            index.quotas = QUOTAS.to_proto()
            await until(lambda: link.quota_version == QUOTAS.version)
            bad = pb.TenantQuotas(default_quota=pb.TenantQuota(tenant="*", gpu=2.0),
                                  version=7)
            index.quotas = bad
            if side.name == "bridge":  # acknowledged whatever it holds: it applies nothing
                await until(lambda: link.quota_version == 7)
                return
            await until(lambda: link.counters["bad_quotas"] >= 2, lambda: link.counters)
            assert link.quota_version == QUOTAS.version
            assert side.runner.engine.kv.quotas == QUOTAS

    asyncio.run(main())
