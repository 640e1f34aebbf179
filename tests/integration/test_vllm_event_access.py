"""Who can read a ``kvmesh worker``'s vLLM KV events (every tenant's prompt ids and salts), on
real processes: the attack (a caller without any credential asks the replay
socket for a tenant's prompt), and the settings that would have allowed it refused at start."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import zmq
import zmq.auth

from kvmesh.events import vllm as ve
from kvmesh.events.zmq_curve import CurveClient
from tests.http_engines import BS, HttpWorker

pytestmark = pytest.mark.integration

PROMPT = [101, 32, 83, 69, 67, 82, 69, 84, 32, 112, 97, 121, 114, 111, 108, 108, 32]
ACCESS = "access-" + os.urandom(8).hex()


def _kvmesh_worker(*flags: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).with_name("kvmesh")), "worker", "--model", "tiny",
         "--device", "cpu", "--block-size", str(BS),
         "--num-blocks", "16", "--port", "0", *flags],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("endpoint,env", [
    ("tcp://*:0", {}), ("tcp://0.0.0.0:0", {}),
    ("tcp://127.0.0.1:0", {"KVMESH_WORKER_ACCESS_TOKEN": ACCESS})])
def test_a_worker_refuses_events_anyone_could_read(endpoint, env):
    """Off loopback without CURVE, or on loopback for a worker that requires an access
    token: refused at start, with the way out in the message."""
    done = _kvmesh_worker("--vllm-events", endpoint, env=env)
    assert done.returncode != 0
    assert "--vllm-curve-key" in done.stderr
    assert "listening on" not in done.stdout


def _keys(tmp_path) -> dict[str, str]:
    clients = tmp_path / "clients"
    clients.mkdir()
    paths = {}
    for name in ("worker", "bridge", "outsider"):
        public, secret = zmq.auth.create_certificates(tmp_path, name)
        os.chmod(secret, 0o600)
        paths[name], paths[name + "_public"] = secret, public
    (clients / "bridge.key").write_bytes(open(paths["bridge_public"], "rb").read())
    paths["clients"] = str(clients)
    return paths


def _ids_and_salts(batches: list[tuple[int, bytes]]) -> tuple[list[int], list[str]]:
    ids, salts = [], []
    for _, payload in batches:
        for ev in ve.decode_batch(payload).events:
            if isinstance(ev, ve.VllmStored):
                ids += ev.token_ids
                for keys in ev.extra_keys or ():
                    salts += [k for k in keys or () if isinstance(k, str)]
    return ids, salts


def test_only_the_listed_bridge_reads_a_tenants_prompt_and_salt(tmp_path):
    """A worker with an access token and CURVE keys: a tenant's completion; a caller with no
    credential, and one with a CURVE key not listed, get nothing from the replay or the live
    socket; the listed bridge gets the tenant's prompt and salt."""
    k = _keys(tmp_path)
    w = HttpWorker("curve-w", env={"KVMESH_WORKER_ACCESS_TOKEN": ACCESS,
                                   "KVMESH_VLLM_CURVE_KEY": k["worker"],
                                   "KVMESH_VLLM_CURVE_CLIENTS": k["clients"]}).start()
    ctx = zmq.Context()
    spies = []
    try:
        for key in (None, k["outsider"]):  # live spies, connected before the request
            spy = ctx.socket(zmq.SUB)
            spy.setsockopt(zmq.LINGER, 0)
            spy.subscribe(b"")
            if key is not None:
                CurveClient.load(key, k["worker_public"]).apply(spy)
            spy.connect(w.events)
            spies.append(spy)
        salt = "9f2b" + os.urandom(30).hex()
        body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 1,
                           "cache_salt": salt}).encode()
        urllib.request.urlopen(urllib.request.Request(
            f"{w.url}/v1/completions", body, {"content-type": "application/json",
                                              "authorization": f"Bearer {ACCESS}"}),
            timeout=60).read()
        for spy in spies:
            assert not spy.poll(1000)
        with pytest.raises(TimeoutError):  # no credential: not even the end marker
            w.replayed(0, timeout=2.0)
        with pytest.raises(TimeoutError):  # a CURVE key the worker does not list
            w.replayed(0, timeout=2.0, curve=CurveClient.load(k["outsider"],
                                                              k["worker_public"]))
        ids, salts = _ids_and_salts(w.replayed(0, curve=CurveClient.load(
            k["bridge"], k["worker_public"])))
        assert ids[:16] == PROMPT[:16] and salt in salts
    finally:
        for spy in spies:
            spy.close(linger=0)
        ctx.destroy(linger=0)
        w.stop()
