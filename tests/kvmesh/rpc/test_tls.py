"""TLS settings that would silently weaken a process: a client certificate without a CA
(plaintext), and private keys other users can read."""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from client import AsyncKvmeshClient
from kvmesh.ops.file_perms import warn_if_readable_by_others
from kvmesh.rpc.tls import TlsFiles
from service.config import ServiceConfig
from service.server import create_server
from worker.main import WorkerOptions, serve

if TYPE_CHECKING:  # the certs fixture skips where `cryptography` is missing
    from tests.certificates import Certs


def test_client_certificate_without_ca_refuses_plaintext(certs: Certs) -> None:
    """Attack: a client given ``--tls-cert/--tls-key`` but no ``--tls-ca`` talked plaintext
    to whatever answered (here a real plaintext service), token and prompts in the clear."""
    no_ca = TlsFiles(cert=str(certs.client_cert), key=str(certs.client_key))

    async def main() -> None:
        server, port = await create_server("127.0.0.1:0", ServiceConfig())
        await server.start()
        try:
            with pytest.raises(ValueError, match="without --tls-ca"):
                async with AsyncKvmeshClient(f"127.0.0.1:{port}", tls=no_ca) as client:
                    await client.stats()  # the old code got here, over plaintext
            cli = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "from client.cli import app; app()", "stats",
                "--service", f"127.0.0.1:{port}",
                "--tls-cert", str(certs.client_cert), "--tls-key", str(certs.client_key),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            out, _ = await asyncio.wait_for(cli.communicate(), 60)
            assert cli.returncode == 2 and b"without --tls-ca" in out, out.decode()
        finally:
            await server.stop(None)

    asyncio.run(main())
    # a server with only a certificate still serves TLS (no client role, no CA needed)
    assert no_ca.server_credentials() is not None


def test_worker_with_certificate_but_no_ca_refuses_to_link_in_plaintext(certs: Certs) -> None:
    opts = WorkerOptions(services=("127.0.0.1:1",), num_blocks=8, device="cpu",
                         tls=TlsFiles(cert=str(certs.server_cert), key=str(certs.server_key)))
    stop = asyncio.Event()
    stop.set()  # were it let through, serve would return at once
    with pytest.raises(ValueError, match="without --tls-ca"):
        asyncio.run(serve(opts, stop))


def test_readable_key_files_are_warned_about(tmp_path, certs: Certs,
                                             caplog: pytest.LogCaptureFixture) -> None:
    key = tmp_path / "server.key"
    key.write_bytes(certs.server_key.read_bytes())
    tls = TlsFiles(cert=str(certs.server_cert), key=str(key), ca=str(certs.ca))
    for mode, warned in ((0o600, False), (0o400, False), (0o640, True), (0o604, True)):
        os.chmod(key, mode)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kvmesh"):
            assert warn_if_readable_by_others(key, "--tls-key") is warned
            tls.server_credentials()
            tls.channel_credentials()
        hits = [r for r in caplog.records if "readable by other users" in r.getMessage()]
        assert len(hits) == (3 if warned else 0), (oct(mode), caplog.text)
        assert all("--tls-key" in r.getMessage() and str(key) in r.getMessage() for r in hits)
    assert warn_if_readable_by_others(tmp_path / "missing", "--tls-key") is False
