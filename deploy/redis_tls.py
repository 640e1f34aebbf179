"""Mutual TLS for the embedded Redis/Valkey cluster: a private CA made at start, and whether
a server binary can speak TLS at all.

``make_redis_tls`` writes the CA, node and client certificates (keys 0600); the CA's key never
touches the disk, so nobody can mint another certificate the nodes accept. ``tls_support``
says whether a binary was built with TLS.

See docs/architecture.md#embedded-redis-and-valkey.
"""
from __future__ import annotations

import datetime as dt
import functools
import ipaddress
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

__all__ = ["VALID_DAYS", "RedisTls", "make_redis_tls", "tls_support"]

VALID_DAYS = 365  # a launcher may run for long; the CA dies with it anyway

# What a binary built without TLS says when asked for a TLS port (Valkey, then Redis).
_NO_TLS_MARKERS = ("Failed finding TLS support", "Missing implement of connection type tls",
                   "TLS support was not compiled")


@dataclass(frozen=True)
class RedisTls:
    """Paths of one cluster's TLS files (see the module contract)."""

    ca: str
    node_cert: str
    node_key: str
    client_cert: str
    client_key: str

    def server_config(self) -> list[str]:
        """Config lines that make a node TLS-only, mutual, bus and replication included."""
        return [f'tls-cert-file "{self.node_cert}"', f'tls-key-file "{self.node_key}"',
                f'tls-ca-cert-file "{self.ca}"', "tls-auth-clients yes",
                "tls-replication yes", "tls-cluster yes"]

    def url_query(self) -> str:
        """``ssl_ca_certs=...&ssl_certfile=...&ssl_keyfile=...`` for a ``rediss://`` URL."""
        return urlencode({"ssl_ca_certs": self.ca, "ssl_certfile": self.client_cert,
                          "ssl_keyfile": self.client_key})


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def make_redis_tls(directory: str | Path, host: str = "127.0.0.1") -> RedisTls:
    """Make a CA, a node and a client certificate in ``directory`` (see the contract)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = Path(directory)
    if d.stat().st_mode & 0o077:
        raise PermissionError(f"{d} is readable by others: TLS keys need a 0700 directory")
    now = dt.datetime.now(dt.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def builder(subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
                ) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(issuer)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=VALID_DAYS)))

    ca_key = ec.generate_private_key(ec.SECP256R1())  # memory only: see the module doc
    ca = (builder("kvmesh cluster CA", name("kvmesh cluster CA"), ca_key)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    alt: list[x509.GeneralName] = [x509.DNSName("localhost"),
                                   x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    try:
        if ipaddress.ip_address(host) != ipaddress.ip_address("127.0.0.1"):
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        alt.append(x509.DNSName(host))
    pem = serialization.Encoding.PEM
    _write(d / "ca.crt", ca.public_bytes(pem), 0o644)

    def leaf(stem: str, cn: str, usages: list[x509.ObjectIdentifier]) -> tuple[str, str]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (builder(cn, ca.subject, key)
                .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .sign(ca_key, hashes.SHA256()))
        crt, k = d / f"{stem}.crt", d / f"{stem}.key"
        _write(crt, cert.public_bytes(pem), 0o644)
        _write(k, key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()), 0o600)
        return str(crt), str(k)

    # a node serves clients and dials its peers' bus with one certificate
    node = leaf("node", "kvmesh redis node",
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    client = leaf("client", "kvmesh service", [ExtendedKeyUsageOID.CLIENT_AUTH])
    return RedisTls(str(d / "ca.crt"), *node, *client)


@functools.lru_cache(maxsize=8)
def tls_support(executable: str) -> bool:
    """Whether ``executable`` (a redis-server / valkey-server) was built with TLS.

    Asks it for a TLS port with certificate files that do not exist: a TLS build stops at
    loading them, one without TLS says it has none (the markers above). It never listens.
    """
    with tempfile.TemporaryDirectory(prefix="kvmesh-tls-probe-") as tmp:
        missing = os.path.join(tmp, "missing")
        try:
            out = subprocess.run(
                [executable, "--port", "0", "--tls-port", "1", "--tls-cert-file", missing,
                 "--tls-key-file", missing, "--tls-ca-cert-file", missing, "--save", "",
                 "--dir", tmp],
                capture_output=True, text=True, timeout=10, cwd=tmp, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return False
    text = out.stdout + out.stderr
    return not any(m in text for m in _NO_TLS_MARKERS)
