"""A failed engine step never leaves a cache hit whose KV was not written.

The model's forward is made to raise on one chosen call (the first, one in the middle of a
chunked prefill, one of a decode batch). Afterwards: every block cached now was cached
before the failed step (so its KV was written), the events tell the index exactly the
pool's set, the failed step's requests are aborted, others finish, and greedy outputs of
the same prompt and of prompts sharing its prefix equal a fresh engine's.
"""
from __future__ import annotations

import random

import pytest

from kvmesh.events.pool import PoolCleared, PoolRemoved, PoolStored
from tests.worker.faults import FailingForward
from worker import Engine
from worker.engine.engine import StepFailed
from worker.engine.scheduler import SchedulerConfig
from worker.engine.sequence import SamplingParams, Seq, SeqStatus

BS = 4
PROMPT = [random.Random(11).randrange(3, 250) for _ in range(25)]  # 6 full blocks + 1
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


def engine(**sched) -> Engine:
    return Engine.from_pretrained("tiny", block_size=BS, num_blocks=64,
                                  scheduler=SchedulerConfig(**sched) if sched else None)


def cached(e: Engine) -> set[tuple[int, bytes]]:
    return {(b.block_id, h) for h, holders in e.kv.pool.cached.items() for b in holders.values()}


def index_view(events) -> set[bytes]:
    """The set of hashes a consumer applying ``events`` in order believes the pool holds."""
    held: set[bytes] = set()
    for ev in events:
        if isinstance(ev, PoolStored):
            held.update(ev.block_hashes)
        elif isinstance(ev, PoolRemoved):
            held.difference_update(ev.block_hashes)
        elif isinstance(ev, PoolCleared):
            held.clear()
    return held


def run(e: Engine, seqs: list[Seq]) -> list[StepFailed]:
    """Step until every seq finished; returns the failures seen. Checks, at each failure,
    that nothing cached during the failed step is still cached."""
    failures: list[StepFailed] = []
    while any(s.status is not SeqStatus.FINISHED for s in seqs):
        before = cached(e)
        try:
            e.step()
        except StepFailed as exc:
            failures.append(exc)
            assert cached(e) <= before, "a block cached in the failed step is still cached"
    return failures


def fresh(prompt: list[int], params: SamplingParams = GREEDY) -> list[int]:
    return engine().generate([prompt], max_tokens=params.max_tokens, ignore_eos=True)[0].token_ids


def check_retries(e: Engine, events: list, prompts: list[list[int]]) -> None:
    events.extend(e.kv.take_events())
    assert index_view(events) == set(e.kv.pool.cached)
    for p in prompts:
        again = e.generate([p], max_tokens=GREEDY.max_tokens, ignore_eos=True)[0]
        assert again.token_ids == fresh(p), f"retry of a {len(p)}-token prompt differs"


def test_first_forward_fails_same_step_hits_included():
    e = engine()
    FailingForward(e, 1)
    # Two requests sharing 5 blocks, admitted in the same step: the second hits the blocks
    # the first cached at scheduling time, before any KV was written.
    a = e.add_request(PROMPT, GREEDY)
    b = e.add_request(PROMPT[:21] + [5, 6, 7], GREEDY)
    failures = run(e, [a, b])
    assert len(failures) == 1 and set(failures[0].seqs) == {a, b}
    assert a.finish_reason == b.finish_reason == "error"
    assert e.kv.pool.cached == {} and e.kv.num_free_blocks == e.kv.num_blocks
    assert e.kv.get_computed_blocks(a.req)[1] == 0
    check_retries(e, [], [PROMPT, PROMPT[:21] + [5, 6, 7], PROMPT[:9] + [1, 2]])


def test_failure_mid_chunked_prefill_keeps_the_chunks_that_were_written():
    e = engine(max_batched_tokens=8)  # 25 tokens: chunks of 8, 8, 8, 1
    FailingForward(e, 3)
    seq = e.add_request(PROMPT, GREEDY)
    failures = run(e, [seq])
    assert [f.seqs for f in failures] == [[seq]]
    # Chunks 1 and 2 (blocks 0-3) were written and stay; chunk 3's blocks 4-5 do not.
    probe = e.enqueue(list(PROMPT), GREEDY)
    assert probe.expected_cached == 16
    e.abort(probe)
    check_retries(e, [], [PROMPT, PROMPT[:18] + [9, 9, 9, 9, 9, 9, 9]])


def test_failure_in_a_decode_batch_spares_requests_outside_it():
    e = engine(max_seqs=2)
    FailingForward(e, 2)  # call 1 prefills a and b, call 2 is their first decode
    a = e.add_request(PROMPT[:7], GREEDY)   # the decode fills block 1
    b = e.add_request(PROMPT[8:15], GREEDY)
    c = e.add_request(PROMPT[16:], GREEDY)  # waits (max_seqs): not in the failed step
    events: list = []
    failures = run(e, [a, b, c])
    assert [set(f.seqs) for f in failures] == [{a, b}]
    assert c.finish_reason == "length" and c.output_ids == fresh(PROMPT[16:])
    first_a = fresh(PROMPT[:7])[0]
    # Block 1 of a's sequence (prompt + first sampled token) was scheduled, never written.
    check_retries(e, events, [PROMPT[:7], PROMPT[:7] + [first_a] + [3, 4, 5],
                              PROMPT[8:15]])


@pytest.mark.parametrize("fail_at", [1, 2, 4, 6])
def test_events_leave_the_index_with_exactly_the_pool_set(fail_at):
    e = engine(max_batched_tokens=8, max_seqs=3)
    FailingForward(e, fail_at)
    prompts = [PROMPT, PROMPT[:13] + [1, 2, 3, 4, 5], PROMPT[4:20]]
    seqs = [e.add_request(p, GREEDY) for p in prompts]
    assert run(e, seqs)
    check_retries(e, [], prompts)


def test_batch_call_that_fails_leaves_nothing_queued():
    e = engine(max_seqs=1)
    FailingForward(e, 1)
    with pytest.raises(StepFailed):
        e.generate([PROMPT, PROMPT[3:]], max_tokens=4, ignore_eos=True)
    assert not e.has_work() and e.kv.num_free_blocks == e.kv.num_blocks
    assert e.generate([PROMPT[3:]], max_tokens=6, ignore_eos=True)[0].token_ids == fresh(
        PROMPT[3:])
