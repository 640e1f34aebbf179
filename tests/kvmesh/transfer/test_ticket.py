"""Fetch tickets: what verifies, and every way a holder of someone else's ticket is refused."""
from __future__ import annotations

import pytest

from kvmesh.transfer import ticket as t

W, H, V = t.peer_key("cred-w"), t.peer_key("cred-h"), t.peer_key("cred-v")
HASHES = [bytes([i]) * 32 for i in range(4)]
NOW = 1_000_000


def _mint(**kw):
    args = dict(source_key=H, requester_key=W, requester="w", source="h",
                block_hashes=HASHES, now_ms=NOW, ttl_s=30)
    args.update(kw)
    return t.mint(**args)


def _verify(ticket, proof, **kw):
    args = dict(source="h", requester="w", block_hashes=HASHES, now_ms=NOW + 1)
    args.update(kw)
    return t.verify(H, ticket, proof, **args)


def test_the_requester_with_its_own_key_is_granted() -> None:
    ticket = _mint()
    grant = _verify(ticket, t.proof(W, ticket))
    assert (grant.requester, grant.source, grant.expiry_ms) == ("w", "h", NOW + 30_000)


@pytest.mark.parametrize("key", [V, H, t.peer_key(""), b""])
def test_a_holder_without_the_requesters_key_cannot_prove(key) -> None:
    """A router (no key), another worker (V) or the source itself: the proof fails."""
    ticket = _mint()
    with pytest.raises(t.TicketError) as err:
        _verify(ticket, t.proof(key, ticket))
    assert err.value.reason == "forged"


def test_another_workers_ticket_is_refused_even_with_its_proof() -> None:
    ticket = _mint(requester_key=V, requester="v")
    with pytest.raises(t.TicketError) as err:
        _verify(ticket, t.proof(V, ticket))  # v's valid ticket, presented as w
    assert err.value.reason == "not_for_me"


def test_a_ticket_for_another_source_is_refused() -> None:
    ticket = _mint(source="h2")
    with pytest.raises(t.TicketError) as err:
        _verify(ticket, t.proof(W, ticket))
    assert err.value.reason == "not_for_me"


def test_other_hashes_than_granted_are_refused() -> None:
    ticket = _mint()
    for other in (HASHES[:3], [*HASHES, b"x" * 32], list(reversed(HASHES))):
        with pytest.raises(t.TicketError) as err:
            _verify(ticket, t.proof(W, ticket), block_hashes=other)
        assert err.value.reason == "hashes"


def test_an_expired_ticket_is_refused() -> None:
    ticket = _mint()
    _verify(ticket, t.proof(W, ticket), now_ms=NOW + 30_000)
    with pytest.raises(t.TicketError) as err:
        _verify(ticket, t.proof(W, ticket), now_ms=NOW + 30_001)
    assert err.value.reason == "expired"


def test_any_flipped_bit_is_refused() -> None:
    ticket = _mint()
    for i in range(len(ticket)):
        bad = bytearray(ticket)
        bad[i] ^= 1
        with pytest.raises(t.TicketError):
            _verify(bytes(bad), t.proof(W, bytes(bad)))


@pytest.mark.parametrize("bad", [b"", b"x" * 10, b"\x02" + b"\x00" * 120])
def test_garbage_is_malformed(bad) -> None:
    with pytest.raises(t.TicketError) as err:
        t.parse(bad)
    assert err.value.reason == "malformed"


def test_ids_are_bounded() -> None:
    with pytest.raises(ValueError):
        _mint(requester="")
    with pytest.raises(ValueError):
        _mint(source="s" * 1025)
