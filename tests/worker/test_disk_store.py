"""The disk tier's files: atomic writes, verification on read, the scan at start."""
from __future__ import annotations

import os

import pytest
import torch

from worker.disk_store import CorruptBlock, DiskEntry, DiskStore, model_fingerprint
from worker.model import load_model

NBYTES = 256
FP = b"\x01" * 16


def entry(i: int, parent: bytes | None = None, extra=None) -> DiskEntry:
    return DiskEntry(bytes([i]) * 32, parent, tuple(range(i, i + 4)), extra)


def payload(i: int) -> bytes:
    return bytes((i * 7 + k) % 256 for k in range(NBYTES))


@pytest.fixture
def store(tmp_path):
    return DiskStore(tmp_path, FP, NBYTES)


def test_round_trip_and_scan(store):
    extra = (("lora", "a", "/p"), ("cache_salt", "s"))
    store.write(entry(1), payload(1))
    store.write(entry(2, entry(1).block_hash, extra), payload(2))
    assert bytes(store.read(entry(2).block_hash)) == payload(2)
    out = bytearray(NBYTES)
    store.read(entry(1).block_hash, memoryview(out))
    assert bytes(out) == payload(1)
    assert sorted(store.scan()) == sorted([entry(1), entry(2, entry(1).block_hash, extra)])
    # extra keys come back as tuples, the type the hashing code compares with
    assert [e.extra_keys for e in store.scan() if e.extra_keys] == [extra]


def test_write_is_atomic_and_leaves_no_temporary(store, monkeypatch):
    store.write(entry(1), payload(1))
    real_write = os.replace

    def crash(*a):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        store.write(entry(1), payload(9))
    monkeypatch.setattr(os, "replace", real_write)
    assert bytes(store.read(entry(1).block_hash)) == payload(1)  # the old file, whole
    assert [p.name for p in store.dir.iterdir()] == [store.path(entry(1).block_hash).name]


@pytest.mark.parametrize("damage", ["flip_payload", "flip_header", "truncate",
                                    "truncate_header", "empty", "extend"])
def test_damaged_file_is_refused_and_deleted(store, damage):
    h = entry(3).block_hash
    store.write(entry(3), payload(3))
    path = store.path(h)
    data = bytearray(path.read_bytes())
    if damage == "flip_payload":
        data[-5] ^= 0x40
    elif damage == "flip_header":
        data[20] ^= 0x01
    elif damage == "truncate":
        data = data[:-1]
    elif damage == "truncate_header":
        data = data[:15]
    elif damage == "empty":
        data = bytearray()
    else:
        data += b"\x00"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptBlock):
        store.read(h)
    assert not path.exists()
    with pytest.raises(CorruptBlock):  # missing now
        store.read(h)


def test_scan_drops_bad_headers_and_temporaries_but_not_payload_damage(store):
    store.write(entry(1), payload(1))
    store.write(entry(2), payload(2))
    store.write(entry(4), payload(4))
    (store.dir / "x.kvb.123.tmp").write_bytes(b"half")
    p2 = store.path(entry(2).block_hash)
    p2.write_bytes(p2.read_bytes()[:-10])  # truncated: its size gives it away
    p4 = store.path(entry(4).block_hash)
    d = bytearray(p4.read_bytes())
    d[-1] ^= 1  # payload damage: only a read can tell
    p4.write_bytes(bytes(d))
    assert sorted(e.block_hash for e in store.scan()) == [entry(1).block_hash,
                                                         entry(4).block_hash]
    assert not p2.exists() and not list(store.dir.glob("*.tmp"))
    with pytest.raises(CorruptBlock):
        store.read(entry(4).block_hash)


def test_a_file_renamed_to_another_hash_is_refused(store):
    store.write(entry(1), payload(1))
    os.replace(store.path(entry(1).block_hash), store.path(entry(5).block_hash))
    with pytest.raises(CorruptBlock):
        store.read(entry(5).block_hash)
    assert store.scan() == []


def test_other_fingerprint_or_block_size_never_loads(tmp_path, store):
    store.write(entry(1), payload(1))
    other = DiskStore(tmp_path, b"\x02" * 16, NBYTES)
    assert other.dir != store.dir and other.scan() == []
    # same directory prefix, another full fingerprint: refused by the header
    twin = DiskStore(tmp_path, FP[:8] + b"\x09" * 8, NBYTES)
    assert twin.dir == store.dir
    assert twin.scan() == []
    assert not store.path(entry(1).block_hash).exists()


def test_keep_only(store):
    for i in (1, 2, 3):
        store.write(entry(i), payload(i))
    assert store.keep_only([entry(2).block_hash]) == 2
    assert [e.block_hash for e in store.scan()] == [entry(2).block_hash]


def test_fingerprint_tells_models_seeds_and_block_sizes_apart():
    model, cfg = load_model("tiny")
    base = model_fingerprint(model, cfg, 16, model.dtype, "sha256_cbor", b"r" * 32)
    assert base == model_fingerprint(model, cfg, 16, model.dtype, "sha256_cbor", b"r" * 32)
    assert base != model_fingerprint(model, cfg, 8, model.dtype, "sha256_cbor", b"r" * 32)
    assert base != model_fingerprint(model, cfg, 16, model.dtype, "sha256_cbor", b"s" * 32)
    assert base != model_fingerprint(model, cfg, 16, model.dtype, "xxhash", b"r" * 32)
    with torch.no_grad():
        model.layers[0].self_attn.qkv_proj.weight[0, 0] += 1.0
    assert base != model_fingerprint(model, cfg, 16, model.dtype, "sha256_cbor", b"r" * 32)
