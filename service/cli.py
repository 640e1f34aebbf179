"""``kvmesh service``: run the metadata service in the foreground.

``register(app)`` adds the command to a Typer app (client/cli.py wires it); ``python -m
service`` runs the same command on its own. Heavy imports (grpc, redis) happen only when the
command runs, so ``kvmesh --help`` stays instant.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Annotated, Any, Literal, get_type_hints

import typer

from kvmesh.ops import cli_options as opt
from service.config import BACKENDS, ServiceConfig, cost_weight_names

# ServiceConfig fields the command exposes, with their help. Each flag is the field's name
# (``--max-prompt-tokens``) and takes the field's type and default, so a setting is declared
# once, in ServiceConfig; fields shared with other commands take their kvmesh.ops.cli_options type.
_SHARED = {"redis_url": opt.RedisUrl, "policy": opt.Policy, "token": opt.Token,
           "admin_token": opt.AdminToken,
           "worker_token": opt.WorkerToken, "worker_secret": opt.WorkerSecret,
           "tls_cert_file": opt.TlsCert, "tls_key_file": opt.TlsKey, "tls_ca_file": opt.TlsCa,
           "tls_client_auth": opt.TlsClientAuth,
           "default_tenant_quota": opt.DefaultTenantQuota}
_HELP = {
    "redis_cluster": "The --redis-url names a node of a Redis Cluster (as a "
                     "redis+cluster:// URL does); default: one Redis server.",
    "metrics_port": "Serve Prometheus metrics here.",
    "max_message_bytes": "Largest request, bytes (also gRPC's receive limit).",
    "max_inflight_per_conn": "Calls in flight per client connection (0: unlimited).",
    "max_prompt_tokens": "Longest Route prompt, tokens.",
    "max_batch_events": "Events in one PublishEvents (one Redis script: keep it short).",
    "max_batch_hashes": "Block hashes in one PublishEvents/SyncWorker.",
    "max_snapshot_blocks": "Blocks in one SyncWorker snapshot.",
    "max_mm_items": "Multimodal items in one Route.",
    "indexed_blocks_per_pool": "A worker may index at most this many times the total_blocks "
                               "it reports (and at least --min-indexed-cap).",
    "min_indexed_cap": "Blocks any worker may index.",
    "pin_ttl_s": "TTL of a pinned prefix when PinPrefix gives none, seconds (refreshed by use).",
    "max_pin_ttl_s": "Longest TTL a PinPrefix may ask for, seconds.",
    "pin_timeout_s": "Deadline of one worker's Pin call (a warm one prefills first), seconds.",
    "route_log": "Append one JSON line per routing decision to this file (created 0600; no "
                 "prompt content or salt): candidates, their costs and the load they were "
                 "judged on (service.route_log). Default: off.",
    "peer_fetch": "Plan peer KV fetches: a worker may pull a prefix's blocks from the peer "
                  "holding them when the cost model finds that cheaper than recomputing or "
                  "queueing on the holder (service.policy.fetch). Default: off until the "
                  "benchmarks show it wins.",
    "min_fetch_blocks": "Plan a peer fetch only for at least this many blocks.",
    "fetch_ticket_ttl_s": "Lifetime of a planned fetch's ticket, seconds.",
    "quota_refresh_s": "How often a replica re-reads the stored tenant quotas, seconds.",
}
_LEVELS = ("debug", "info", "warning", "error")
SECRETS = ("token", "worker_token", "worker_secret", "admin_token")
# Options of the command itself, not of ServiceConfig (or with a CLI-only default).
_OWN = [
    ("port", Annotated[int, typer.Option(
        help="gRPC port (0: a free one, printed at start).")], 50051),
    ("host", Annotated[str, typer.Option(help="Interface to bind (0.0.0.0: all).")],
     "127.0.0.1"),
    ("backend", Annotated[Literal[("auto", *BACKENDS)], typer.Option(
        metavar="BACKEND", help=f"{opt.choices(('auto', *BACKENDS))} (auto: redis iff a URL "
        "is given).")], "auto"),
    ("hash_seed", opt.HashSeed, None),  # None: kvmesh.hashing.resolve_seed decides
    ("log_level", Annotated[Literal[_LEVELS], typer.Option(
        metavar="LEVEL", help=f"Logging level: {opt.choices(_LEVELS)}.")], "info"),
    # CostWeights overrides: unset, each worker's match is credited by its measured costs
    ("cpu_credit", Annotated[float | None, typer.Option(
        help="Credit of a CPU-tier match for every worker, 0-1 (default: "
        "measured per worker, 0.5 until measured).")], None),
    ("disk_credit", Annotated[float | None, typer.Option(
        help="Credit of a disk-tier match for every worker, 0-1 (default: "
        "measured per worker, 0.25 until measured).")], None),
    ("cost_weight", Annotated[list[str] | None, typer.Option(
        "--cost-weight", metavar="NAME=VALUE",
        help="Set one weight of the kvmesh cost model (repeatable); NAME is a field of "
        "service.config.CostWeights: " + ", ".join(cost_weight_names()) + ".")], None),
    ("tenant_quota", opt.TenantQuota, None),
]


def _field_param(f: dataclasses.Field, hints: dict[str, Any]) -> inspect.Parameter:
    """The command parameter of ServiceConfig field ``f`` (its default is the field's)."""
    flag = f.name.replace("_", "-")
    decl = f"--{flag}/--no-{flag}" if hints[f.name] is bool else f"--{flag}"  # a switch
    kind = _SHARED.get(f.name) or Annotated[hints[f.name], typer.Option(decl,
                                                                        help=_HELP[f.name])]
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                             annotation=kind)


def _params() -> list[inspect.Parameter]:
    """Every parameter of ``kvmesh service``: its own options, then the config's fields."""
    own = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=kind) for name, kind, default in _OWN]
    hints = get_type_hints(ServiceConfig)
    return own + [_field_param(f, hints) for f in dataclasses.fields(ServiceConfig)
                  if f.name in _SHARED or f.name in _HELP]


def config_of(backend: str, hash_seed: str | None, cpu_credit: float | None = None,
              disk_credit: float | None = None, cost_weight: list[str] | None = None,
              tenant_quota: list[str] | None = None, **fields: Any) -> ServiceConfig:
    """The ServiceConfig of the command's flags: ``backend`` auto resolved, the seed resolved
    as vLLM does, empty secrets as none, explicit credits and ``--cost-weight NAME=VALUE``
    items into the cost weights, ``--tenant-quota NAME=FRACTION`` items into the start
    quotas. Raises ``ValueError`` for inconsistent flags (a credit set by both its flag and
    ``--cost-weight``, a bad weight name or value, a bad tenant quota)."""
    from kvmesh.hashing import resolve_seed
    from kvmesh.quota import parse_assignment
    from service.config import CostWeights, parse_cost_weights

    kind = backend if backend != "auto" else ("redis" if fields.get("redis_url") else "memory")
    for secret in SECRETS:
        fields[secret] = fields.get(secret) or None
    overrides = parse_cost_weights(cost_weight or ())
    for name, value in (("cpu_credit", cpu_credit), ("disk_credit", disk_credit)):
        if value is not None:
            if name in overrides:
                raise ValueError(f"--{name.replace('_', '-')} and --cost-weight {name}= are "
                                 "both set: give one")
            overrides[name] = value
    weights = CostWeights(**overrides)
    quotas = tuple(parse_assignment(item) for item in tenant_quota or ())
    return ServiceConfig(backend=kind, hash_seed=resolve_seed(None, hash_seed),
                         weights=weights, tenant_quotas=quotas, **fields)


def register(app: typer.Typer) -> None:
    """Add the ``service`` and ``worker-token`` commands to ``app``."""
    register_service(app)
    register_worker_token(app)
    register_worker_access_token(app)


def register_service(app: typer.Typer) -> None:
    """Add only the ``service`` command (``python -m service`` is that command alone)."""

    def service(*, port: int, host: str, log_level: str, **flags: Any) -> None:
        """Run the metadata service (index + routing) until Ctrl-C / SIGTERM."""
        import asyncio
        import logging

        logging.basicConfig(level=log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            cfg = config_of(**flags)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from e
        asyncio.run(_serve(f"{host}:{port}", cfg))

    params = _params()
    service.__signature__ = inspect.Signature(params, return_annotation=None)
    service.__annotations__ = {p.name: p.annotation for p in params}
    app.command("service")(service)


def register_worker_token(app: typer.Typer) -> None:
    """Add the ``worker-token`` command (mints a worker's bound token)."""

    @app.command("worker-token")
    def worker_token_cmd(
        worker_id: str = typer.Option(..., help="The worker id the token is bound to."),
        secret: str = typer.Option(..., envvar="KVMESH_WORKER_SECRET",
                                   help="The service's --worker-secret."),
    ) -> None:
        """Print the token that lets one worker (and only it) register and publish."""
        from service import worker_tokens

        try:
            typer.echo(worker_tokens.mint(secret, worker_id))
        except ValueError as e:
            raise typer.BadParameter(str(e)) from e


def register_worker_access_token(app: typer.Typer) -> None:
    """Add the ``worker-access-token`` command (mints the token one worker's WorkerService
    requires, for ``kvmesh worker --access-token`` / ``KVMESH_WORKER_ACCESS_TOKEN``)."""

    @app.command("worker-access-token")
    def worker_access_token_cmd(
        worker_id: str = typer.Option(..., help="The worker id the token is valid on."),
        token: str = typer.Option(..., envvar="KVMESH_TOKEN",
                                  help="The router token (the service's --token)."),
    ) -> None:
        """Print the token worker WORKER_ID (and only it) requires of its callers; clients,
        the gateway and routers derive it from the router token by themselves."""
        from kvmesh.rpc.auth import worker_access_token

        try:
            typer.echo(worker_access_token(token, worker_id))
        except ValueError as e:
            raise typer.BadParameter(str(e)) from e


async def _serve(address: str, cfg: ServiceConfig) -> None:
    """Serve until SIGINT/SIGTERM, then stop with a 1 s grace period."""
    import asyncio
    import signal

    from service.server import create_server

    server, port = await create_server(address, cfg)
    await server.start()
    host = address.rpartition(":")[0]
    extra = f", metrics on :{server.metrics_port}" if server.metrics_port else ""
    print(f"kvmesh service listening on {host}:{port} (backend {cfg.backend}, policy "
          f"{cfg.policy}{extra})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=1.0)
