"""Attacks on the disk KV tier, with real files and real worker processes.

- Whoever can write the tier's directory plants KV served as a hit: a directory another
  user owns or others may write is refused at start; inside the worker's own directory,
  files are authenticated (HMAC-SHA256 under a key only this worker holds), so a planted or
  rewritten block is deleted, counted and recomputed, never served.
- One file with a malformed header (non-integer token ids) stopped the worker at every start:
  it is now deleted and counted (``kvmesh_worker_disk_files_rejected_total``), and the
  worker starts.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request

import pytest
import torch

from deploy.process import ServerProcess
from kvmesh.hashing import block_hashes, none_hash
from worker import Engine
from worker.kv_cache.tier_config import TierConfig
from worker.kv_io.disk_store import DiskEntry, DiskStore, model_fingerprint

BS = 4
OTHER_UID = 4242  # not this process's user (the tests run as root, as an attacker could)
VICTIM = list(b"Wire $9,400 to IBAN DE02 1234")[:16] + [10]  # 4 full blocks + 1
WORKER = ["--model", "tiny", "--device", "cpu", "--block-size", str(BS), "--num-blocks",
          "16", "--cpu-blocks", "2", "--disk-blocks", "64", "--host", "127.0.0.1",
          "--port", "0", "--worker-id", "w"]


@pytest.fixture(autouse=True)
def _own_key_file(monkeypatch):
    monkeypatch.delenv("KVMESH_DISK_KEY", raising=False)  # the key file under the disk dir


def tiny_store(root, key: bytes | None = None) -> tuple[Engine, DiskStore]:
    """The store a ``--model tiny --block-size 4`` worker uses under ``root`` (the same
    fingerprint: the model and the default seed are public), with ``key`` or the worker's."""
    e = Engine.from_pretrained("tiny", block_size=BS, num_blocks=4, device="cpu")
    fp = model_fingerprint(e.model, e.config, BS, e.kv_cache.dtype, "sha256_cbor",
                           none_hash("sha256_cbor"))
    return e, DiskStore(root, fp, e.config.kv_cache_bytes_per_block(BS, e.kv_cache.dtype),
                        key=key)


def plant(store: DiskStore, e: Engine, prompt: list[int]) -> int:
    """Block files for ``prompt``'s full blocks: the right hashes, the attacker's KV."""
    hashes = block_hashes(prompt, BS)
    g = torch.Generator().manual_seed(7)
    n = store.block_nbytes // e.kv_cache.element_size()
    for i, h in enumerate(hashes):
        kv = (torch.randn(n, generator=g) * 3).to(e.kv_cache.dtype).numpy().tobytes()
        store.write(DiskEntry(h, hashes[i - 1] if i else None,
                              tuple(prompt[i * BS:(i + 1) * BS]), None), kv)
    return len(hashes)


@pytest.mark.integration  # a worker process
@pytest.mark.parametrize("case", ["world_writable", "another_owner"])
def test_a_worker_refuses_a_disk_dir_others_control(tmp_path, case):
    d = tmp_path / "tier"
    d.mkdir()
    if case == "world_writable":  # e.g. made by whoever came first under /tmp
        os.chmod(d, 0o777)
    else:
        os.chown(d, OTHER_UID, OTHER_UID)
    try:
        out = subprocess.run([sys.executable, "-m", "worker", *WORKER, "--disk-dir", str(d)],
                             capture_output=True, text=True, timeout=90,
                             env={**os.environ, "COLUMNS": "400"})  # rich wraps at the width
    except subprocess.TimeoutExpired:  # it started and served: the attacker's directory
        pytest.fail("the worker started on a disk directory others control")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--disk-dir" in out.stderr and ("writable by everyone" in out.stderr
                                           or f"owned by uid {OTHER_UID}" in out.stderr)
    assert list(d.iterdir()) == []  # nothing was written there


def test_kv_planted_in_the_workers_own_directory_is_never_served(tmp_path):
    """The attacker could write the directory once (before this fix it was any directory)
    and computes the victim's hashes itself; it lacks only the worker's key."""
    e, _ = tiny_store(tmp_path)  # the worker's directory and key exist
    want = Engine(e.model, e.config, block_size=BS, num_blocks=16).generate(
        [VICTIM], 8)[0].token_ids  # computed fresh
    _, forged = tiny_store(tmp_path, key=os.urandom(32))
    n = plant(forged, e, VICTIM)
    worker = Engine(e.model, e.config, block_size=BS, num_blocks=16,
                    tiers=TierConfig(cpu_blocks=2, disk_blocks=64, disk_dir=tmp_path))
    got = worker.generate([VICTIM], 8)[0]
    worker.close()
    assert got.cached_tokens_by_tier["disk"] == 0 and got.token_ids == want
    assert worker.copies.store.rejected == n
    assert not list(worker.copies.store.dir.glob("*.kvb.*"))


@pytest.mark.integration  # a worker process
def test_one_malformed_block_file_does_not_stop_a_worker_from_starting(tmp_path):
    e, store = tiny_store(tmp_path)  # under the worker's own key: only the shape is wrong
    bad = DiskEntry(b"\x01" * 32, None, ("x",) * BS, None)
    store.write(bad, bytes(store.block_nbytes))
    proc = ServerProcess("w", "worker", [*WORKER, "--disk-dir", str(tmp_path),
                                         "--metrics-port", "0"])
    proc.start(timeout=120)  # it used to exit with a ValueError, at every start
    try:
        assert not store.path(bad.block_hash).exists()
        line = next(x for x in proc.lines if "listening on" in x)
        mport = int(re.search(r"metrics on :(\d+)", line)[1])
        body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read()
        assert re.search(rb'kvmesh_worker_disk_files_rejected_total\{worker_id="w"\} 1\.0',
                         body), body
    finally:
        proc.stop()
