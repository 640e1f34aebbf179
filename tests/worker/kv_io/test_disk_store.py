"""The disk tier's files: atomic writes, verification on read, the scan at start, and who
can read, plant or redirect them (private modes, a MAC under the worker's key, no symlinks)."""
from __future__ import annotations

import hmac
import os
import stat

import cbor2
import pytest

from kvmesh.ops.file_perms import UnsafePath
from worker.kv_io.disk_key import KEY_ENV, KEY_FILE
from worker.kv_io.disk_store import CorruptBlock, DiskEntry, DiskStore

NBYTES = 256
FP = b"\x01" * 16
OTHER_UID = 4242  # a user that is not this process's


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


# --- who can read, plant or redirect files -----------------------------------------------

def mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_directories_files_and_key_are_private(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    os.umask(0o022)  # the usual default: what the old code's 0755/0644 came from
    store = DiskStore(tmp_path / "new" / "tier", FP, NBYTES)
    store.write(entry(1), payload(1))
    assert mode(store.root) == mode(store.dir) == 0o700
    assert mode(store.path(entry(1).block_hash)) == 0o600
    assert mode(store.root / KEY_FILE) == 0o600 and (store.root / KEY_FILE).stat().st_size == 32


def test_an_own_directory_open_to_others_is_narrowed(tmp_path):
    (tmp_path / "d").mkdir(mode=0o755)
    os.chmod(tmp_path / "d", 0o755)
    store = DiskStore(tmp_path / "d", FP, NBYTES)
    assert mode(store.root) == 0o700


@pytest.mark.parametrize("case", ["world_writable", "group_writable", "other_owner",
                                  "fp_dir_world_writable", "fp_dir_other_owner",
                                  "fp_dir_symlink"])
def test_a_directory_others_control_is_refused(tmp_path, case):
    root = tmp_path / "tier"
    root.mkdir(mode=0o700)
    fp_dir = root / FP.hex()[:16]
    if case == "world_writable":
        os.chmod(root, 0o777)
    elif case == "group_writable":
        os.chmod(root, 0o770)
    elif case == "other_owner":
        os.chown(root, OTHER_UID, OTHER_UID)  # the tests run as root: as an attacker would
    elif case == "fp_dir_symlink":  # the fingerprint directory redirected elsewhere
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        fp_dir.symlink_to(elsewhere)
    else:  # another user made the fingerprint directory first
        fp_dir.mkdir()
        if case == "fp_dir_world_writable":
            os.chmod(fp_dir, 0o777)
        else:
            os.chown(fp_dir, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePath):
        DiskStore(root, FP, NBYTES)


def test_a_symlink_at_the_disk_dir_is_judged_by_its_target(tmp_path):
    target = tmp_path / "target"
    target.mkdir(mode=0o777)
    os.chmod(target, 0o777)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(UnsafePath, match="writable by everyone"):
        DiskStore(tmp_path / "link", FP, NBYTES)
    os.chmod(target, 0o700)
    assert DiskStore(tmp_path / "link", FP, NBYTES).root == target


def test_a_file_planted_under_another_key_is_never_served(tmp_path, store):
    """The attacker computes the right hashes and writes a well-formed file, but without
    this worker's key: scan and read refuse it, delete it and count it."""
    attacker = DiskStore(tmp_path, FP, NBYTES, key=b"k" * 32)  # same directory, its own key
    attacker.write(entry(1), payload(9))
    assert store.scan() == [] and store.rejected == 1
    assert not store.path(entry(1).block_hash).exists()
    attacker.write(entry(2), payload(9))
    with pytest.raises(CorruptBlock):
        store.read(entry(2).block_hash)
    assert store.rejected == 2


def test_a_rewritten_payload_fails_its_mac(store):
    store.write(entry(1), payload(1))
    path = store.path(entry(1).block_hash)
    data = bytearray(path.read_bytes())
    data[-NBYTES:] = payload(9)  # same size, other bytes: a plain checksum would be redone
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptBlock, match="MAC"):
        store.read(entry(1).block_hash)


@pytest.mark.parametrize("bad", [
    dict(tokens=["x"] * 4), dict(tokens=[True, 1, 2, 3]), dict(tokens=[-1, 1, 2, 3]),
    dict(tokens="abcd"), dict(extra=[{"a": 1}]), dict(extra="salt"), dict(hash=b"\x01"),
    dict(parent=12)], ids=repr)
def test_one_malformed_header_costs_that_file_alone(store, bad):
    """Even under the right key (a bug, a leaked key), a header the hashing code cannot take
    is deleted and counted; the scan goes on with the others."""
    store.write(entry(1), payload(1))
    forged = entry(2)
    store.write(forged, payload(2))
    path = store.path(forged.block_hash)
    raw = path.read_bytes()
    hlen = int.from_bytes(raw[8:12], "little")
    header = {**cbor2.loads(raw[12:12 + hlen]), **bad}
    hb = cbor2.dumps(header)
    head = raw[:8] + len(hb).to_bytes(4, "little") + hb
    head += hmac.digest(store._header_key, head, "sha256")
    path.write_bytes(head + raw[12 + hlen + 32:])
    assert store.scan() == [entry(1)]
    assert store.rejected == 1 and not path.exists()


def test_a_symlink_at_a_block_path_is_never_followed(tmp_path, store):
    outside = DiskStore(tmp_path / "outside", FP, NBYTES, key=b"k" * 32)
    outside.write(entry(1), payload(9))
    target = outside.path(entry(1).block_hash)
    store.path(entry(1).block_hash).symlink_to(target)  # planted: the block's own name
    with pytest.raises(CorruptBlock):
        store.read(entry(1).block_hash)
    assert store.scan() == []
    assert target.exists() and not store.path(entry(1).block_hash).is_symlink()
    # a write over a planted link replaces the link, never the file it points at
    store.path(entry(2).block_hash).symlink_to(target)
    store.write(entry(2), payload(2))
    assert not store.path(entry(2).block_hash).is_symlink()
    assert bytes(outside.read(entry(1).block_hash)) == payload(9)


def test_a_fifo_at_a_block_path_cannot_hang_the_start(store):
    os.mkfifo(store.path(entry(1).block_hash))
    assert store.scan() == [] and store.rejected == 1


def test_the_key_survives_restarts_and_the_environment_overrides_it(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    DiskStore(tmp_path, FP, NBYTES).write(entry(1), payload(1))
    again = DiskStore(tmp_path, FP, NBYTES)  # a restart: the same key file
    assert bytes(again.read(entry(1).block_hash)) == payload(1)
    monkeypatch.setenv(KEY_ENV, "e" * 40)  # another key: the old files do not verify
    assert DiskStore(tmp_path, FP, NBYTES).scan() == []
    monkeypatch.setenv(KEY_ENV, "short")
    with pytest.raises(UnsafePath, match="at least"):
        DiskStore(tmp_path, FP, NBYTES)


@pytest.mark.parametrize("case", ["readable", "other_owner", "symlink", "wrong_size"])
def test_a_key_file_others_could_reach_stops_the_start(tmp_path, monkeypatch, case):
    monkeypatch.delenv(KEY_ENV, raising=False)
    DiskStore(tmp_path, FP, NBYTES)
    key = tmp_path / KEY_FILE
    if case == "readable":
        os.chmod(key, 0o644)
    elif case == "other_owner":
        os.chown(key, OTHER_UID, OTHER_UID)
    elif case == "symlink":
        real = tmp_path / "real.key"
        os.replace(key, real)
        key.symlink_to(real)
    else:
        key.write_bytes(b"short")
    with pytest.raises(UnsafePath):
        DiskStore(tmp_path, FP, NBYTES)
