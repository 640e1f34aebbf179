"""``kvmesh.events.zmq_curve``: keys that cannot work are refused; only listed clients read."""
from __future__ import annotations

import os

import pytest
import zmq.auth

from kvmesh.events.zmq_curve import CurveClient, CurveServer, server_public_key


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
