"""TLS settings of one kvmesh process, as gRPC credentials (PEM files, read when asked).

One identity (``cert``/``key``) and one trust root (``ca``) per process; a client speaks TLS
exactly when it has a ``ca``, and a client with a certificate but no ``ca`` is refused rather
than dialing in plaintext. Bad files raise ``ValueError`` naming the flag, at start.

See docs/architecture.md#rpc-auth-limits-tls-retries.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from kvmesh.ops.file_perms import warn_if_readable_by_others


def _read(path: str, flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot read ({e.strerror or e})") from None


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the PEM files (see the module docstring for what each one does)."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    client_auth: bool = False      # servers: require client certificates signed by ``ca``
    server_name: str | None = None  # clients: expected server name, if not the dialled host

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("TLS needs both --tls-cert and --tls-key (or neither)")
        if self.client_auth and self.ca is None:
            raise ValueError("--tls-client-auth needs --tls-ca (the CA of client certificates)")

    @property
    def dials_tls(self) -> bool:
        """Whether a client with these settings speaks TLS (it has a CA)."""
        return self.ca is not None

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """Credentials for ``add_secure_port``, or ``None`` (plaintext) without a cert."""
        if self.cert is None or self.key is None:
            return None
        pair = (self._key(), _read(self.cert, "--tls-cert"))
        roots = _read(self.ca, "--tls-ca") if self.ca is not None else None
        return grpc.ssl_server_credentials(
            [pair], root_certificates=roots if self.client_auth else None,
            require_client_auth=self.client_auth)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """Credentials for ``secure_channel``, or ``None`` (plaintext) without a CA.

        Raises ``ValueError`` for a client certificate without a CA: the caller asked for TLS
        (and maybe mutual TLS) and would get plaintext."""
        if self.ca is None:
            if self.cert is not None:
                raise ValueError("--tls-cert/--tls-key without --tls-ca: a client speaks TLS "
                                 "only with the CA that signed the servers' certificates; "
                                 "give --tls-ca (refusing to fall back to plaintext)")
            return None
        key = self._key() if self.key is not None else None
        cert = _read(self.cert, "--tls-cert") if self.cert is not None else None
        return grpc.ssl_channel_credentials(root_certificates=_read(self.ca, "--tls-ca"),
                                            private_key=key, certificate_chain=cert)

    def _key(self) -> bytes:
        assert self.key is not None
        warn_if_readable_by_others(self.key, "--tls-key")
        return _read(self.key, "--tls-key")

    def channel_options(self) -> tuple[tuple[str, str], ...]:
        """Extra channel options (the server-name override, when set)."""
        if self.server_name and self.dials_tls:
            return (("grpc.ssl_target_name_override", self.server_name),)
        return ()


def tls_files(cert: str | None = None, key: str | None = None, ca: str | None = None,
              client_auth: bool = False) -> TlsFiles | None:
    """``TlsFiles`` from command-line flags, or ``None`` when none is given."""
    if cert is None and key is None and ca is None and not client_auth:
        return None
    return TlsFiles(cert=cert, key=key, ca=ca, client_auth=client_auth)
