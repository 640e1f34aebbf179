"""`kvmesh route | generate | stats | pin`: the client verbs of the command line.

Each verb talks to the metadata service given by ``--service ADDR[,ADDR...]`` (env
``KVMESH_SERVICE``), authenticates with ``--token`` (env ``KVMESH_TOKEN``), speaks TLS with
``--tls-ca`` (plus ``--tls-cert``/``--tls-key`` for mutual TLS), prints a readable
answer or, with ``--json``, one JSON document on stdout. Failures print one ``error: ...``
line on stderr and exit 1 (2 for bad arguments); never a traceback.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from client.peer_stats import in_out, plan_cell
from client.tenant_stats import tenant_table, tenant_totals
from kvmesh.contract import TIERS
from kvmesh.openai import vocab
from kvmesh.ops.cli_options import (
    DEFAULT_SERVICE,
    AdminToken,
    Policy,
    Service,
    TlsCa,
    TlsCert,
    TlsKey,
    Token,
)

if TYPE_CHECKING:
    from rich.console import Console

    from client.results import PinnedWorker
    from client.sync_client import KvmeshClient

Tokens = Annotated[str | None, typer.Option("--tokens", help="Prompt token ids: 1,2,3")]
Text = Annotated[str | None, typer.Option("--text", help="Prompt text (byte-level tokens).")]
Salt = Annotated[str | None, typer.Option("--salt", help="Cache salt (tenant isolation).")]
Tenant = Annotated[str | None, typer.Option(
    "--tenant", help="Whom the request is for (cache quotas and accounting; default: the "
    "default tenant). A label, never a credential: --salt decides what is shared.")]
Timeout = Annotated[float, typer.Option("--timeout", help="Per-call timeout, seconds.")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
WorkerId = Annotated[str | None, typer.Option(
    "--worker-id", help="Only this worker (the service may still plan a peer fetch to it).")]
TINY_MODEL = "tiny"  # the worker's built-in model: byte vocabulary, random weights


def encode_text(text: str) -> list[int]:
    """Byte-level tokens of ``text``, no BOS: the tiny model's vocabulary
    (``kvmesh.openai.vocab``, torch-free)."""
    return vocab.encode(text)


def decode_bytes(token_ids: list[int]) -> str:
    """Byte-level tokens back to text; ids outside 0..255 (special tokens) are dropped."""
    return vocab.decode(token_ids)


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _prompt(tokens: str | None, text: str | None) -> list[int]:
    """The prompt from exactly one of ``--tokens`` / ``--text``; exit 2 otherwise."""
    if (tokens is None) == (text is None):
        raise _fail("give exactly one of --tokens 1,2,3 or --text \"...\"", 2)
    if text is not None:
        ids = encode_text(text)
    else:
        try:
            ids = [int(t) for t in tokens.replace(" ", ",").split(",") if t.strip()]
        except ValueError:
            raise _fail(f"--tokens must be comma-separated integers, got {tokens!r}", 2) from None
    if not ids:
        raise _fail("the prompt is empty", 2)
    return ids


@contextmanager
def _client(service: str, token: str | None, timeout: float,
            tls: tuple[str | None, str | None, str | None] = (None, None, None),
            admin_token: str | None = None) -> Iterator[KvmeshClient]:
    """A connected client (``tls`` = ``(ca, cert, key)`` flags); any client failure becomes
    a one-line error and exit 1 (bad flags: exit 2)."""
    from client.errors import KvmeshError
    from client.sync_client import KvmeshClient
    from kvmesh.rpc.tls import tls_files

    try:
        ca, cert, key = tls
        with KvmeshClient(service, token, timeout=timeout, tls=tls_files(cert, key, ca),
                          admin_token=admin_token, pin_timeout=timeout) as client:
            yield client
    except KvmeshError as exc:
        raise _fail(f"{exc.code.name}: {exc.message}") from None
    except ValueError as exc:
        raise _fail(str(exc), 2) from None


def _print_json(data: Any) -> None:
    """``data`` as indented JSON; bytes (a fetch plan's hashes and ticket) as hex."""
    typer.echo(json.dumps(data, indent=2, sort_keys=True,
                          default=lambda v: v.hex() if isinstance(v, bytes) else str(v)))



def route_cmd(tokens: Tokens = None, text: Text = None, salt: Salt = None,
              service: Service = DEFAULT_SERVICE, token: Token = None, policy: Policy = None,
              max_candidates: Annotated[int, typer.Option(help="0: all workers.")] = 0,
              timeout: Timeout = 5.0, json_out: JsonOut = False,
              record: Annotated[bool, typer.Option(
                  help="Route for real (provisional entries, load estimate) instead of "
                       "only looking.")] = False,
              worker_id: WorkerId = None, tenant: Tenant = None,
              tls_ca: TlsCa = None, tls_cert: TlsCert = None, tls_key: TlsKey = None) -> None:
    """Ask the service which worker holds the longest prefix of a prompt (and which
    candidates would first pull blocks from a peer: the fetch column)."""
    prompt = _prompt(tokens, text)
    with _client(service, token, timeout, (tls_ca, tls_cert, tls_key)) as client:
        result = client.route(prompt, salt=salt, policy=policy, max_candidates=max_candidates,
                              dry_run=not record, worker_id=worker_id, tenant=tenant)
    if json_out:
        _print_json(dataclasses.asdict(result))
        return
    from rich.console import Console
    from rich.table import Table

    flag = " [bold red](degraded: index unreachable, load-only)[/]" if result.degraded else ""
    console = Console()
    lower = [(t, result.matched_tokens_by_tier.get(t, 0)) for t in TIERS[1:]]
    split = "".join(f", {n} on {t}" for t, n in lower if n)
    best = result.candidates[0] if result.candidates else None
    if best is not None and best.fetch is not None:
        split += f", {best.fetch.tokens} pulled from {best.fetch.source_worker_id} first"
    console.print(f"[bold]{result.worker_id}[/] at {result.address}: "
                  f"{result.matched_tokens}/{len(prompt)} prompt tokens cached{split} "
                  f"(policy {result.policy or 'default'}){flag}")
    table = Table("rank", "worker", "address", "matched", *TIERS, "cost", "peer fetch",
                  caption="gpu / cpu / disk: matched tokens held on that tier; peer fetch: "
                  "blocks the worker pulls from a peer first (matched counts them)")
    for rank, c in enumerate(result.candidates, 1):
        by_tier = [str(c.matched_tokens_by_tier.get(t, 0)) for t in TIERS]
        table.add_row(str(rank), c.worker_id, c.address, str(c.matched_tokens), *by_tier,
                      f"{c.cost:.1f}", plan_cell(c.fetch))
    console.print(table)


def generate_cmd(tokens: Tokens = None, text: Text = None, salt: Salt = None,
                 service: Service = DEFAULT_SERVICE, token: Token = None,
                 max_tokens: Annotated[int, typer.Option("--max-tokens")] = 16,
                 temperature: Annotated[float, typer.Option("--temperature")] = 0.0,
                 seed: Annotated[int | None, typer.Option("--seed")] = None,
                 policy: Policy = None, timeout: Timeout = 5.0,
                 json_out: JsonOut = False, worker_id: WorkerId = None, tenant: Tenant = None,
                 tls_ca: TlsCa = None, tls_cert: TlsCert = None, tls_key: TlsKey = None) -> None:
    """Route a prompt and generate on the chosen worker (failing over if it is down)."""
    prompt = _prompt(tokens, text)
    with _client(service, token, timeout, (tls_ca, tls_cert, tls_key)) as client:
        result = client.generate(prompt, max_tokens=max_tokens, salt=salt,
                                 temperature=temperature, seed=seed, policy=policy,
                                 worker_id=worker_id, tenant=tenant)
        if text is not None and not json_out:
            _note_random_model(client, result.address, result.worker_id)
    out = dataclasses.asdict(result)
    if text is not None:
        out["text"] = decode_bytes(result.token_ids)
    if json_out:
        _print_json(out)
        return
    typer.echo(f"{result.worker_id} at {result.address}: {len(result.token_ids)} tokens "
               f"({result.finish_reason}), {result.num_cached_tokens}/{result.prompt_tokens} "
               f"prompt tokens cached, ttft {result.ttft_s * 1000:.1f} ms"
               + (f", {result.attempts} attempts" if result.attempts > 1 else ""))
    typer.echo(f"text: {out['text']!r}" if text is not None
               else "tokens: " + ",".join(map(str, result.token_ids)))


def pin_cmd(tokens: Tokens = None, text: Text = None, salt: Salt = None,
            service: Service = DEFAULT_SERVICE, token: Token = None,
            admin_token: AdminToken = None,
            ttl: Annotated[float, typer.Option(
                "--ttl", min=0.0, help="Seconds the pin lasts, refreshed by every request "
                "that uses the prefix (0: the service's --pin-ttl-s).")] = 0.0,
            unpin: Annotated[bool, typer.Option(
                "--unpin", help="Release the prefix on every worker instead.")] = False,
            max_workers: Annotated[int, typer.Option(
                "--max-workers", min=0, help="0: every worker holding the prefix; N: the N "
                "best holders, warming others when fewer hold it.")] = 0,
            timeout: Timeout = 60.0, json_out: JsonOut = False,
            tls_ca: TlsCa = None, tls_cert: TlsCert = None, tls_key: TlsKey = None) -> None:
    """Keep a prefix (a system prompt) in the device tier of the workers (admin token).

    Exits 1 when any worker could not pin it, or pinned only part of it because its pin
    cap is full ("pinned N of M blocks: pin cap reached"); each is listed."""
    prompt = _prompt(tokens, text)
    with _client(service, token, timeout, (tls_ca, tls_cert, tls_key), admin_token) as client:
        result = (client.unpin(prompt, salt=salt) if unpin else
                  client.pin(prompt, salt=salt, ttl_s=ttl, max_workers=max_workers))
    if json_out:
        _print_json(dataclasses.asdict(result))
    else:
        what = "unpinned" if unpin else "pinned"
        blocks = "" if unpin else f" (prefix of {result.chain_blocks} full blocks)"
        typer.echo(f"{what} on {len(result.workers) - len(result.failed)} of "
                   f"{len(result.workers)} workers{blocks}")
        for w in result.workers:
            typer.echo(f"  {w.worker_id}: " + _pinned_line(w, what))
    if result.failed or result.capped:
        raise typer.Exit(1)


def _pinned_line(w: PinnedWorker, what: str) -> str:
    """One worker's line of ``kvmesh pin``: its error, or what it pinned (of how many, and
    why it stopped when its pin cap did)."""
    if w.error:
        return f"error: {w.error}"
    if w.cap_reached:
        return (f"{what} {w.pinned_blocks} of {w.chain_blocks} blocks: pin cap reached "
                "(the worker's explicit pins fill its cap: unpin one first)")
    return f"{w.pinned_blocks} blocks {what}"


def _note_random_model(client: KvmeshClient, address: str, worker_id: str) -> None:
    """Say on stderr that the worker's ``tiny`` model has random weights, so its text is
    noise by design (a newcomer would otherwise think decoding broke). Best effort: a
    worker that does not answer ``Stats`` gets no note."""
    from client.errors import KvmeshError

    try:
        model = client.worker_stats(address, worker_id).get("model")
    except KvmeshError:
        return
    if model == TINY_MODEL:
        typer.echo("note: the worker serves the 'tiny' model, whose weights are random: its "
                   "text is noise by design (start workers with --model DIR for real text)",
                   err=True)


def _worker_details(client: KvmeshClient, workers: list[dict[str, Any]],
                    window_s: float = 0.0) -> None:
    """Add each live worker's own ``WorkerService.Stats`` as ``worker_stats`` (None if down).
    With ``window_s``: a first sample as ``worker_stats_before``, the second ``window_s``
    later (the per-second rates of the tier table)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from client.errors import KvmeshError

    def fetch(w: dict[str, Any]) -> dict[str, Any] | None:
        if not w.get("alive") or not w.get("address"):
            return None
        try:
            return client.worker_stats(w["address"], w.get("worker_id") or None)
        except KvmeshError:
            return None

    if workers:
        with ThreadPoolExecutor(min(8, len(workers))) as pool:
            if window_s > 0:
                for w, ws in zip(workers, pool.map(fetch, workers), strict=True):
                    w["worker_stats_before"] = ws
                time.sleep(window_s)  # the measuring window of the rates
            for w, ws in zip(workers, pool.map(fetch, workers), strict=True):
                w["worker_stats"] = ws


def stats_cmd(service: Service = DEFAULT_SERVICE, token: Token = None,
              workers: Annotated[bool, typer.Option(
                  "--workers/--no-workers", help="Also ask each live worker for its cache "
                  "stats (hit rate, cached blocks, KV tiers).")] = True,
              rates: Annotated[float, typer.Option(
                  "--rates", min=0.0, help="Sample the workers twice this many seconds apart "
                  "and show evictions and offloads per second per tier (0: totals).")] = 0.0,
              tenants: Annotated[bool, typer.Option(
                  "--tenants", help="Also sum each tenant's requests, hit rate, blocks per "
                  "tier against its quota and evictions over the workers.")] = False,
              timeout: Timeout = 5.0, json_out: JsonOut = False,
              tls_ca: TlsCa = None, tls_cert: TlsCert = None, tls_key: TlsKey = None) -> None:
    """Show the cluster: every worker's liveness, load, blocks and index entries, and each
    worker's KV tiers (load factor, hit rate, evictions, offloads, onboards, pins, and the
    index's precision per tier), peer KV transfers (fetches made and served) and, with
    --tenants, each tenant's figures summed over the workers."""
    with _client(service, token, timeout, (tls_ca, tls_cert, tls_key)) as client:
        data = client.stats()
        if workers or tenants:
            client.timeout = min(timeout, 2.0)
            _worker_details(client, data["workers"], rates)
    if tenants:
        data["tenants"] = tenant_totals(data["workers"])
    if json_out:
        _print_json(data)
        return
    print_stats(data, rates_window_s=rates)


# The columns of one worker: (heading, cell of a ``stats()`` worker dict).
_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("worker", lambda w: w["worker_id"]),
    ("address", lambda w: w["address"]),
    ("alive", lambda w: "[green]yes[/]" if w["alive"] else "[red]no[/]"),
    ("run/wait", lambda w: f"{w.get('running', 0)}/{w.get('waiting', 0)}"),
    ("queued prefill", lambda w: str(w.get("queued_prefill_tokens", 0))),
    ("blocks free/total", lambda w: f"{w.get('free_blocks', 0)}/{w.get('total_blocks', 0)}"),
    ("indexed", lambda w: str(w.get("indexed_blocks", 0))),
    ("cached blocks", lambda w: str(_cache(w)["cached_blocks"]) if _cache(w) else "-"),
    ("hit rate", lambda w: f"{_cache(w)['hit_rate']:.1%}" if _cache(w) else "-"),
    ("peer in/out", lambda w: in_out(w.get("worker_stats"))),
    ("heartbeat", lambda w: f"{w.get('heartbeat_age_s', 0.0):.1f}s ago"),
)


def _cache(w: dict[str, Any]) -> dict[str, Any]:
    return (w.get("worker_stats") or {}).get("cache") or {}


def print_stats(data: dict[str, Any], console: Console | None = None,
                rates_window_s: float = 0.0) -> None:
    """Render ``KvmeshClient.stats()`` output (optionally with ``worker_stats``) as tables.

    One row per worker when the table fits ``console``'s width; otherwise (80 columns, a
    pipe) one two-column block per worker, so no cell is ever cut to "…". Then the KV tiers
    (``client.tier_stats``), the same way, when the workers report them; then the
    ``tenants`` of ``--tenants`` (``client.tenant_stats``).
    """
    from rich.console import Console
    from rich.table import Table

    from client.peer_stats import peer_table
    from client.tier_stats import tier_table

    console = console or Console()
    title = f"kvmesh workers (service {data.get('service', '?')})"
    table = Table(title=title)
    for col, _ in _COLUMNS:
        table.add_column(col, justify="left" if col in ("worker", "address") else "right")
    for w in data["workers"]:
        table.add_row(*(cell(w) for _, cell in _COLUMNS))
    natural = console.measure(table, options=console.options.update_width(10_000)).maximum
    if natural <= console.width:
        console.print(table)
    else:
        console.print(f"[bold]{title}[/]")
        for w in data["workers"]:
            block = Table(show_header=False, title=w["worker_id"], title_justify="left")
            for col, cell in _COLUMNS[1:]:
                block.add_row(col, cell(w))
            console.print(block)
    if not data["workers"]:
        console.print("no workers registered")
    tiers = tier_table(data["workers"], rates_window_s)
    if tiers is not None:
        _print_fitting(tiers, console)
    peers = peer_table(data["workers"])
    if peers is not None:
        _print_fitting(peers, console, keys=1)
    if data.get("tenants") is not None:  # `--tenants`: client.tenant_stats
        _print_fitting(tenant_table(data["tenants"]), console, keys=1)
    if data.get("degraded"):
        console.print("[bold red]degraded: the service cannot reach its index (Redis)[/]")
    counters = data.get("counters") or {}
    if counters:
        ctable = Table("counter", "value", title="service counters")
        for name in sorted(counters):
            value = counters[name]
            ctable.add_row(name, f"{value:.0f}" if float(value).is_integer() else f"{value:.3f}")
        console.print(ctable)


def _print_fitting(table: Any, console: Console, keys: int = 2) -> None:
    """``table`` as is when it fits ``console``; else one two-column block per row, titled
    by its first ``keys`` cells."""
    from rich.table import Table

    natural = console.measure(table, options=console.options.update_width(10_000)).maximum
    if natural <= console.width:
        console.print(table)
        return
    console.print(f"[bold]{table.title}[/]")
    heads = [c.header for c in table.columns]
    cells = [list(c.cells) for c in table.columns]
    for i in range(table.row_count):
        block = Table(show_header=False, title=" ".join(c[i] for c in cells[:keys]),
                      title_justify="left")
        for head, col in zip(heads[keys:], cells[keys:], strict=True):
            block.add_row(head, col[i])
        console.print(block)
    if table.caption:
        console.print(table.caption)


def register(app: typer.Typer) -> None:
    """Add the ``route``, ``generate``, ``stats`` and ``pin`` verbs to ``app``."""
    app.command("route")(route_cmd)
    app.command("generate")(generate_cmd)
    app.command("stats")(stats_cmd)
    app.command("pin")(pin_cmd)
