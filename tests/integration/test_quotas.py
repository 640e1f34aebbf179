"""Tenant quotas across processes' parts: two service replicas over one Valkey answer the
same quotas (and their heartbeat answers converge), ``kvmesh quota set | show`` drive a
real service with its admin token, and ``kvmesh up``'s quota flags end in ``quota show``."""
from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from client.cli import app
from deploy.waiting import eventually
from kvmesh.quota import Quota, Quotas
from kvmesh.v1 import index_pb2 as pb
from service.config import ServiceConfig
from tests.kvmesh_up import Up
from tests.service.protocol_worker import ProtocolWorker, serve

pytestmark = pytest.mark.integration


def test_two_replicas_over_one_valkey_answer_the_same_quotas(redis_url: str) -> None:
    cfg = ServiceConfig(backend="redis", redis_url=redis_url)

    async def main() -> None:
        async with serve(cfg) as one, serve(cfg) as two:
            w = ProtocolWorker(two.stub, "w")
            await w.join()
            beat = pb.HeartbeatRequest(worker_id="w", last_seq=w.seq,
                                       incarnation=w.incarnation)
            assert not (await two.stub.Heartbeat(beat)).HasField("quotas")
            await one.stub.SetTenantQuota(pb.SetTenantQuotaRequest(
                quota=pb.TenantQuota(tenant="a", gpu=0.3)))
            await one.stub.SetTenantQuota(pb.SetTenantQuotaRequest(
                quota=pb.TenantQuota(tenant="b", disk=0.1)))
            get = pb.GetTenantQuotasRequest()
            a, b = [await r.stub.GetTenantQuotas(get) for r in (one, two)]
            assert a.quotas == b.quotas
            assert Quotas.from_proto(b.quotas) == Quotas(tenants={"a": Quota(gpu=0.3),
                                                                  "b": Quota(disk=0.1)})
            # replica two's heartbeats carry them within its refresh interval
            answer = await eventually(lambda: two.stub.Heartbeat(beat),
                                      lambda r: r.quotas.version == a.quotas.version,
                                      within=5)
            assert answer.quotas == a.quotas

    asyncio.run(main())


def test_kvmesh_quota_set_and_show_against_a_real_service() -> None:
    runner = CliRunner()
    cfg = ServiceConfig(token="r-tok", worker_token="w-tok", admin_token="adm-tok")

    async def main() -> None:
        async with serve(cfg) as r:
            def cli(*args: str, token: str = "adm-tok"):
                return asyncio.to_thread(runner.invoke, app, [
                    "quota", *args, "--service", r.address, "--admin-token", token])

            res = await cli("set", "acme", "--gpu", "0.3", "--cpu", "0.5")
            assert res.exit_code == 0 and "the quota of 'acme' set" in res.output, res.output
            res = await cli("set", "--default", "--gpu", "0.8")
            assert res.exit_code == 0, res.output
            res = await cli("show", "--json")
            shown = json.loads(res.stdout)
            want = Quotas(Quota(gpu=0.8), {"acme": Quota(gpu=0.3, cpu=0.5)})
            assert shown == {"version": want.version, "default": {"gpu": 0.8},
                             "tenants": {"acme": {"gpu": 0.3, "cpu": 0.5}}}
            res = await cli("show")
            assert res.exit_code == 0 and "acme" in res.stdout and "0.3" in res.stdout
            assert str(want.version) in res.stdout
            res = await cli("set", "acme", "--clear")
            assert res.exit_code == 0 and "cleared" in res.output
            res = await cli("show", "--json", token="r-tok")  # the router token: refused
            assert res.exit_code == 1 and "UNAUTHENTICATED" in res.output, res.output
            res = await cli("set", "acme", "--gpu", "1.5")  # refused by the CLI: exit 2
            assert res.exit_code == 2
            res = await cli("set", "a b", "--gpu", "0.5")  # refused by the service
            assert res.exit_code == 1 and "INVALID_ARGUMENT" in res.output
            res = await cli("set", "acme")  # no tier, no clear
            assert res.exit_code == 2 and "--clear" in res.output
            got = await r.stub.GetTenantQuotas(pb.GetTenantQuotasRequest(),
                                               metadata=(("authorization", "Bearer adm-tok"),))
            assert Quotas.from_proto(got.quotas) == Quotas(Quota(gpu=0.8))

    asyncio.run(main())


def test_kvmesh_up_stores_its_quota_flags() -> None:
    """... and its --admin-token guards them: without it `quota show` is refused."""
    up = Up("--workers", "1", "--port", "0", "--num-blocks", "64", "--tenant-quota", "a=0.3",
            "--default-tenant-quota", "0.8", "--admin-token", "adm-tok-up")
    try:
        assert up.wait_ready(120), up.tail()
        (service,) = up.field("service")
        refused = CliRunner().invoke(app, ["quota", "show", "--service", service])
        assert refused.exit_code != 0, refused.output
        res = CliRunner().invoke(app, ["quota", "show", "--json", "--service", service,
                                       "--admin-token", "adm-tok-up"])
        assert res.exit_code == 0, res.output
        want = Quotas(Quota.uniform(0.8), {"a": Quota.uniform(0.3)})
        assert json.loads(res.stdout) == {
            "version": want.version, "default": {"gpu": 0.8, "cpu": 0.8, "disk": 0.8},
            "tenants": {"a": {"gpu": 0.3, "cpu": 0.3, "disk": 0.3}}}
        assert up.stop(30) == 0, up.tail()
    finally:
        up.kill()
