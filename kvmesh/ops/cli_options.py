"""The command-line options every kvmesh CLI shares, declared once as ``Annotated`` types.

Each option reads one environment variable, the same for every command that takes it (the
table in ``docs/operations.md``), and offers its choices from the list that defines them
(``kvmesh.contract``: ``ALGOS``, ``POLICIES``, ``EVICTIONS``), never from hand-typed help. A
command gives the default as the parameter's default, so one type serves a client (whose
``--service`` defaults to the local service) and a worker (whose ``--service`` is optional).

Lives in ``kvmesh/`` because the worker and service CLIs may import only this package.
"""
from __future__ import annotations

import copy
from typing import Annotated, Any, Literal, get_args

import typer

from kvmesh.contract import ALGOS, EVICTIONS, POLICIES

DEFAULT_SERVICE = "127.0.0.1:50051"

Service = Annotated[str | None, typer.Option(
    "--service", envvar="KVMESH_SERVICE",
    help="Metadata service replica(s): HOST:PORT[,HOST:PORT]")]
RedisUrl = Annotated[str | None, typer.Option(
    "--redis-url", envvar="KVMESH_REDIS_URL", help="Redis/Valkey URL of the shared index.")]
InsecureClusterBus = Annotated[bool, typer.Option(
    "--insecure-cluster-bus", envvar="KVMESH_INSECURE_CLUSTER_BUS",
    help="Embedded Redis Cluster: allow a plaintext, unauthenticated cluster bus when the "
    "Valkey binary has no TLS (any local user can then take the cluster over; only for a "
    "host where every local user is trusted).")]


def choices(names: tuple[str, ...]) -> str:
    """The help text listing ``names``: choices are typed once, in their defining tuple."""
    return " | ".join(names)


def retold(option: Any, *aliases: str, help: str) -> Any:
    """``option`` (one of the types here) told in a command's own words: the same flag,
    environment variable, type and choices, with ``help`` and more flag names
    (``aliases``)."""
    kind, info = get_args(option)
    info = copy.copy(info)
    info.help = help
    info.param_decls = (*info.param_decls, *aliases)
    return Annotated[kind, info]


# Literal[...] of the defining tuple: typer accepts (and checks) exactly those choices; a
# short metavar keeps --help readable at 80 columns (the choices are in the help).
Policy = Annotated[Literal[POLICIES] | None, typer.Option(
    "--policy", envvar="KVMESH_POLICY", metavar="POLICY",
    help=f"Routing policy: {choices(POLICIES)}.")]
HashAlgo = Annotated[Literal[ALGOS], typer.Option(
    "--hash-algo", envvar="KVMESH_HASH_ALGO", metavar="ALGO",
    help=f"Block-hash algorithm (cluster-wide): {choices(ALGOS)}.")]
HashSeed = Annotated[str | None, typer.Option(
    "--hash-seed", envvar="KVMESH_HASH_SEED",
    help="Root-hash seed (cluster-wide); default as vLLM: PYTHONHASHSEED if set, else "
    "'vllm-none-hash' for sha256 algos; xxhash algos need one.")]

# Credentials (docs/security.md): the router token never reaches a worker.
Token = Annotated[str | None, typer.Option(
    "--token", envvar="KVMESH_TOKEN",
    help="Router token (the service's --token): Route/Stats need it; each worker gets only "
    "its own access token derived from it.")]
AdminToken = Annotated[str | None, typer.Option(
    "--admin-token", envvar="KVMESH_ADMIN_TOKEN",
    help="Admin token (the service's --admin-token): pins and tenant quotas need it, the "
    "router token is not enough.")]
# Tenant quotas at start (kvmesh.quota; `kvmesh quota set` changes them at run time).
TenantQuota = Annotated[list[str] | None, typer.Option(
    "--tenant-quota", metavar="NAME=F",
    help="NAME=FRACTION: tenant NAME's cache quota, a fraction of each KV tier of every "
    "worker, stored at start over its stored one (repeatable).")]
DefaultTenantQuota = Annotated[float | None, typer.Option(
    "--default-tenant-quota", metavar="F",
    help="Every tenant's cache quota (a fraction of each KV tier of every worker), stored at "
    "start; default: the stored one (none: no quotas).")]
WorkerToken = Annotated[str | None, typer.Option(
    "--worker-token", envvar="KVMESH_WORKER_TOKEN",
    help="Separate token for Register/Heartbeat/Publish/Sync.")]
ServiceToken = Annotated[str | None, typer.Option(
    "--service-token", envvar="KVMESH_WORKER_TOKEN",
    help="Token a worker presents to the service (its bound `kvmesh worker-token`, or the "
    "shared --worker-token).")]
AccessToken = Annotated[str | None, typer.Option(
    "--access-token", envvar="KVMESH_WORKER_ACCESS_TOKEN",
    help="This worker's own access token, which its Generate/Stats require (`kvmesh "
    "worker-access-token --worker-id ID`; clients derive it from their router token and the "
    "worker's id); valid on this worker only. Preferred over --token: the worker never sees "
    "the router token.")]
WorkerSecret = Annotated[str | None, typer.Option(
    "--worker-secret", envvar="KVMESH_WORKER_SECRET",
    help="Secret of worker tokens bound to their worker id (mint them with `kvmesh "
    "worker-token`); at least 16 bytes.")]

# TLS: a server serves --tls-cert/--tls-key; a client presents them (mutual TLS); everyone
# verifies peers with --tls-ca.
TlsCa = Annotated[str | None, typer.Option(
    "--tls-ca", envvar="KVMESH_TLS_CA",
    help="PEM CA: talk TLS, verifying servers with it (and, with --tls-client-auth, the "
    "clients).")]
TlsCert = Annotated[str | None, typer.Option(
    "--tls-cert", envvar="KVMESH_TLS_CERT",
    help="PEM certificate (with --tls-key): servers serve TLS with it, clients present it "
    "(mutual TLS).")]
TlsKey = Annotated[str | None, typer.Option(
    "--tls-key", envvar="KVMESH_TLS_KEY", help="PEM private key of --tls-cert.")]
TlsClientAuth = Annotated[bool, typer.Option(
    "--tls-client-auth/--no-tls-client-auth", envvar="KVMESH_TLS_CLIENT_AUTH",
    help="Require client certificates signed by --tls-ca (mutual TLS).")]

# KV tiers (a worker's, and every worker's of `kvmesh up`): defaults keep one device pool.
CpuBlocks = Annotated[int, typer.Option(
    "--cpu-blocks", min=0, help="Host-memory KV tier: blocks (0: off).")]
DiskBlocks = Annotated[int, typer.Option(
    "--disk-blocks", min=0, help="Disk KV tier: blocks (0: off; needs --cpu-blocks and "
    "--disk-dir).")]
DiskDir = Annotated[str | None, typer.Option(
    "--disk-dir", help="Directory of the disk tier's block files (kept across restarts): "
    "yours alone (created 0700; one another user owns or others may write is refused). "
    "Files are authenticated under <disk-dir>/disk.key, or under $KVMESH_DISK_KEY if set.")]
Eviction = Annotated[Literal[EVICTIONS], typer.Option(
    "--eviction", metavar="ORDER",
    help=f"Device-pool eviction order: {choices(EVICTIONS)} (layered: decode-generated "
    "blocks before prompt blocks).")]
AutoPin = Annotated[bool, typer.Option(
    "--auto-pin/--no-auto-pin", help="Pin hot prefixes in the device pool automatically.")]
