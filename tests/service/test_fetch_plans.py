"""A fetch plan's fields come from the policy's choice and the Route's chain; its ticket binds
the peer keys of the credentials each worker presents to the service."""
from __future__ import annotations

import pytest

from kvmesh.transfer import ticket
from service.config import ServiceConfig
from service.fetch_plans import credential, peer_key, plan
from service.index.base import BlockMatch, WorkerLoad
from service.policy import WorkerView
from service.policy.fetch import FetchChoice
from service.worker_tokens import mint

SECRET = "s" * 24
CHAIN = [bytes([i]) * 32 for i in range(10)]
NOW = 1_700_000_000_000


def choice(start: int, blocks: int) -> FetchChoice:
    src = WorkerView("h", "10.0.0.1:7", WorkerLoad(peer_fetch=True), BlockMatch(8, 8),
                     block_size=16)
    return FetchChoice(src, start, blocks, 0.0125)


@pytest.mark.parametrize(("cfg", "want"), [
    (ServiceConfig(worker_secret=SECRET, worker_token="shared-token"), mint(SECRET, "w")),
    (ServiceConfig(worker_token="shared-token"), "shared-token"),
    (ServiceConfig(), ""),
])
def test_the_credential_is_what_the_worker_presents(cfg: ServiceConfig, want: str) -> None:
    assert credential(cfg, "w") == want
    assert peer_key(cfg, "w") == ticket.peer_key(want)  # the cached key is the same


def test_the_plan_names_the_chosen_blocks_and_a_ticket_for_them() -> None:
    cfg = ServiceConfig(worker_secret=SECRET, fetch_ticket_ttl_s=2.0)
    p = plan(cfg, "w", choice(3, 5), CHAIN, NOW)
    assert (p.source_worker_id, p.source_address, p.start_block) == ("h", "10.0.0.1:7", 3)
    assert list(p.block_hashes) == CHAIN[3:8] and p.tokens == 5 * 16 and p.est_s == 0.0125
    w, h = (ticket.peer_key(mint(SECRET, x)) for x in ("w", "h"))
    grant = ticket.verify(h, p.ticket, ticket.proof(w, p.ticket), source="h", requester="w",
                          block_hashes=CHAIN[3:8], now_ms=NOW + 2000)
    assert grant.expiry_ms == NOW + 2000
    with pytest.raises(ticket.TicketError):  # another slice of the chain
        ticket.verify(h, p.ticket, ticket.proof(w, p.ticket), source="h", requester="w",
                      block_hashes=CHAIN[3:9], now_ms=NOW)


def test_a_choice_past_the_chain_is_a_bug_not_a_short_plan() -> None:
    with pytest.raises(ValueError, match="beyond a chain of 10 blocks"):
        plan(ServiceConfig(), "w", choice(8, 4), CHAIN, NOW)
