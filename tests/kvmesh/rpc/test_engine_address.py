"""Worker addresses of both kinds: a gRPC ``host:port`` and an HTTP engine's base URL, as the
service accepts them and as callers tell them apart."""
from __future__ import annotations

import pytest

from kvmesh.rpc.engine_address import host_port, http_address, is_http
from service.validate import RequestError, address


@pytest.mark.parametrize("value", [
    "h:1", "10.0.0.3:8000", "[::1]:50051", "http://h:8000", "https://gpu-3.example:443",
    "http://[::1]:8000", "http://10.0.0.3:8000"])
def test_the_service_accepts_both_kinds(value: str) -> None:
    assert address(value) == value


@pytest.mark.parametrize("value", [
    "http://h:8000/v1", "http://user@h:8000", "ftp://h:21", "http://h", "http://", "grpc://h:1",
    "HTTP://h:1", "http://h:8000\n", "http://http://h:1"])
def test_the_service_refuses_anything_else(value: str) -> None:
    with pytest.raises(RequestError):
        address(value)


def test_callers_tell_the_kinds_apart() -> None:
    assert is_http("http://h:1") and is_http("https://h:1") and not is_http("h:1")
    assert host_port("https://h:1") == host_port("h:1") == "h:1"
    assert http_address("h:1") == "http://h:1" and http_address("h:1", tls=True) == "https://h:1"
