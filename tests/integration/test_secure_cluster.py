"""A whole local cluster with mutual TLS, a router token and worker tokens bound to their ids:
routers (client library, CLI, gateway) get through with the CA, their certificate and the
token; without any one of them they are refused."""
from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
import psutil
import pytest
from typer.testing import CliRunner

from client import KvmeshClient, KvmeshError
from client.cli import app
from client.gateway.app import GatewayConfig
from deploy.local import ClusterSpec, LocalCluster
from kvmesh.rpc.auth import worker_access_token
from kvmesh.rpc.tls import TlsFiles
from kvmesh.v1 import index_pb2, index_pb2_grpc, worker_pb2, worker_pb2_grpc
from service.worker_tokens import mint
from tests.client.gateway.conftest import LiveGateway
from tests.kvmesh_up import Up

if TYPE_CHECKING:  # the certs fixture skips where `cryptography` is missing
    from tests.certificates import Certs

TOKEN = "router-secret-token"
SECRET = "cluster-worker-secret-0123456789"
PROMPT = list(range(10, 60))


@pytest.fixture(scope="module")
def secure(certs: Certs):
    tls = TlsFiles(cert=str(certs.server_cert), key=str(certs.server_key), ca=str(certs.ca),
                   client_auth=True)
    spec = ClusterSpec(workers=1, num_blocks=64, token=TOKEN, tls=tls,
                       worker_secret=SECRET)
    with LocalCluster(spec) as cluster:  # start() returns once the worker registered
        yield cluster


def test_clients_with_ca_certificate_and_token_get_through(secure: LocalCluster) -> None:
    with secure.client() as client:
        out = client.generate(PROMPT, max_tokens=3, ignore_eos=True)
        again = client.generate(PROMPT, max_tokens=3, ignore_eos=True)
        stats = client.stats()
    assert len(out.token_ids) == 3 and again.token_ids == out.token_ids
    assert again.num_cached_tokens == 48
    assert [w["alive"] for w in stats["workers"]] == [True]  # joined with its bound token


def test_each_missing_credential_is_refused(secure: LocalCluster, certs: Certs) -> None:
    ca_only = TlsFiles(ca=str(certs.ca))
    full = secure.spec.tls
    cases = {
        "plaintext": (None, TOKEN, grpc.StatusCode.UNAVAILABLE),
        "no client certificate": (ca_only, TOKEN, grpc.StatusCode.UNAVAILABLE),
        "another CA": (TlsFiles(ca=str(certs.other_ca), cert=str(certs.client_cert),
                                key=str(certs.client_key)), TOKEN, grpc.StatusCode.UNAVAILABLE),
        "no token": (full, None, grpc.StatusCode.UNAUTHENTICATED),
    }
    for name, (tls, token, code) in cases.items():
        with KvmeshClient(secure.service_addresses, token, tls=tls, timeout=3) as client, \
                pytest.raises(KvmeshError) as err:
            client.stats()
        assert err.value.code == code, name
    # the worker wants its own access token (of the router token and its id; its env
    # KVMESH_WORKER_ACCESS_TOKEN, read by worker/cli.py), over TLS; never the router token
    worker = secure.worker_addresses[0]
    creds = TlsFiles(ca=str(certs.ca), cert=str(certs.client_cert),
                     key=str(certs.client_key)).channel_credentials()
    with grpc.secure_channel(worker, creds) as ch:
        stub = worker_pb2_grpc.WorkerServiceStub(ch)
        for refused in ([], [("authorization", f"Bearer {TOKEN}")]):
            with pytest.raises(grpc.RpcError) as err:
                stub.Stats(worker_pb2.WorkerStatsRequest(), timeout=3, metadata=refused)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        stats = stub.Stats(worker_pb2.WorkerStatsRequest(), timeout=3, metadata=[
            ("authorization", f"Bearer {worker_access_token(TOKEN, 'worker-0')}")])
        assert stats.worker_id == "worker-0"


def test_cli_and_gateway_speak_tls(secure: LocalCluster, certs: Certs) -> None:
    tls = secure.spec.tls
    flags = ["--service", ",".join(secure.service_addresses), "--token", TOKEN,
             "--tls-ca", str(certs.ca), "--tls-cert", tls.cert, "--tls-key", tls.key]
    out = CliRunner().invoke(app, ["generate", "--tokens", "1,2,3", "--max-tokens", "2",
                                   "--json", *flags])
    assert out.exit_code == 0, out.output
    out = CliRunner().invoke(app, ["stats", "--json", *flags[:4]])  # no TLS flags
    assert out.exit_code == 1 and "UNAVAILABLE" in out.output
    gateway = LiveGateway(GatewayConfig(service=secure.service_addresses, token=TOKEN,
                                        tls=tls))
    try:
        done = gateway.openai().completions.create(model="tiny", prompt="Hello", max_tokens=2)
        assert done.usage.completion_tokens == 2
    finally:
        gateway.stop()


def test_kvmesh_up_takes_tls_and_worker_secret_flags(certs: Certs) -> None:
    """`kvmesh up` (local backend) serves mutual TLS and worker tokens bound by the secret,
    which reaches its children in their environment, never on their command lines."""
    tls = TlsFiles(cert=str(certs.server_cert), key=str(certs.server_key), ca=str(certs.ca),
                   client_auth=True)
    up = Up("--workers", "1", "--port", "0", "--num-blocks", "64", "--worker-secret", SECRET,
            "--tls-cert", tls.cert, "--tls-key", tls.key, "--tls-ca", tls.ca,
            "--tls-client-auth", env={"KVMESH_TOKEN": TOKEN})
    try:
        up.wait_ready(120)
        hint = up.hint
        assert hint is not None, up.tail()
        assert f"--tls-ca {tls.ca}" in hint  # the hint's command reaches the cluster as served
        services = up.field("service")
        with KvmeshClient(services, TOKEN, tls=tls) as client:
            out = client.generate(PROMPT, max_tokens=3, ignore_eos=True)
            again = client.generate(PROMPT, max_tokens=3, ignore_eos=True)
            stats = client.stats()
        assert again.token_ids == out.token_ids and again.num_cached_tokens == 48
        assert [w["alive"] for w in stats["workers"]] == [True]  # joined with its bound token
        with grpc.secure_channel(services[0], tls.channel_credentials()) as ch:
            stub = index_pb2_grpc.IndexServiceStub(ch)
            with pytest.raises(grpc.RpcError) as err:  # the secret is on: router token refused
                stub.Heartbeat(index_pb2.HeartbeatRequest(worker_id="worker-0"), timeout=5,
                               metadata=[("authorization", f"Bearer {TOKEN}")])
            assert err.value.code() in (grpc.StatusCode.UNAUTHENTICATED,
                                        grpc.StatusCode.PERMISSION_DENIED)
        children = psutil.Process(up.proc.pid).children(recursive=True)
        assert len(children) >= 3  # valkey, service, worker
        for child in children:
            line = " ".join(child.cmdline())
            assert SECRET not in line and mint(SECRET, "worker-0") not in line, line
        assert up.stop(30) == 0, up.tail()
        assert up.lines[-1] == "stopped"
    finally:
        up.kill()
