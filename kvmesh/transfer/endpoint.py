"""Endpoint strings: where a receiver pulls one offer from, and the one-time key it presents.

Form: ``<transport>://<host>:<port>/<key as 32 hex digits>``. The key is 16 random bytes
drawn per offer; whoever holds the endpoint may pull the offer once, so the endpoint is a
secret handed only to the requester (inside the fetch reply, after its ticket verified).

See docs/architecture.md#peer-kv-transfer-the-data-plane.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvmesh.transfer.frames import KEY_BYTES, TransferError


@dataclass(frozen=True, slots=True)
class Endpoint:
    transport: str
    host: str
    port: int
    key: bytes

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.transport}://{host}:{self.port}/{self.key.hex()}"

    @property
    def address(self) -> str:
        """``host:port`` (brackets around an IPv6 host)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse(text: str) -> Endpoint:
    """The endpoint ``text`` names; TransferError("malformed") for anything else."""
    try:
        transport, rest = text.split("://", 1)
        hostport, key_hex = rest.rsplit("/", 1)
        host, port = hostport.rsplit(":", 1)
        key = bytes.fromhex(key_hex)
        if len(key) != KEY_BYTES or not transport or not host:
            raise ValueError(text)
        return Endpoint(transport, host.strip("[]"), int(port), key)
    except ValueError:
        raise TransferError("malformed", 0, f"not a data-plane endpoint: {text!r} (expected "
                            "transport://host:port/<32 hex digits>)") from None
