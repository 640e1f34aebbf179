"""``kvmesh up --backend ray`` against an existing Ray cluster, stopped by SIGTERM.

The command connects to the package's local Ray through ``--ray-address`` (the path a real
cluster takes; starting a Ray of its own when no address is given is the same code with
``ray.init()`` and is exercised by hand, see docs/deploy.md), prints the service addresses,
serves, and on SIGTERM removes every actor it created.
"""
from __future__ import annotations

import re
import time

import grpc
import pytest
import ray
import redis

from client import KvmeshClient
from deploy.waiting import wait_until
from kvmesh.v1 import index_pb2, index_pb2_grpc
from service.worker_tokens import mint
from tests.integration.ray.conftest import kvmesh_actors
from tests.kvmesh_up import Up

SECRET = "ray-cli-worker-secret-0123456789"


def test_up_prints_service_addresses_and_sigterm_removes_every_actor(ray_cluster):
    """Also: ``--worker-secret`` (here from its env var) reaches the Ray backend, and the
    embedded Redis wants its password, which is printed only redacted; ``KVMESH_POLICY``,
    read by the driver (actors see none of its environment), is the replicas' policy."""
    up = Up("--backend", "ray", "--ray-address", ray_cluster.address, "--workers", "1",
            "--port", "0", "--num-blocks", "32",
            env={"KVMESH_WORKER_SECRET": SECRET, "KVMESH_POLICY": "round_robin"})
    try:
        assert up.wait_ready(150), up.tail()
        services = up.field("service")
        name = next(re.match(r"actors\s+(\S+)-\*", ln).group(1) for ln in up.lines
                    if ln.startswith("actors "))
        assert len(services) == 1
        assert kvmesh_actors(name) == [f"{name}-redis", f"{name}-service-0",
                                       f"{name}-worker-0"]
        assert f"service  {services[0]}  (policy round_robin)" in up.lines, up.tail()
        with KvmeshClient(services) as client:
            assert client.generate(list(range(40)), max_tokens=2).worker_id == f"{name}-w0"
            assert client.route(list(range(40))).policy == "round_robin"
        printed = up.field("redis")[0]
        assert printed.startswith("redis://:***@"), printed
        host, _, port = printed.rpartition("@")[2].partition("/")[0].rpartition(":")
        with redis.Redis(host=host, port=int(port), protocol=2) as anyone, \
                pytest.raises(redis.AuthenticationError):
            anyone.keys("*")
        with grpc.insecure_channel(services[0]) as ch:  # the worker's token, from SECRET
            hb = index_pb2_grpc.IndexServiceStub(ch).Heartbeat
            with pytest.raises(grpc.RpcError) as err:  # no token: refused
                hb(index_pb2.HeartbeatRequest(worker_id=f"{name}-w0"), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as err:  # its token, stale incarnation: past auth
                hb(index_pb2.HeartbeatRequest(worker_id=f"{name}-w0"), timeout=10,
                   metadata=[("authorization", f"Bearer {mint(SECRET, name + '-w0')}")])
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # on its own node the service answers on loopback too, as the local backend's does
        loopback = f"127.0.0.1:{services[0].rpartition(':')[2]}"
        with KvmeshClient([loopback], timeout=10) as client:
            assert [w["alive"] for w in client.stats()["workers"]] == [True]
        assert up.stop(60) == 0, up.tail()
        assert up.lines[-1] == "stopped"
        wait_until(lambda: not kvmesh_actors(name), timeout=15)
        groups = [g for g in ray.util.placement_group_table().values()
                  if g["name"].startswith(name)]
        assert groups and all(g["state"] == "REMOVED" for g in groups)
    finally:
        up.kill()


def test_a_model_the_worker_nodes_cannot_load_ends_in_one_line(ray_cluster, tmp_path):
    """On a Ray cluster the model path is the nodes' (the driver may lack it), so it is not
    checked before start; the worker actor's failed constructor is the cause, said at once
    (it used to wait out the 180 s start timeout) in the last line."""
    missing = tmp_path / "no-such-model"
    start = time.monotonic()
    up = Up("--backend", "ray", "--ray-address", ray_cluster.address, "--workers", "1",
            "--port", "0", "--model", str(missing))
    try:
        code = up.proc.wait(150)
        up.reader.join(10)
    finally:
        up.kill()
    out = "\n".join(up.lines)
    assert code == 1 and up.lines[-1].startswith("error: worker "), out
    assert str(missing) in up.lines[-1] and "--model" in up.lines[-1], out
    # Ray forwards the actor's own traceback (lines prefixed "(WorkerActor pid=...)"); the
    # launcher adds none
    own = [ln for ln in up.lines if "WorkerActor" not in ln]
    assert not any("Traceback" in ln for ln in own) and time.monotonic() - start < 120, out
