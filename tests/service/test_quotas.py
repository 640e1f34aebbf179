"""SetTenantQuota / GetTenantQuotas on a real service, and the quotas heartbeat answers carry
(``service.quotas``): validation, the version rule, the replica's refresh, start flags."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from kvmesh.quota import ALL_TENANTS, MAX_QUOTA_TENANTS, Quota, Quotas
from kvmesh.v1 import index_pb2 as pb
from service.config import ServiceConfig
from service.index.base import IndexUnavailable
from service.index.memory import MemoryBackend
from service.quotas import QuotaBook
from tests.grpc_codes import status_of
from tests.service.manual_clock import ManualClock
from tests.service.protocol_worker import ProtocolWorker, serve

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def set_req(tenant: str, clear: bool = False, **tiers: float) -> pb.SetTenantQuotaRequest:
    return pb.SetTenantQuotaRequest(quota=pb.TenantQuota(tenant=tenant, **tiers), clear=clear)


class CountingReads(MemoryBackend):
    """A memory backend counting quota reads; ``down`` makes them fail."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.down = False

    async def quotas(self) -> Quotas:
        self.reads += 1
        if self.down:
            raise IndexUnavailable("down for the test")
        return await super().quotas()


@pytest.mark.parametrize(("req", "says"), [
    (set_req("", gpu=0.5), "name a tenant"),
    (set_req("a b", gpu=0.5), "spaces"),
    (set_req("(other)", gpu=0.5), "reserved"),
    (set_req("x" * 65, gpu=0.5), "the limit is 64"),
    (set_req("a", gpu=1.5), "fraction in [0, 1]"),
    (set_req("a", cpu=float("nan")), "fraction in [0, 1]"),
    (set_req("a"), "give at least one of"),
    (set_req("a", clear=True, disk=0.1), "clear takes no fractions"),
])
def test_a_malformed_set_is_invalid_argument_and_changes_nothing(req, says) -> None:
    async def main() -> None:
        async with serve(ServiceConfig()) as r:
            code, details = await status_of(r.stub.SetTenantQuota(req))
            assert code == INVALID and says in details, details
            got = await r.stub.GetTenantQuotas(pb.GetTenantQuotasRequest())
            assert Quotas.from_proto(got.quotas) == Quotas() and got.quotas.version == 0

    asyncio.run(main())


def test_set_get_clear_over_rpc_and_the_tenant_limit() -> None:
    async def main() -> None:
        backend = MemoryBackend()
        async with serve(ServiceConfig(), backend) as r:
            res = await r.stub.SetTenantQuota(set_req("*", gpu=0.8, cpu=0.9))
            res = await r.stub.SetTenantQuota(set_req("a", gpu=0.3))
            want = Quotas(Quota(gpu=0.8, cpu=0.9), {"a": Quota(gpu=0.3)})
            assert Quotas.from_proto(res.quotas) == want and res.quotas.version == want.version
            got = await r.stub.GetTenantQuotas(pb.GetTenantQuotasRequest())
            assert got.quotas == res.quotas
            res = await r.stub.SetTenantQuota(set_req("a", clear=True))
            assert Quotas.from_proto(res.quotas) == Quotas(Quota(gpu=0.8, cpu=0.9))
            for i in range(MAX_QUOTA_TENANTS):
                await backend.set_quota(f"t{i}", Quota(gpu=0.1))
            code, details = await status_of(r.stub.SetTenantQuota(set_req("one-more", gpu=0.1)))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "clear one" in details
            assert (await status_of(r.stub.SetTenantQuota(set_req("t7", gpu=0.2))))[0] \
                == grpc.StatusCode.OK  # a tenant that has one may still change it

    asyncio.run(main())


def test_a_heartbeat_answer_carries_quotas_only_when_its_version_differs() -> None:
    async def main() -> None:
        async with serve(ServiceConfig()) as r:
            w = ProtocolWorker(r.stub, "w")
            await w.join()

            async def beat(version: int) -> pb.HeartbeatResponse:
                return await r.stub.Heartbeat(pb.HeartbeatRequest(
                    worker_id="w", last_seq=w.seq, incarnation=w.incarnation,
                    quota_version=version))

            assert not (await beat(0)).HasField("quotas")  # none set, none applied
            res = await r.stub.SetTenantQuota(set_req("a", gpu=0.3))
            version = res.quotas.version
            answer = await beat(0)  # this replica's copy is refreshed by its own set
            assert answer.HasField("quotas") and answer.quotas == res.quotas
            assert not (await beat(version)).HasField("quotas")
            assert (await beat(version + 2)).quotas == res.quotas  # any other version
            await r.stub.SetTenantQuota(set_req("a", clear=True))
            cleared = await beat(version)
            assert cleared.HasField("quotas") and cleared.quotas.version == 0
            assert Quotas.from_proto(cleared.quotas) == Quotas()

    asyncio.run(main())


def test_a_replica_rereads_the_store_once_per_refresh_interval() -> None:
    """Replica 2 keeps its copy (one read for any number of heartbeats) until the refresh
    interval passes, then sees replica 1's change; a failed read keeps the copy."""
    async def main() -> None:
        clock, backend = ManualClock(), CountingReads()
        one, two = (QuotaBook(ServiceConfig(), backend, clock) for _ in range(2))
        assert (await two.current()).version == 0
        reads = backend.reads
        await one.set(set_req("a", gpu=0.3))
        for _ in range(5):
            assert (await two.current()).version == 0
        assert backend.reads == reads + 1  # the set's limit check; none by replica two
        clock.advance(999)
        assert (await two.current()).version == 0
        clock.advance(1)
        new = await two.current()
        assert Quotas.from_proto(new) == Quotas(tenants={"a": Quota(gpu=0.3)})
        backend.down = True
        clock.advance(1000)
        assert await two.current() == new  # kept while the store is down

    asyncio.run(main())


def test_start_flags_override_those_tenants_stored_quotas() -> None:
    async def main() -> None:
        backend = MemoryBackend()
        await backend.set_quota("a", Quota(gpu=0.5))
        await backend.set_quota("b", Quota(cpu=0.2))
        cfg = ServiceConfig(tenant_quotas=(("a", 0.3),), default_tenant_quota=0.8)
        async with serve(cfg, backend) as r:
            got = Quotas.from_proto((await r.stub.GetTenantQuotas(
                pb.GetTenantQuotasRequest())).quotas)
            assert got == Quotas(Quota.uniform(0.8), {"a": Quota.uniform(0.3),
                                                      "b": Quota(cpu=0.2)})

    asyncio.run(main())


def test_start_flags_are_stored_once_the_store_answers() -> None:
    async def main() -> None:
        class DownFirst(MemoryBackend):
            down = True

            async def set_quota(self, tenant, quota):  # type: ignore[no-untyped-def]
                if self.down:
                    raise IndexUnavailable("not yet")
                return await super().set_quota(tenant, quota)

        backend = DownFirst()
        book = QuotaBook(ServiceConfig(default_tenant_quota=0.5), backend, ManualClock())
        with pytest.raises(IndexUnavailable):
            await book.write_start()
        assert book.starting
        backend.down = False
        await book.write_start()
        assert not book.starting and await backend.quotas() == Quotas(Quota.uniform(0.5))
        assert (await book.current()).default_quota.tenant == ALL_TENANTS

    asyncio.run(main())


@pytest.mark.parametrize(("fields", "says"), [
    (dict(default_tenant_quota=1.5), "fraction in [0, 1]"),
    (dict(tenant_quotas=(("a b", 0.3),)), "spaces"),
    (dict(tenant_quotas=(("a", -0.1),)), "fraction in [0, 1]"),
])
def test_bad_start_quotas_are_refused_at_config(fields, says) -> None:
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        ServiceConfig(**fields)
