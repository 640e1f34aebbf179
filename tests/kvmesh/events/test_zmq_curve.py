"""``kvmesh.events.zmq_curve``: which endpoints count as local; keys that cannot work refused."""
from __future__ import annotations

import os

import pytest
import zmq.auth

from kvmesh.events.zmq_curve import CurveClient, CurveServer, is_local, server_public_key


@pytest.mark.parametrize("endpoint,local", [
    ("tcp://127.0.0.1:5557", True), ("tcp://127.9.8.7:1", True), ("tcp://[::1]:5557", True),
    ("tcp://localhost:5557", True), ("tcp://127.0.0.1:*", True), ("ipc:///run/kv.sock", True),
    ("inproc://events", True), ("tcp://*:5557", False), ("tcp://0.0.0.0:5557", False),
    ("tcp://[::]:5557", False), ("tcp://10.0.0.3:5557", False), ("tcp://eth0:5557", False),
    ("tcp://gpu-node-3:5557", False), ("tcp://[::ffff:10.0.0.1]:5557", False),
    ("tcp://127.0.0.1;10.0.0.3:5557", False), ("epgm://eth0;239.1.1.1:5555", False),
    ("127.0.0.1:5557", False), ("", False)])
def test_only_loopback_ipc_and_inproc_are_local(endpoint, local):
    assert is_local(endpoint) is local


def test_keys_that_cannot_work_are_refused(tmp_path):
    public, secret = zmq.auth.create_certificates(tmp_path, "worker")
    empty = tmp_path / "none"
    empty.mkdir()
    with pytest.raises(ValueError, match="no secret key"):
        CurveServer.load(public, tmp_path)  # the public half only
    with pytest.raises(ValueError, match="no client certificate"):
        CurveServer.load(secret, empty)
    with pytest.raises(ValueError, match="not a zmq.auth certificate"):
        CurveServer.load(tmp_path / "missing.key_secret", tmp_path)
    with pytest.raises(ValueError, match="CURVE clients"):
        CurveServer.load(secret, tmp_path / "missing-dir")
    with pytest.raises(ValueError, match="not a zmq.auth certificate"):
        CurveClient.load(secret, "no-such-file.key")
    assert server_public_key(str(public)) == zmq.auth.load_certificate(public)[0]
    z85 = zmq.auth.load_certificate(public)[0].decode()
    assert server_public_key(z85) == z85.encode()


def test_a_secret_key_others_can_read_is_warned_about(tmp_path, caplog):
    _, secret = zmq.auth.create_certificates(tmp_path, "bridge")
    server, _ = zmq.auth.create_certificates(tmp_path, "worker")
    os.chmod(secret, 0o644)  # as zmq.auth writes it
    with caplog.at_level("WARNING", logger="kvmesh.ops.file_perms"):
        CurveClient.load(secret, str(server))
    assert "chmod 600" in caplog.text
    os.chmod(secret, 0o600)
    caplog.clear()
    CurveClient.load(secret, str(server))
    assert "chmod 600" not in caplog.text
