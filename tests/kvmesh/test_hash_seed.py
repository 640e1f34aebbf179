"""The root seed, like vLLM: explicit ``--hash-seed`` > ``PYTHONHASHSEED``
> ``"vllm-none-hash"`` for the sha256 algorithms; an xxhash algorithm with neither refuses to
start, because vLLM would seed it with a random value per process."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import typer
from typer.testing import CliRunner

from deploy.process import ServerProcess
from kvmesh.hashing import DEFAULT_SEED, none_hash, resolve_seed
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor", None])
def test_explicit_seed_wins_then_pythonhashseed(algo):
    assert resolve_seed(algo, "s", env={"PYTHONHASHSEED": "0"}) == "s"
    assert resolve_seed(algo, None, env={"PYTHONHASHSEED": "0"}) == "0"
    assert resolve_seed(algo, "", env={"PYTHONHASHSEED": "7"}) == "7"  # empty flag: unset


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor", None])
def test_sha256_defaults_to_vllms_fixed_seed(algo):
    assert resolve_seed(algo, None, env={}) == DEFAULT_SEED == "vllm-none-hash"


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_xxhash_without_a_seed_is_refused_with_the_reason(algo):
    with pytest.raises(ValueError, match="random") as err:
        resolve_seed(algo, None, env={})
    assert "--hash-seed" in str(err.value) and "PYTHONHASHSEED" in str(err.value)


def _env(**kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED",
                                                            "KVMESH_HASH_SEED")}
    return {**env, "PYTHONPATH": str(ROOT), **kw}


@pytest.mark.integration
@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_worker_process_with_xxhash_and_no_seed_refuses_to_start(algo):
    out = subprocess.run([sys.executable, "-m", "worker", "--hash-algo", algo], env=_env(),
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    said = " ".join((out.stdout + out.stderr).split())
    assert "random" in said and "--hash-seed" in said, said


def _worker_cli_seed(args: list[str], env: dict[str, str | None]) -> str:
    """The seed ``kvmesh worker`` hands ``serve`` (a fake ``serve`` records it)."""
    import worker.main
    from worker.cli import register

    seen = []

    async def fake_serve(opts, stop=None):
        seen.append(opts.hash_seed)

    app = typer.Typer()
    register(app)
    app.command("other")(lambda: None)
    real, worker.main.serve = worker.main.serve, fake_serve
    try:
        res = CliRunner().invoke(app, ["worker", *args], env=env)
    finally:
        worker.main.serve = real
    assert res.exit_code == 0, res.output
    return seen[0]


def test_worker_cli_reads_pythonhashseed_and_the_flag_wins():
    unset = {"PYTHONHASHSEED": None, "KVMESH_HASH_SEED": None}
    assert _worker_cli_seed([], unset) == DEFAULT_SEED
    assert _worker_cli_seed([], {**unset, "PYTHONHASHSEED": "0"}) == "0"
    assert _worker_cli_seed(["--hash-algo", "xxhash"], {**unset, "PYTHONHASHSEED": "0"}) == "0"
    assert _worker_cli_seed(["--hash-seed", "s"], {**unset, "PYTHONHASHSEED": "0"}) == "s"


async def _register(address: str, seed: str) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(address) as ch:
        try:
            await pb_grpc.IndexServiceStub(ch).RegisterWorker(pb.RegisterWorkerRequest(
                worker_id="w", address="h:1", model="tiny", block_size=16,
                hash_algo="sha256_cbor", root_hash=none_hash("sha256_cbor", seed)))
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


@pytest.mark.integration
def test_service_process_takes_its_root_from_pythonhashseed():
    service = ServerProcess("service", "service", ["--port", "0", "--backend", "memory"],
                            env=_env(PYTHONHASHSEED="0"))
    service.env.pop("KVMESH_HASH_SEED", None)
    service.start(timeout=60)
    try:
        assert asyncio.run(_register(service.address, "0")) == grpc.StatusCode.OK
        assert (asyncio.run(_register(service.address, DEFAULT_SEED))
                == grpc.StatusCode.FAILED_PRECONDITION)
    finally:
        service.kill()
