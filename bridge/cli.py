"""``kvmesh bridge vllm``: index a vLLM fleet from vLLM's own KV events.

``kvmesh bridge`` is the group (one verb per engine family; ``vllm`` today). Engines come from
the flags (one engine, ``--dp-ranks`` ranks) or from ``--config FILE`` (many; see
``bridge.config``), never both. Heavy imports happen when the command runs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kvmesh.contract import ALGOS, DEFAULT_ALGO
from kvmesh.ops import cli_options as opt

# The worker credential, as `kvmesh worker --service-token` (never the router token);
# `--token` is accepted as its short name.
ServiceToken = opt.retold(
    opt.ServiceToken, "--token",
    help="Token presented to the service: the shared --worker-token, or a token bound to "
    "the worker id (`kvmesh worker-token`; with --dp-ranks, one per rank in --config).")
HashAlgo = opt.retold(
    opt.HashAlgo,
    help=f"kvmesh's block-hash algorithm (the cluster's, not the engine's: the bridge "
    f"rehashes): {opt.choices(ALGOS)}.")
_ENGINE_FLAGS = ("worker_id", "address", "events", "replay", "model", "block_size", "dp_ranks",
                 "metrics_url", "lora", "num_blocks", "topic", "curve_server_key")


def register(app: typer.Typer) -> None:
    """Add the ``bridge`` group (verb ``vllm``) to ``app``."""
    group = typer.Typer(no_args_is_help=True,
                        help="Index engines that are not kvmesh workers from their own events.")
    app.add_typer(group, name="bridge")

    @group.command("vllm")
    def vllm(
        ctx: typer.Context,
        service: opt.Service = None,
        worker_id: Annotated[str | None, typer.Option(
            help="Worker id of the engine (with --dp-ranks N > 1: ID-dp0 ... ID-dp{N-1}).")] = None,
        address: Annotated[str | None, typer.Option(
            help="The engine's OpenAI server, http://HOST:PORT (registered as HOST:PORT).")] = None,
        events: Annotated[str | None, typer.Option(
            help="Rank 0's KV-event endpoint, tcp://HOST:5557 (rank r: port + r).")] = None,
        replay: Annotated[str | None, typer.Option(
            help="Rank 0's replay endpoint, tcp://HOST:5558 (rank r: port + r); without it "
            "a lost message clears the engine's entries.")] = None,
        model: Annotated[str | None, typer.Option(
            help="Model name (default: the model_name label of the engine's metrics).")] = None,
        block_size: Annotated[int, typer.Option(help="The engine's --block-size.")] = 16,
        dp_ranks: Annotated[int, typer.Option(
            help="Data-parallel ranks of the engine: one worker each.")] = 1,
        metrics_url: Annotated[str | None, typer.Option(
            help="The engine's Prometheus page (default: ADDRESS/metrics); a heartbeat is "
            "sent only when it answers.")] = None,
        lora: Annotated[list[str] | None, typer.Option(
            help="NAME=PATH of an adapter the engine serves (repeat): events name adapters, "
            "kvmesh hashes name and path; blocks of unmapped adapters are not indexed.")] = None,
        num_blocks: Annotated[int | None, typer.Option(
            help="The engine's GPU blocks, when its metrics do not say.")] = None,
        topic: Annotated[str, typer.Option(help="The engine's KV-event topic.")] = "",
        curve_server_key: Annotated[str | None, typer.Option(
            help="The engine's CURVE public key (Z85, or its NAME.key file) when its event "
            "sockets use CURVE (kvmesh worker --vllm-curve-key); needs --curve-key.")] = None,
        config: Annotated[Path | None, typer.Option(
            help="YAML or TOML file of engines (many from one process); not with the engine "
            "flags.", exists=True, dir_okay=False)] = None,
        service_token: ServiceToken = None,
        curve_key: Annotated[str | None, typer.Option(
            envvar="KVMESH_BRIDGE_CURVE_KEY",
            help="The bridge's zmq.auth certificate with its secret key (NAME.key_secret), "
            "presented to engines given a --curve-server-key.")] = None,
        hash_algo: HashAlgo = DEFAULT_ALGO,
        hash_seed: opt.HashSeed = None,
        tls_ca: opt.TlsCa = None,
        tls_cert: opt.TlsCert = None,
        tls_key: opt.TlsKey = None,
        metrics_port: Annotated[int | None, typer.Option(
            help="Serve the bridge's own Prometheus /metrics on this port.")] = None,
        metrics_host: Annotated[str, typer.Option(
            help="Interface of /metrics (no authentication: loopback unless you mean "
            "it).")] = "127.0.0.1",
    ) -> None:
        """Register vLLM engines as workers of the index, from their KV events and metrics."""
        import asyncio
        import logging

        from bridge.config import EngineSpec, load_config, parse_loras
        from bridge.main import BridgeOptions, serve
        from kvmesh.rpc.channel import parse_addresses
        from kvmesh.rpc.tls import tls_files

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        # flags the user gave (typer vendors click: its ParameterSource is compared by name)
        given = {name for name in ctx.params
                 if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT"}
        try:
            top: dict[str, Any] = {}
            if config is not None:
                if given & set(_ENGINE_FLAGS):
                    raise ValueError("give engines by flags or in --config, not both")
                top, engines = load_config(config)
            elif worker_id is None or address is None or events is None:
                raise ValueError("--worker-id, --address and --events are needed (or --config)")
            else:
                engines = [EngineSpec(
                    worker_id=worker_id, address=address, events=events, replay=replay,
                    model=model, block_size=block_size, dp_ranks=dp_ranks,
                    metrics_url=metrics_url, lora=parse_loras(lora), num_blocks=num_blocks,
                    topic=topic, curve_server_key=curve_server_key)]
            values = {name: ctx.params[name] if name in given or name not in top else top[name]
                      for name in ("service", "service_token", "hash_algo", "hash_seed",
                                   "tls_ca", "tls_cert", "tls_key", "metrics_port",
                                   "metrics_host", "curve_key")}
            if not values["service"]:
                raise ValueError("--service is needed (or 'service' in --config)")
            if values["hash_algo"] not in ALGOS:
                raise ValueError(f"hash_algo must be one of {', '.join(ALGOS)}")
            opts = BridgeOptions(
                services=tuple(parse_addresses(values["service"])),
                service_token=values["service_token"] or None,
                hash_algo=values["hash_algo"], hash_seed=values["hash_seed"],
                tls=tls_files(values["tls_cert"], values["tls_key"], values["tls_ca"]),
                metrics_port=values["metrics_port"], metrics_host=values["metrics_host"],
                curve_key=values["curve_key"])
        except (ValueError, OSError) as e:
            raise typer.BadParameter(str(e)) from e
        try:
            asyncio.run(serve(opts, engines))
        except ValueError as e:  # settings only build() can check (TLS files, seeds)
            raise typer.BadParameter(str(e)) from e
