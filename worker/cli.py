"""`kvmesh worker`: run one worker process."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("worker")
    def worker(
        port: int = typer.Option(0, help="gRPC port (0: a free one, printed at start)"),
        host: str = typer.Option("127.0.0.1", help="interface to bind and advertise"),
        model: str = typer.Option("tiny", help="'tiny' or a Hugging Face model directory"),
        block_size: int = typer.Option(16, help="tokens per KV block"),
        num_blocks: int = typer.Option(None, help="KV pool size (default: from memory)"),
        worker_id: str = typer.Option(None, help="default: <hostname>-<port>"),
        service: str = typer.Option(None, envvar="KVMESH_SERVICE",
                                    help="metadata service address(es), comma-separated"),
        token: str = typer.Option(None, envvar="KVMESH_TOKEN",
                                  help="the cluster's router token: the worker derives its "
                                  "access token from it and keeps only that"),
        access_token: str = typer.Option(None, envvar="KVMESH_WORKER_ACCESS_TOKEN",
                                         help="token its Generate/Stats require (clients "
                                         "derive it from their router token); preferred "
                                         "over --token: the worker never sees the router "
                                         "token"),
        service_token: str = typer.Option(None, envvar="KVMESH_WORKER_TOKEN",
                                          help="token presented to the service (its bound "
                                          "`kvmesh worker-token`, or the shared one)"),
        hash_algo: str = typer.Option("sha256_cbor", help="block-hash algorithm"),
        hash_seed: str = typer.Option(None, envvar="KVMESH_HASH_SEED",
                                      help="root-hash seed (cluster-wide); default as vLLM: "
                                      "PYTHONHASHSEED if set, else 'vllm-none-hash' for sha256 "
                                      "algos; xxhash algos need one"),
        device: str = typer.Option(None, help="cpu or cuda[:N] (default: cuda if present)"),
        heartbeat_s: float = typer.Option(1.0, help="heartbeat interval in seconds"),
        max_batched_tokens: int = typer.Option(2048, help="token budget per engine step"),
        metrics_port: int = typer.Option(None, help="serve Prometheus /metrics on this port"),
        metrics_host: str = typer.Option("127.0.0.1", help="interface of /metrics (no "
                                         "authentication: loopback unless you mean it)"),
        tls_cert: str = typer.Option(None, help="PEM certificate: serve TLS (with --tls-key)"),
        tls_key: str = typer.Option(None, help="PEM private key of --tls-cert"),
        tls_ca: str = typer.Option(None, help="PEM CA: verify the service over TLS (and, "
                                   "with --tls-client-auth, the clients)"),
        tls_client_auth: bool = typer.Option(False, help="require client certificates "
                                             "signed by --tls-ca (mutual TLS)"),
        max_inflight_per_conn: int = typer.Option(1024, help="calls in flight per client "
                                                  "connection (0: unlimited)"),
        max_message_bytes: int = typer.Option(16 << 20, help="largest request, bytes"),
    ) -> None:
        """Run one worker: KV pool + model + gRPC WorkerService (+ index registration)."""
        import asyncio
        import logging

        from kvmesh.hashing import resolve_seed
        from kvmesh.tls import tls_files
        from worker.main import WorkerOptions, access_token_of, serve

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        services = tuple(a.strip() for a in (service or "").split(",") if a.strip())
        try:
            tls = tls_files(tls_cert, tls_key, tls_ca, tls_client_auth)
            hash_seed = resolve_seed(hash_algo, hash_seed)
            access_token = access_token_of(token, access_token)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from e
        asyncio.run(serve(WorkerOptions(
            port=port, host=host, model=model, block_size=block_size, num_blocks=num_blocks,
            worker_id=worker_id, services=services, access_token=access_token,
            service_token=service_token or None, hash_algo=hash_algo,
            hash_seed=hash_seed, device=device, heartbeat_s=heartbeat_s,
            max_batched_tokens=max_batched_tokens, metrics_port=metrics_port,
            metrics_host=metrics_host, tls=tls,
            max_inflight_per_conn=max_inflight_per_conn,
            max_message_bytes=max_message_bytes)))
