"""deploy.redis_server: a real server, restartable empty on the same port, that refuses
clients without its password (attack: rewrite a worker record with no credentials)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import redis

from deploy.redis_server import find_redis_binary, start_redis


@pytest.mark.integration
def test_start_restart_empty_and_stop() -> None:
    assert find_redis_binary()
    with start_redis() as server:
        assert server.alive and server.url == \
            f"redis://:{server.password}@127.0.0.1:{server.port}/0"
        db = redis.Redis.from_url(server.url)
        assert db.set("k", "v")
        port = server.port
        server.kill()
        assert not server.alive
        server.start()  # same port, same password: the URL still works
        assert server.port == port and db.get("k") is None  # empty
        assert db.config_get("appendonly") == {"appendonly": "no"}
        db.close()
    assert not server.alive and server.pid is None
    server.stop()  # idempotent


def test_no_password_no_access_and_no_password_on_the_command_line(redis_url: str) -> None:
    """Attack: plain redis-py with no credentials rewrites a worker record's address (the
    index's next Route then sends a tenant's prompt and token to the attacker). The server
    kvmesh starts answers such a client NOAUTH, however it connects."""
    owner = redis.Redis.from_url(redis_url, decode_responses=True)
    owner.hset("kvmesh:w:worker-0", mapping={"address": "127.0.0.1:5000"})
    port = owner.connection_pool.connection_kwargs["port"]
    for protocol in (2, 3):  # RESP3 opens with HELLO, RESP2 sends the command straight away
        with redis.Redis(host="127.0.0.1", port=port, protocol=protocol) as anyone, \
                pytest.raises(redis.AuthenticationError):
            anyone.hset("kvmesh:w:worker-0", "address", "attacker:6666")
    with redis.Redis(host="127.0.0.1", port=port, password="guess") as wrong, \
            pytest.raises(redis.AuthenticationError):
        wrong.ping()
    assert owner.hget("kvmesh:w:worker-0", "address") == "127.0.0.1:5000"
    assert owner.config_get("protected-mode") == {"protected-mode": "yes"}
    owner.close()


@pytest.mark.integration
def test_password_reaches_the_server_in_a_private_file_only() -> None:
    with start_redis() as server:
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes().decode()
        assert server.password not in cmdline
        conf = Path(server.config_file)
        assert stat.S_IMODE(os.stat(conf).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(conf.parent).st_mode) == 0o700
        assert server.password not in repr(server) and "***" in repr(server)
