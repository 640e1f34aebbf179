"""``kvmesh up`` routes with the policy its user asked for.

A real ``kvmesh up``: its service must answer every Route that names no policy with the one
given by ``--policy`` or by ``KVMESH_POLICY`` (the flag winning over the variable), and its
output says which one runs. It used to start the service with ``--policy kvmesh`` whatever
the environment said, and had no ``--policy``. (The Ray backend: tests/integration/ray/test_cli.py.)
"""
from __future__ import annotations

import pytest

from client import KvmeshClient
from tests.kvmesh_up import Up

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("args, env, runs", [
    (["--policy", "round_robin"], {}, "round_robin"),
    ([], {"KVMESH_POLICY": "round_robin"}, "round_robin"),
    (["--policy", "least_loaded"], {"KVMESH_POLICY": "random"}, "least_loaded"),
], ids=["flag", "env", "flag-over-env"])
def test_the_policy_asked_for_is_the_one_that_routes(args, env, runs):
    up = Up("--workers", "1", "--port", "0", "--num-blocks", "64", *args, env=env)
    try:
        assert up.wait_ready(120), up.tail()
        services = up.field("service")
        assert services and all(f"service  {a}  (policy {runs})" in up.lines
                                for a in services), up.tail()
        with KvmeshClient(services) as client:
            assert client.route(list(range(64))).policy == runs
            assert client.route(list(range(64)), policy="kvmesh").policy == "kvmesh"
        assert up.stop(30) == 0, up.tail()
    finally:
        up.kill()
