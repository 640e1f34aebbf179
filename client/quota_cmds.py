"""`kvmesh quota set | show`: per-tenant cache quotas, stored by the service (admin token).

A quota is a tenant's share of each KV tier of every worker (``kvmesh.quota``); workers
apply a change within a few seconds (their next heartbeat answers). ``set`` replaces one
tenant's quota (tiers not given fall back to the default's) or, with ``--clear``, removes
it; ``*`` (or ``--default``) is the default of every tenant. Same service, token and TLS
options as ``kvmesh pin``; failures are one ``error: ...`` line and exit 1 (2: bad flags).
"""
from __future__ import annotations

from typing import Annotated, Any

import typer

from client.commands import JsonOut, Timeout, _client, _fail, _print_json
from kvmesh.contract import TIERS
from kvmesh.ops.cli_options import (
    DEFAULT_SERVICE,
    AdminToken,
    Service,
    TlsCa,
    TlsCert,
    TlsKey,
    Token,
)
from kvmesh.quota import ALL_TENANTS, Quota, Quotas


def quotas_dict(quotas: Quotas) -> dict[str, Any]:
    """``quotas`` as ``kvmesh quota show --json`` prints them: ``version``, ``default``
    and ``tenants`` (tenant -> tier -> fraction, set tiers only)."""
    def tiers(q: Quota) -> dict[str, float]:
        return {t: q.get(t) for t in TIERS if q.get(t) is not None}

    return {"version": quotas.version, "default": tiers(quotas.default),
            "tenants": {name: tiers(q) for name, q in sorted(quotas.tenants.items())}}


def set_cmd(tenant: Annotated[str | None, typer.Argument(
                help="The tenant, or '*' for the default of every tenant.")] = None,
            default: Annotated[bool, typer.Option(
                "--default", help="Set the default of every tenant (TENANT '*').")] = False,
            gpu: Annotated[float | None, typer.Option(
                "--gpu", min=0.0, max=1.0, help="Share of the GPU tier, 0-1.")] = None,
            cpu: Annotated[float | None, typer.Option(
                "--cpu", min=0.0, max=1.0, help="Share of the CPU tier, 0-1.")] = None,
            disk: Annotated[float | None, typer.Option(
                "--disk", min=0.0, max=1.0, help="Share of the disk tier, 0-1.")] = None,
            clear: Annotated[bool, typer.Option(
                "--clear", help="Remove the tenant's quota (the default's applies).")] = False,
            service: Service = DEFAULT_SERVICE, token: Token = None,
            admin_token: AdminToken = None, timeout: Timeout = 10.0, json_out: JsonOut = False,
            tls_ca: TlsCa = None, tls_cert: TlsCert = None, tls_key: TlsKey = None) -> None:
    """Set (or --clear) one tenant's cache quota, a fraction of each tier (admin token)."""
    if default == (tenant is not None):
        raise _fail("give a TENANT ('*' for the default) or --default, not both", 2)
    name = ALL_TENANTS if default else str(tenant)
    if clear == (gpu is not None or cpu is not None or disk is not None):
        raise _fail("give at least one of --gpu/--cpu/--disk, or --clear (alone)", 2)
    with _client(service, token, timeout, (tls_ca, tls_cert, tls_key), admin_token) as client:
        quotas = client.set_tenant_quota(name, gpu=gpu, cpu=cpu, disk=disk, clear=clear)
    if json_out:
        _print_json(quotas_dict(quotas))
        return
    what = "the default quota" if name == ALL_TENANTS else f"the quota of {name!r}"
    typer.echo(f"{what} {'cleared' if clear else 'set'}; quotas now at version "
               f"{quotas.version}")


def show_cmd(service: Service = DEFAULT_SERVICE, token: Token = None,
             admin_token: AdminToken = None, timeout: Timeout = 10.0, json_out: JsonOut = False,
             tls_ca: TlsCa = None, tls_cert: TlsCert = None, tls_key: TlsKey = None) -> None:
    """Show every tenant's cache quota (admin token)."""
    with _client(service, token, timeout, (tls_ca, tls_cert, tls_key), admin_token) as client:
        quotas = client.get_tenant_quotas()
    if json_out:
        _print_json(quotas_dict(quotas))
        return
    print_quotas(quotas)


def print_quotas(quotas: Quotas) -> None:
    """The table of ``kvmesh quota show``: the default ('*') first, then each tenant."""
    from rich.console import Console
    from rich.table import Table

    if quotas.empty:
        typer.echo("no tenant quotas (version 0): every worker evicts as vLLM does")
        return
    table = Table("tenant", *TIERS, "version", caption="-: not set (a tenant falls back to "
                  "the default's, the default to no limit)")
    rows = [(ALL_TENANTS, quotas.default), *sorted(quotas.tenants.items())]
    for name, quota in rows:
        cells = ["-" if quota.get(t) is None else f"{quota.get(t):g}" for t in TIERS]
        table.add_row(name, *cells, str(quotas.version))
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add the ``quota`` group (``set``, ``show``) to ``app``."""
    group = typer.Typer(no_args_is_help=True,
                        help="Per-tenant cache quotas (admin token): set, show.")
    group.command("set")(set_cmd)
    group.command("show")(show_cmd)
    app.add_typer(group, name="quota")
