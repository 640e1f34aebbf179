"""What a launcher checks before it starts a cluster, and how it words what a child hit.

Each function raises (or returns) a ``deploy.launch_error.LaunchError`` whose one line names
the flag a ``kvmesh up`` user changes; the local launcher (``deploy.local``) and the Ray one
(``deploy.ray.cluster``) share them.

- :func:`check_model`: ``--model`` is ``tiny`` or a readable model directory
  (``worker.model_source``), refused before Redis, the service and N workers start and each
  die loading it.
- :func:`check_redis_url`: ``--redis-url`` answers ``PING`` (with its password) within a few
  seconds; a service on a Redis that does not answer starts anyway and its workers never
  register, so the start would wait its whole timeout and end in a ``TimeoutError``.
- :func:`embedded_redis`: the embedded Valkey, or why none can start (no server binary).
- :func:`port_taken`: the failure of a service replica that could not bind its port.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from deploy.launch_error import ChildExited, LaunchError
from deploy.ports import in_use
from deploy.redis_server import start_redis
from kvmesh.ops.redact import redact_url

if TYPE_CHECKING:
    from deploy.redis_server import RedisServer

REDIS_TIMEOUT_S = 3.0


def check_model(model: str) -> None:
    """``LaunchError`` unless ``model`` (``--model``) is ``tiny`` or a model directory that
    exists, can be read and holds config.json and safetensors weights."""
    from worker.model_source import check_model_source

    try:
        check_model_source(model)
    except ValueError as e:
        raise LaunchError(f"--model {model}: {e}") from None


def check_redis_url(url: str, timeout: float = REDIS_TIMEOUT_S) -> None:
    """``LaunchError`` unless the Redis/Valkey at ``url`` (``--redis-url``) answers PING;
    for a cluster URL, the node it names (the service finds the others from it)."""
    import redis

    from service.index.connect import plain_url

    shown = redact_url(url)
    try:
        client = redis.Redis.from_url(plain_url(url), socket_timeout=timeout,
                                      socket_connect_timeout=timeout)
    except ValueError as e:  # not a Redis URL at all
        raise LaunchError(f"--redis-url {shown}: {e}") from None
    try:
        client.ping()
    except redis.AuthenticationError as e:
        raise LaunchError(f"--redis-url {shown}: refused the password ({e}); put the "
                          "server's password in the URL (redis://:PASSWORD@HOST:PORT)") from None
    except (redis.RedisError, OSError) as e:
        raise LaunchError(f"--redis-url {shown}: no answer ({e}); give the URL of a running "
                          "Redis/Valkey, or leave --redis-url out for an embedded one") from None
    finally:
        client.close()


def embedded_redis(host: str) -> RedisServer:
    """A started embedded Valkey; ``LaunchError`` when there is no server binary to start
    (none installed, or ``KVMESH_REDIS_SERVER`` names no executable)."""
    try:
        return start_redis(host=host)
    except FileNotFoundError as e:
        raise LaunchError(f"cannot start the embedded Valkey ({e}); or give --redis-url, the "
                          "URL of a running Redis/Valkey") from None


def port_taken(host: str, port: int, failure: ChildExited) -> LaunchError:
    """What to say when service replica ``failure.name`` could not bind ``host:port``
    (``--port``; replica i takes ``--port`` + i)."""
    why = ("in use by another process" if in_use(host, port)
           else failure.cause)  # a port no longer in use: the child's own words
    return LaunchError(f"--port: {failure.name} cannot bind {host}:{port} ({why}); choose "
                       "another --port, or --port 0 for a free one")
