"""How every kvmesh caller dials a server: addresses, channel options and credentials.

One :class:`Dialer` builds every client channel of a process (the clients' service and
worker channels, the worker's link to the service), sync or ``grpc.aio``, so they all share
:data:`CHANNEL_OPTIONS` and the same TLS rule: TLS exactly when there are channel
credentials (``kvmesh.rpc.tls.TlsFiles.channel_credentials``: a CA was given), plaintext
otherwise. What a failed call leads to is ``kvmesh.rpc.retry``'s business, not this module's.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import grpc
import grpc.aio

from kvmesh.rpc.tls import TlsFiles

# Reconnect quickly to a replica or worker that comes back (gRPC's own default waits up to
# 120 s), and accept large responses (a Stats of a big cluster, a long generation).
CHANNEL_OPTIONS: tuple[tuple[str, int | str], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
)


def parse_addresses(addresses: str | Iterable[str]) -> list[str]:
    """``"h1:p1,h2:p2"`` or a list of such strings -> unique, stripped ``host:port`` list.

    Raises ``ValueError`` when no address is left.
    """
    parts = [addresses] if isinstance(addresses, str) else list(addresses)
    out: list[str] = []
    for part in parts:
        for addr in str(part).split(","):
            addr = addr.strip()
            if addr and addr not in out:
                out.append(addr)
    if not out:
        raise ValueError("no service address given (expected host:port[,host:port...])")
    return out


@dataclass(frozen=True)
class Dialer:
    """Channel factory: ``credentials`` (None: plaintext) and ``options`` for every channel.

    Building a channel does not connect; gRPC connects on the first call and reconnects
    by itself (with the backoff in :data:`CHANNEL_OPTIONS`).
    """

    credentials: grpc.ChannelCredentials | None = None
    options: tuple[tuple[str, int | str], ...] = CHANNEL_OPTIONS

    @classmethod
    def from_tls(cls, tls: TlsFiles | None) -> Dialer:
        """The dialer for ``tls`` settings (None: plaintext). Reads the PEM files now, so
        a missing file or a certificate without a CA raises ``ValueError`` here."""
        if tls is None:
            return cls()
        return cls(tls.channel_credentials(), CHANNEL_OPTIONS + tls.channel_options())

    def sync(self, address: str) -> grpc.Channel:
        """A blocking channel to ``address``."""
        if self.credentials is not None:
            return grpc.secure_channel(address, self.credentials, options=self.options)
        return grpc.insecure_channel(address, options=self.options)

    def aio(self, address: str) -> grpc.aio.Channel:
        """A ``grpc.aio`` channel to ``address`` (create it inside the loop that uses it)."""
        if self.credentials is not None:
            return grpc.aio.secure_channel(address, self.credentials, options=self.options)
        return grpc.aio.insecure_channel(address, options=self.options)
