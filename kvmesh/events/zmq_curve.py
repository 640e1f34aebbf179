"""ZMQ CURVE for kvmesh's event sockets: who may bind plain, and the keys of those who may not.

The events carry token ids and salts and ZMQ has no credential, so an endpoint only this
host can reach (``kvmesh.ops.loopback.is_local``) may be plain; any other needs CURVE, with
only the listed client keys let in. Secret keys come from files, never a command line.

See docs/architecture.md#event-forms-and-wire-formats.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from kvmesh.ops.file_perms import warn_if_readable_by_others

ZAP_DOMAIN = b"kvmesh"
Z85_KEY_LEN = 40  # a 32-byte CURVE key in Z85


def _load_key_file(path: str | Path, what: str, secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret_key = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as e:
        raise ValueError(f"{what} {str(path)!r}: not a zmq.auth certificate ({e})") from None
    if secret and secret_key is None:
        raise ValueError(f"{what} {str(path)!r} holds no secret key (give NAME.key_secret, "
                         "as zmq.auth.create_certificates writes it)")
    if secret:
        warn_if_readable_by_others(path, what)
    return public, secret_key


def server_public_key(value: str) -> bytes:
    """A server's public key from ``value``: 40 characters of Z85, or the path of its
    zmq.auth certificate (``NAME.key``). ``ValueError`` otherwise."""
    if len(value) == Z85_KEY_LEN and not Path(value).exists():
        try:
            z85.decode(value)
        except (ValueError, KeyError):
            raise ValueError(f"CURVE server key {value!r} is not Z85") from None
        return value.encode()
    return _load_key_file(value, "CURVE server key file", secret=False)[0]


class _ListedKeys:
    """The ZAP policy: a client is let in when its public key is listed (pyzmq calls
    ``callback`` with the Z85 key for every CURVE handshake)."""

    def __init__(self, keys: frozenset[bytes]) -> None:
        self.keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys


@dataclass(frozen=True)
class CurveServer:
    """A CURVE server identity (``public``/``secret``: Z85) and the client keys it lets in."""

    public: bytes
    secret: bytes
    clients: frozenset[bytes]

    @classmethod
    def load(cls, key_file: str | Path, clients_dir: str | Path) -> CurveServer:
        """The server certificate ``key_file`` (with its secret) and every client public
        certificate (``*.key``) in ``clients_dir``; ``ValueError`` for a missing or unreadable
        file, a certificate without its secret, or a directory without any client key (a
        server nobody could reach is a mistake, not a setting)."""
        public, secret = _load_key_file(key_file, "CURVE key", secret=True)
        try:
            clients = zmq.auth.load_certificates(str(clients_dir))
        except (OSError, ValueError) as e:
            raise ValueError(f"CURVE clients {str(clients_dir)!r}: {e}") from None
        if not clients:
            raise ValueError(f"CURVE clients {str(clients_dir)!r}: no client certificate "
                             "(*.key) in it")
        assert secret is not None
        return cls(public, secret, frozenset(clients))

    def authenticator(self, ctx: zmq.Context) -> ThreadAuthenticator:
        """Start the ZAP handler of ``ctx`` letting in only ``clients`` (stop it before the
        context terminates). Every socket of ``ctx`` that ``apply`` set up is covered."""
        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve_callback(ZAP_DOMAIN.decode(), credentials_provider=_ListedKeys(
            self.clients))
        return auth

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE server (before it binds)."""
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.setsockopt(zmq.CURVE_SERVER, 1)


@dataclass(frozen=True)
class CurveClient:
    """A CURVE client identity (``public``/``secret``: Z85) and the server key it expects."""

    public: bytes
    secret: bytes
    server: bytes

    @classmethod
    def load(cls, key_file: str | Path, server_key: str) -> CurveClient:
        """The client certificate ``key_file`` (with its secret) and the server's public key
        (``server_public_key``); ``ValueError`` as those."""
        public, secret = _load_key_file(key_file, "CURVE key", secret=True)
        assert secret is not None
        return cls(public, secret, server_public_key(server_key))

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client of ``server`` (before it connects)."""
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server)
