"""Which endpoints only this host can reach: plain ZMQ (events, peer KV) is allowed there only."""
from __future__ import annotations

import pytest

from kvmesh.ops.loopback import is_local


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
