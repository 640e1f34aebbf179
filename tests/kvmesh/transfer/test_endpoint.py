"""Endpoint strings round-trip; anything else is a malformed endpoint."""
from __future__ import annotations

import pytest

from kvmesh.transfer.endpoint import Endpoint, parse
from kvmesh.transfer.frames import TransferError


@pytest.mark.parametrize("host", ["127.0.0.1", "worker-3.local", "::1"])
def test_an_endpoint_round_trips(host: str) -> None:
    ep = Endpoint("zmq", host, 5555, bytes(range(16)))
    assert parse(str(ep)) == ep
    assert ep.address.endswith(":5555")


@pytest.mark.parametrize("text", ["", "zmq://127.0.0.1:1/abcd", "zmq://127.0.0.1/" + "0" * 32,
                                  "127.0.0.1:1/" + "0" * 32, "zmq://:1/" + "0" * 32,
                                  "zmq://h:x/" + "0" * 32, "zmq://h:1/" + "g" * 32])
def test_a_bad_endpoint_is_malformed(text: str) -> None:
    with pytest.raises(TransferError) as e:
        parse(text)
    assert e.value.reason == "malformed"
