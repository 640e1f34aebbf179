"""A Route's fetch plans: ``Candidate.fetch`` for each returned candidate whose ranking
chose "pull the blocks beyond your own match from a peer first" (``service.policy.fetch``).

A plan names the source (id, address), the chain blocks ``[start_block, start_block +
blocks)`` as their hashes (from the Route's own hashed chain of the candidate's namespace),
their tokens, the estimated transfer time and a ticket (``kvmesh.transfer.ticket``) minted
for exactly that requester, source and hashes. The ticket binds each worker's peer key,
``peer_key(credential)``, where the credential is what that worker presents to this
service: its id-bound token minted from ``--worker-secret`` when the service has one, else
the shared ``--worker-token``, else "" (an open cluster, where a ticket stops no one).
With both a secret and a shared token configured, workers are assumed to present their
bound tokens (a worker on the shared token then fails the ticket check and recomputes).
The same derivation as ``service.pins.pin_credentials``.

Tickets are minted only for the candidates a Route returns (``max_candidates``), from the
service's injected clock. Dry runs plan and mint too: a ticket grants nothing without the
requester's key, and routers that re-ask with ``dry_run`` (the Ray Serve router) need one.

See docs/architecture.md#peer-kv-transfer-the-decision-rule.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

from kvmesh.transfer import ticket
from kvmesh.v1 import index_pb2 as pb
from service import worker_tokens
from service.config import ServiceConfig
from service.policy.fetch import FetchChoice


def credential(cfg: ServiceConfig, worker_id: str) -> str:
    """The credential worker ``worker_id`` presents to this service (see the module
    docstring): the root of its peer key."""
    return _credential(cfg.worker_secret, cfg.worker_token, worker_id)


def _credential(secret: str | None, shared: str | None, worker_id: str) -> str:
    return worker_tokens.mint(secret, worker_id) if secret else (shared or "")


@functools.lru_cache(maxsize=4096)
def _peer_key(secret: str | None, shared: str | None, worker_id: str) -> bytes:
    """The peer key of ``worker_id`` (two HMACs: cached, a Route may plan many fetches)."""
    return ticket.peer_key(_credential(secret, shared, worker_id))


def peer_key(cfg: ServiceConfig, worker_id: str) -> bytes:
    """``ticket.peer_key(credential(cfg, worker_id))``, cached."""
    return _peer_key(cfg.worker_secret, cfg.worker_token, worker_id)


def plan(cfg: ServiceConfig, requester: str, choice: FetchChoice, chain: Sequence[bytes],
         now_ms: int) -> pb.FetchPlan:
    """The plan (and its ticket) for ``requester`` to pull ``choice``'s blocks of ``chain``
    (the Route's chain of the requester's namespace) from ``choice.source``."""
    src = choice.source
    hashes = list(chain[choice.start_block:choice.start_block + choice.blocks])
    if len(hashes) != choice.blocks:  # the policy planned past the chain: a bug upstream
        raise ValueError(f"fetch of blocks [{choice.start_block}, "
                         f"{choice.start_block + choice.blocks}) beyond a chain of "
                         f"{len(chain)} blocks")
    grant = ticket.mint(peer_key(cfg, src.worker_id), peer_key(cfg, requester), requester,
                        src.worker_id, hashes, now_ms, cfg.fetch_ticket_ttl_s)
    return pb.FetchPlan(source_worker_id=src.worker_id, source_address=src.address,
                        start_block=choice.start_block, block_hashes=hashes,
                        tokens=choice.blocks * src.block_size, est_s=choice.est_s,
                        ticket=grant)
