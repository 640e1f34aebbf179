"""deploy.redis_server: a real server, restartable empty on the same port."""
from __future__ import annotations

import socket

from deploy.redis_server import RedisServer, find_redis_binary, start_redis


def command(server: RedisServer, *args: str) -> bytes:
    payload = f"*{len(args)}\r\n".encode() + b"".join(
        f"${len(a)}\r\n{a}\r\n".encode() for a in args)
    with socket.create_connection((server.host, server.port), timeout=5) as s:
        s.sendall(payload)
        return s.recv(256)


def test_start_restart_empty_and_stop() -> None:
    assert find_redis_binary()
    with start_redis() as server:
        assert server.alive and server.url == f"redis://127.0.0.1:{server.port}/0"
        assert command(server, "SET", "k", "v") == b"+OK\r\n"
        port = server.port
        server.kill()
        assert not server.alive
        server.start()
        assert server.port == port and command(server, "GET", "k") == b"$-1\r\n"  # empty
        assert command(server, "CONFIG", "GET", "appendonly").endswith(b"no\r\n")
    assert not server.alive and server.pid is None
    server.stop()  # idempotent
