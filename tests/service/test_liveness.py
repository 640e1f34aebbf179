"""The replica's worker table: liveness, and workers lost when the backend is emptied."""
from service.index.base import WorkerRecord
from service.liveness import WorkerTable


def rec(wid: str, hb: int) -> WorkerRecord:
    return WorkerRecord(wid, "ns", f"127.0.0.1:{hb}", "tiny", 16, "sha256_cbor",
                        heartbeat_ms=hb)


def test_alive_until_the_timeout():
    t = WorkerTable(3000)
    t.replace_all([rec("a", 1000)], 1000)
    assert [r.worker_id for r in t.live(3999)] == ["a"]
    assert t.live(4000) == []


def test_workers_lost_with_an_emptied_backend_stay_routable_in_degraded_mode():
    t = WorkerTable(3000)
    t.replace_all([rec("a", 1000), rec("b", 1000)], 1000)
    # The backend goes down at 1000 (no refresh succeeds) and comes back EMPTY at 5000:
    # this replica saw no heartbeat since (they went to another replica), yet both were
    # alive when it last could look.
    t.replace_all([], 5000)
    assert t.live(5000) == [] and t.lost(5000)
    assert {r.worker_id for r in t.live(5000, degraded=True)} == {"a", "b"}
    # "a" registers again: it is live for real; "b" stays lost until the grace period ends.
    t.replace_all([rec("a", 5500)], 5500)
    assert [r.worker_id for r in t.live(5600)] == ["a"]
    assert {r.worker_id for r in t.live(5600, degraded=True)} == {"a", "b"}
    t.replace_all([rec("a", 11000)], 11000)
    assert not t.lost(11000)
    assert [r.worker_id for r in t.live(11000, degraded=True)] == ["a"]


def test_a_worker_dead_before_the_loss_is_not_resurrected():
    t = WorkerTable(3000)
    t.replace_all([rec("a", 1000)], 6000)   # last heartbeat 5 s before the last refresh
    t.replace_all([], 6500)
    assert not t.lost(6500) and t.live(6500, degraded=True) == []
