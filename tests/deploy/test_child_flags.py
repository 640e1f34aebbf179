"""The launchers never override a setting a child would have read from its environment.

``kvmesh up`` used to start its service with ``--policy kvmesh`` whatever ``KVMESH_POLICY``
said. The rule: a flag whose option also reads an environment variable is
passed to a child only when the user set it. These tests read each child command's options
from the CLI itself, so a flag added later falls under the rule too.
"""
from __future__ import annotations

import pytest
import typer

from client.cli import app
from deploy.local import ClusterSpec, LocalCluster
from deploy.ray.cluster import RayCluster
from deploy.ray.spec import RaySpec

# Flags a launcher must pass whatever the environment says, with the reason.
OWN = {
    "worker": {"--service": "the cluster's own service replicas, known only at start"},
}


def env_flags(command: str) -> dict[str, str]:
    """flag -> environment variable of every option of ``kvmesh COMMAND`` that reads one."""
    cmd = typer.main.get_command(app).get_command(None, command)
    out = {}
    for param in cmd.params:
        names = [param.envvar] if isinstance(param.envvar, str) else (param.envvar or [])
        for opt in getattr(param, "opts", []):
            if names:
                out[opt] = names[0]
    return out


def passed(args: list[str], flags: dict[str, str], own: dict[str, str]) -> list[str]:
    return [a for a in args if a in flags and a not in own]


def test_a_default_cluster_passes_no_flag_its_children_read_from_the_environment():
    cluster = LocalCluster(ClusterSpec(workers=1))
    service = cluster._service_args(0, 0)
    assert passed(service, env_flags("service"), {}) == [], service
    worker = cluster.add_worker("w0", start=False).cmd
    assert passed(worker, env_flags("worker"), OWN["worker"]) == [], worker


def test_the_flags_a_user_set_are_passed():
    """... and the audit above would see them: it can fail."""
    cluster = LocalCluster(ClusterSpec(policy="round_robin", hash_seed="s1"))
    service = cluster._service_args(0, 0)
    assert passed(service, env_flags("service"), {}) == ["--policy", "--hash-seed"]
    assert service[service.index("--policy") + 1] == "round_robin"


def test_the_ray_replicas_run_the_policy_the_driver_resolves(monkeypatch):
    """Ray actors see none of the driver's environment: the driver resolves the policy as a
    local replica would (the spec's, else ``KVMESH_POLICY``, else kvmesh) and hands it on."""
    monkeypatch.delenv("KVMESH_POLICY", raising=False)
    assert RayCluster(RaySpec())._service_settings()["policy"] == "kvmesh"
    monkeypatch.setenv("KVMESH_POLICY", "random")
    assert RayCluster(RaySpec())._service_settings()["policy"] == "random"
    chosen = RayCluster(RaySpec(policy="round_robin"))
    assert chosen._service_settings()["policy"] == chosen.policy == "round_robin"
    monkeypatch.setenv("KVMESH_POLICY", "fastest")
    with pytest.raises(ValueError, match="KVMESH_POLICY=fastest"):
        RayCluster(RaySpec())._service_settings()


def test_up_reads_the_policy_from_its_environment_as_the_service_does():
    assert env_flags("up")["--policy"] == env_flags("service")["--policy"] == "KVMESH_POLICY"


@pytest.mark.parametrize(("argv", "want"), [([], (None, None)),
                                            (["--peer-fetch", "--min-fetch-blocks", "6"],
                                             (True, 6)),
                                            (["--no-peer-fetch"], (False, None))])
def test_up_parses_the_peer_fetch_switches(argv: list[str], want: tuple) -> None:
    """``kvmesh up`` leaves the switch unset unless given (each child keeps its default)."""
    cmd = typer.main.get_command(app).get_command(None, "up")
    ctx = cmd.make_context("up", list(argv))
    assert (ctx.params["peer_fetch"], ctx.params["min_fetch_blocks"]) == want


def test_the_ray_replicas_get_the_peer_fetch_settings_only_when_set() -> None:
    assert "peer_fetch" not in RayCluster(RaySpec())._service_settings()
    settings = RayCluster(RaySpec(peer_fetch=True, min_fetch_blocks=3))._service_settings()
    assert (settings["peer_fetch"], settings["min_fetch_blocks"]) == (True, 3)


def test_the_ray_replicas_get_the_tenant_quotas_only_when_set() -> None:
    """Unset: no setting (the stored quotas stay); set: a ServiceConfig takes them as they are."""
    from service.config import ServiceConfig

    plain = RayCluster(RaySpec())._service_settings()
    assert "tenant_quotas" not in plain and "default_tenant_quota" not in plain
    settings = RayCluster(RaySpec(tenant_quotas=(("a", 0.3),),
                                  default_tenant_quota=0.8))._service_settings()
    cfg = ServiceConfig(**{k: settings[k] for k in ("tenant_quotas", "default_tenant_quota")})
    assert (cfg.tenant_quotas, cfg.default_tenant_quota) == ((("a", 0.3),), 0.8)
