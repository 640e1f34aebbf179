"""kvmesh.ops.file_perms' private paths: what a secret-holding directory or file must be, and
that a refusal changes nothing."""
from __future__ import annotations

import os
import stat

import pytest

from kvmesh.ops.file_perms import UnsafePath, check_private_dir, create_private_file, private_dir


def mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_create_private_file_is_0600_and_never_writes_through(tmp_path):
    os.umask(0o022)
    create_private_file(tmp_path / "f", b"ab", memoryview(b"cd"))
    assert (tmp_path / "f").read_bytes() == b"abcd" and mode(tmp_path / "f") == 0o600
    with pytest.raises(FileExistsError):
        create_private_file(tmp_path / "f", b"x")
    (tmp_path / "victim").write_bytes(b"keep")
    (tmp_path / "link").symlink_to(tmp_path / "victim")
    with pytest.raises(OSError):
        create_private_file(tmp_path / "link", b"x")
    assert (tmp_path / "victim").read_bytes() == b"keep"


def test_private_dir_creates_0700_and_refuses_what_others_control(tmp_path):
    os.umask(0o022)
    assert mode(private_dir(tmp_path / "a" / "b", "--x")) == 0o700
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o757)
    with pytest.raises(UnsafePath, match="--x .* writable by everyone"):
        private_dir(tmp_path / "open", "--x")
    with pytest.raises(UnsafePath, match="writable by everyone"):
        check_private_dir(tmp_path / "open", "--x")
    assert mode(tmp_path / "open") == 0o757  # a refusal changes nothing
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(UnsafePath, match="not a directory"):
        private_dir(tmp_path / "file", "--x")
    (tmp_path / "d").mkdir()
    (tmp_path / "ln").symlink_to(tmp_path / "d")
    with pytest.raises(UnsafePath, match="symlink"):
        private_dir(tmp_path / "ln", "--x", follow=False)
    check_private_dir(tmp_path / "missing", "--x")  # will be created private: passes
    assert not (tmp_path / "missing").exists()
