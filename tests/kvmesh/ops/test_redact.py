"""kvmesh.ops.redact: passwords out of printed URLs, everything else unchanged."""
from __future__ import annotations

import pytest

from kvmesh.ops.redact import redact_url


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:pw@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
    ("redis://user:pw@h:1/0", "redis://user:***@h:1/0"),
    ("rediss://:p%40w@h:1/0?ssl_ca_certs=/ca.pem", "rediss://:***@h:1/0?ssl_ca_certs=/ca.pem"),
    ("redis://h:1/0?password=pw&db=1", "redis://h:1/0?password=***&db=1"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis://user@h/0", "redis://user@h/0"),
    ("not a url", "not a url"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
