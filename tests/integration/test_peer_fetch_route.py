"""Peer fetch on a real cluster through the router: worker-0 holds a prompt; a request
pinned to worker-1 with ``worker_id`` gets a fetch plan from worker-0, worker-1 pulls the
blocks with the plan's ticket, reports them as "peer" tokens and answers exactly what
worker-0 answered (tests/integration/test_peer_fetch.py drives two worker processes
directly, with tickets minted by hand, and kills the source).

Real Valkey, a real service process (--peer-fetch --min-fetch-blocks 2) and two real worker
processes (``kvmesh up``'s local backend), with a router token and per-worker credentials
(the launcher's random worker secret), so the ticket binds real peer keys.
"""
from __future__ import annotations

from deploy.local import ClusterSpec, LocalCluster
from deploy.waiting import wait_until


def test_a_request_pinned_to_a_cold_worker_pulls_the_prefix_from_its_holder() -> None:
    prompt = [(7 * i) % 250 + 1 for i in range(400)]  # 25 blocks of 16
    spec = ClusterSpec(workers=2, peer_fetch=True, min_fetch_blocks=2, token="router-token-1",
                       heartbeat_s=0.2)
    with LocalCluster(spec) as cluster, cluster.client(generate_timeout=120) as client:
        first = client.generate(prompt, max_tokens=4, worker_id="worker-0")
        assert first.worker_id == "worker-0"
        # the holder's blocks reach the index; the route then plans worker-1's fetch
        assert wait_until(lambda: client.route(prompt, worker_id="worker-1", dry_run=True)
                          .candidates[0].fetch is not None, 30, interval=0.2,
                          what="a fetch plan for worker-1") is True
        routed = client.route(prompt, worker_id="worker-1", dry_run=True)
        plan = routed.candidates[0].fetch
        assert [c.worker_id for c in routed.candidates] == ["worker-1"]
        assert plan.source_worker_id == "worker-0" and plan.start_block == 0
        assert plan.blocks == (len(prompt) - 1) // 16 and plan.ticket
        second = client.generate(prompt, max_tokens=4, worker_id="worker-1")
        assert second.worker_id == "worker-1" and second.token_ids == first.token_ids
        assert second.cached_tokens_by_tier.get("peer") == plan.tokens
        stats = {w["worker_id"]: client.worker_stats(w["address"], w["worker_id"])["peer"]
                 for w in client.stats()["workers"]}
        assert stats["worker-0"]["served"] == 1 and stats["worker-1"]["fetches"] == 1
        assert stats["worker-1"]["peer_hit_tokens"] == plan.tokens
