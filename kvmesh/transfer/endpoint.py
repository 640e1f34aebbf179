"""Endpoint strings: where a receiver pulls one offer from, and the one-time key it presents.

Form: ``<transport>://<host>:<port>/<key as 32 hex digits>[?curve=<64 hex digits>]``. The key
is 16 random bytes drawn per offer; whoever holds the endpoint may pull the offer once, so the
endpoint is a secret handed only to the requester (inside the fetch reply, after its ticket
verified). ``curve`` is the source's CURVE public key when its zmq socket encrypts (a data
plane on an address other hosts reach): the receiver learns it from that reply, so when the
worker RPCs run TLS a man in the middle can neither read the bytes nor pose as the source.
Without TLS on the worker RPCs the reply, key and endpoint, crosses in the clear like the
prompts it serves (docs/security.md: TLS is what protects the control channel).

See docs/architecture.md#peer-kv-transfer-the-data-plane.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvmesh.transfer.frames import KEY_BYTES, TransferError

CURVE_KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class Endpoint:
    transport: str
    host: str
    port: int
    key: bytes
    server_key: bytes = b""  # the source's CURVE public key (32 bytes), or none: plaintext

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        curve = f"?curve={self.server_key.hex()}" if self.server_key else ""
        return f"{self.transport}://{host}:{self.port}/{self.key.hex()}{curve}"

    @property
    def address(self) -> str:
        """``host:port`` (brackets around an IPv6 host)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse(text: str) -> Endpoint:
    """The endpoint ``text`` names; TransferError("malformed") for anything else."""
    try:
        transport, rest = text.split("://", 1)
        rest, sep, query = rest.partition("?")
        hostport, key_hex = rest.rsplit("/", 1)
        host, port = hostport.rsplit(":", 1)
        key = bytes.fromhex(key_hex)
        if sep and not query.startswith("curve="):
            raise ValueError(text)
        server_key = bytes.fromhex(query.removeprefix("curve=")) if sep else b""
        if (len(key) != KEY_BYTES or not transport or not host
                or (sep and len(server_key) != CURVE_KEY_BYTES)):
            raise ValueError(text)
        return Endpoint(transport, host.strip("[]"), int(port), key, server_key)
    except ValueError:
        raise TransferError("malformed", 0, f"not a data-plane endpoint: {text!r} (expected "
                            "transport://host:port/<32 hex digits>[?curve=<64 hex digits>])"
                            ) from None
