"""``ClusterSpec``'s per-run settings of the children: cost weights, the route log, and the
source tree they run (``code_dir``: a git revision's, for ``kvmesh bench e2e --against``)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from deploy.local import ClusterSpec, LocalCluster

# Stands in for `python -m service` / `python -m worker`: says which file it was imported
# from where a real server says where it listens (the line ServerProcess waits for).
_FAKE_MAIN = """import {pkg}, sys, time
print("listening on " + {pkg}.__file__, flush=True)
time.sleep(60)
"""


def _fake_tree(root: Path) -> Path:
    for pkg in ("service", "worker"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
        (root / pkg / "__main__.py").write_text(_FAKE_MAIN.format(pkg=pkg))
    return root


def test_children_import_the_code_dir_not_the_installed_tree(tmp_path: Path) -> None:
    tree = _fake_tree(tmp_path / "rev")
    cluster = LocalCluster(ClusterSpec(code_dir=str(tree), redis_url="redis://unused:1"))
    try:
        service = cluster.start_service(0)
        worker = cluster.add_worker("worker-0")
        assert service.address == str(tree / "service" / "__init__.py")
        assert worker.address == str(tree / "worker" / "__init__.py")
        assert service.cmd[0] == sys.executable  # the same interpreter and site-packages
    finally:
        cluster.stop(timeout=5)


def test_without_a_code_dir_children_run_this_tree() -> None:
    proc = LocalCluster(ClusterSpec(redis_url="redis://unused:1"))._child(
        "s", "service", [], {})
    assert proc.cwd is None and proc.env.get("PYTHONPATH") == os.environ.get("PYTHONPATH")


def test_cost_weights_and_route_log_reach_every_replica_and_only_when_set(
        tmp_path: Path) -> None:
    plain = LocalCluster(ClusterSpec(redis_url="redis://unused:1"))
    args = plain._service_args(0, 0)
    assert "--cost-weight" not in args and "--route-log" not in args  # old services start
    spec = ClusterSpec(redis_url="redis://unused:1", service_replicas=2,
                       cost_weights={"saturation_weight": 0.0, "wait_weight": 0.5},
                       route_log_dir=str(tmp_path / "logs"))
    cluster = LocalCluster(spec)
    for i in range(2):
        args = cluster._service_args(0, i)
        weights = [args[j + 1] for j, a in enumerate(args) if a == "--cost-weight"]
        assert weights == ["saturation_weight=0.0", "wait_weight=0.5"]
        assert args[args.index("--route-log") + 1] == str(tmp_path / "logs" /
                                                          f"service-{i}.jsonl")


def test_peer_fetch_reaches_services_and_workers_only_when_set(monkeypatch) -> None:
    """Unset: no flag (each child's default). Set: the services get the switch and
    --min-fetch-blocks; the workers the switch, only when this tree's worker takes it."""
    import deploy.local as local

    plain = LocalCluster(ClusterSpec(redis_url="redis://unused:1"))
    assert not any("fetch" in a for a in plain._service_args(0, 0))
    assert not any("fetch" in a for a in plain.add_worker("w0", start=False).cmd)
    for on, flag in ((True, "--peer-fetch"), (False, "--no-peer-fetch")):
        spec = ClusterSpec(redis_url="redis://unused:1", peer_fetch=on, min_fetch_blocks=8)
        args = LocalCluster(spec)._service_args(0, 0)
        assert flag in args and args[args.index("--min-fetch-blocks") + 1] == "8"
        monkeypatch.setattr(local, "worker_flags", lambda f=flag: frozenset({f}))
        assert flag in LocalCluster(spec).add_worker("w0", start=False).cmd
        monkeypatch.setattr(local, "worker_flags", lambda: frozenset({"--model"}))
        assert flag not in LocalCluster(spec).add_worker("w0", start=False).cmd


def test_worker_flags_are_read_from_the_worker_command() -> None:
    from deploy.local import worker_flags

    flags = worker_flags()
    assert {"--model", "--auto-pin", "--no-auto-pin"} <= flags and "--bogus" not in flags


def test_tenant_quotas_reach_every_replica_and_only_when_set() -> None:
    """Unset: no flag (the stored quotas stay); set: each replica's command line parses back
    to the same quotas the service stores (``service.cli.config_of``)."""
    from service.cli import config_of

    plain = LocalCluster(ClusterSpec(redis_url="redis://unused:1"))
    assert not any("quota" in a for a in plain._service_args(0, 0))
    spec = ClusterSpec(redis_url="redis://unused:1", service_replicas=2,
                       tenant_quotas=(("a", 0.3), ("b", 0.05)), default_tenant_quota=0.8)
    for i in range(2):
        args = LocalCluster(spec)._service_args(0, i)
        items = [args[j + 1] for j, a in enumerate(args) if a == "--tenant-quota"]
        default = float(args[args.index("--default-tenant-quota") + 1])
        cfg = config_of("memory", None, tenant_quota=items, default_tenant_quota=default)
        assert cfg.tenant_quotas == (("a", 0.3), ("b", 0.05))
        assert cfg.default_tenant_quota == 0.8
