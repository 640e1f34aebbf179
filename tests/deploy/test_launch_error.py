"""The one line a failed start is reduced to, and the checks that refuse bad flags early."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy.launch_error import ChildExited, LaunchError, cause_of
from deploy.ray.address import check_ray_address
from tests.ports import closed_port_address
from worker.model_source import check_model_source

TRACEBACK = """Traceback (most recent call last):
  File "/x/service/server.py", line 173, in create_server
    raise RuntimeError(f"cannot bind {address}: {e}") from e
RuntimeError: cannot bind 127.0.0.1:50091: Failed to bind to address 127.0.0.1:50091"""


def test_the_cause_is_the_exception_line_of_a_traceback():
    lines = ["2026-12-02 INFO kvmesh.service: starting", *TRACEBACK.splitlines()]
    assert cause_of(lines) == ("RuntimeError: cannot bind 127.0.0.1:50091: Failed to bind to "
                               "address 127.0.0.1:50091")


def test_a_kvmesh_error_line_wins_over_a_traceback():
    lines = ["error: --disk-dir /x is writable by others", *TRACEBACK.splitlines()]
    assert cause_of(lines) == "--disk-dir /x is writable by others"


def test_otherwise_the_last_words_said():
    assert cause_of(["starting", "  out of memory  ", ""]) == "out of memory"
    assert cause_of([]) == "no output"


def test_a_launch_error_is_one_line():
    err = ChildExited("worker-0", 1, "ValueError: a\nb")
    assert str(err) == "worker-0 exited with code 1: ValueError: a b"
    assert isinstance(err, LaunchError) and "\n" not in str(LaunchError("x\n  y"))


def test_tiny_and_a_model_directory_pass(tmp_path: Path):
    check_model_source("tiny")
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 8}))
    (tmp_path / "model.safetensors").write_bytes(b"")  # the loader reads the tensors
    check_model_source(str(tmp_path))


def test_a_model_path_that_is_a_file(tmp_path: Path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        check_model_source(str(tmp_path / "f"))


def test_a_ray_address_where_nothing_listens_is_refused_at_once():
    address = closed_port_address()
    with pytest.raises(LaunchError, match=f"RAY_ADDRESS {address}: nothing answers"):
        check_ray_address(address, "RAY_ADDRESS")
    with pytest.raises(LaunchError, match="Connection refused"):
        check_ray_address(f"ray://{address}")
    for left_to_ray in ("auto", "local", "not an address"):
        check_ray_address(left_to_ray)  # ray.init's to judge
