"""The scheduler with lower tiers: onboard first, skip while the copy runs, admit after."""
from worker.engine.scheduler import Scheduler, SchedulerConfig
from worker.engine.sequence import SamplingParams, Seq, SeqStatus
from worker.kv_cache import KVCacheManager, KVRequest, Onboard

BS = 2


def seq(rid, tokens):
    return Seq(KVRequest(rid, list(tokens)), SamplingParams(), num_prompt_tokens=len(tokens))


def offload(kv, *prompts):
    """Compute each prompt, free it, then evict everything free (to the CPU tier)."""
    for i, tokens in enumerate(prompts):
        req = KVRequest(f"warm{i}", list(tokens))
        assert kv.allocate_slots(req, len(tokens)) is not None
        kv.free(req)
    blocks = kv.pool.get_new_blocks(kv.num_free_blocks)
    kv.pool.free_blocks(blocks)
    kv.take_transfers()


def step(sched):
    """Schedule one step and record its progress as the engine does (a sampled token
    appended for each sequence whose tokens are all computed)."""
    out = sched.schedule()
    for w in out:
        w.seq.req.num_computed_tokens = w.num_computed + w.num_new_tokens
        if w.seq.req.num_computed_tokens == w.seq.num_tokens:
            w.seq.req.token_ids.append(0)
    return [(w.seq.seq_id, w.num_computed, w.num_new_tokens) for w in out]


def onboards(kv):
    return [o for o in kv.take_transfers() if isinstance(o, Onboard)]


def test_an_onboarding_sequence_is_skipped_and_the_queue_behind_it_proceeds():
    kv = KVCacheManager(8, BS, cpu_blocks=8)
    offload(kv, [1, 2, 3, 4, 5])
    sched = Scheduler(kv, SchedulerConfig(max_batched_tokens=64))
    a, b = seq("a", [1, 2, 3, 4, 6]), seq("b", [7, 7, 7])
    sched.add(a)
    sched.add(b)
    assert a.expected_cached == 4 and b.expected_cached == 0  # the CPU match counts
    assert sched.queued_prefill_tokens == 1 + 3
    assert step(sched) == [("b", 0, 3)]
    assert kv.onboarding(a.req) and a.status is SeqStatus.WAITING
    assert [o.request_id for o in onboards(kv)] == ["a"]
    assert step(sched) == [("b", 3, 1)]  # b decodes; a is still skipped
    assert kv.onboarding(a.req) and list(sched.waiting) == [a]
    kv.finish_onboard("a", True)
    assert step(sched) == [("b", 4, 1), ("a", 4, 1)]
    assert a.num_cached_tokens == 4
    assert a.cached_tokens_by_tier == {"gpu": 0, "cpu": 4, "disk": 0}
    assert b.cached_tokens_by_tier == {"gpu": 0, "cpu": 0, "disk": 0}


def test_a_failed_onboard_falls_back_to_recompute():
    kv = KVCacheManager(8, BS, cpu_blocks=8)
    offload(kv, [1, 2, 3, 4, 5])
    sched = Scheduler(kv, SchedulerConfig(max_batched_tokens=64))
    a = seq("a", [1, 2, 3, 4, 6])
    sched.add(a)
    assert step(sched) == [] and kv.onboarding(a.req)
    kv.finish_onboard("a", False)
    assert step(sched) == [("a", 0, 5)]
    assert a.num_cached_tokens == 0 and a.cached_tokens_by_tier["cpu"] == 0


def test_finishing_a_sequence_mid_copy_keeps_its_blocks_until_the_copy_ends():
    kv = KVCacheManager(6, BS, cpu_blocks=8)
    offload(kv, [1, 2, 3, 4, 5])
    sched = Scheduler(kv, SchedulerConfig(max_batched_tokens=64))
    a = seq("a", [1, 2, 3, 4, 6])
    sched.add(a)
    assert step(sched) == []
    dest = [b for _, _, b in onboards(kv)[0].copies]
    sched.finish(a, "abort")
    assert not sched.has_work() and kv.num_free_blocks == 4
    assert all(kv.pool.blocks[b].ref_cnt == 1 for b in dest)
    kv.finish_onboard("a", True)
    assert kv.num_free_blocks == 6


def test_a_blocked_head_releases_the_holds_of_sequences_behind_it():
    kv = KVCacheManager(6, BS, cpu_blocks=8)
    offload(kv, [1, 2, 3, 4, 0], [5, 6, 7, 8, 0])
    sched = Scheduler(kv, SchedulerConfig(max_batched_tokens=64))
    head = seq("h", [1, 2, 3, 4] + [9] * 7)  # 11 tokens: 6 blocks, 2 on the CPU
    other = seq("o", [5, 6, 7, 8, 9])         # 3 blocks, 2 on the CPU
    sched.add(head)
    sched.add(other)
    assert step(sched) == []                  # both start their copies
    assert kv.onboarding(head.req) and kv.onboarding(other.req)
    assert kv.num_free_blocks == 2
    kv.finish_onboard("h", True)
    kv.finish_onboard("o", True)
    # The head needs 4 more blocks, 2 are free, 2 are held for "o": "o" lets them go.
    assert step(sched) == []
    assert kv.num_free_blocks == 4 and "o" not in kv._onboards.holds
    assert "h" in kv._onboards.holds
    assert step(sched)[0] == ("h", 4, 7)
    assert head.cached_tokens_by_tier == {"gpu": 0, "cpu": 4, "disk": 0}


def test_defaults_schedule_exactly_as_before():
    kv = KVCacheManager(4, BS)
    sched = Scheduler(kv, SchedulerConfig(max_batched_tokens=64))
    a, b = seq("a", [1, 2, 3, 4, 5, 6, 7]), seq("b", [1, 2, 3])
    sched.add(a)
    sched.add(b)
    assert step(sched) == [("a", 0, 7)]  # b waits: no block left
    assert list(sched.waiting) == [b] and kv.take_transfers() == []
    assert a.cached_tokens_by_tier == {"gpu": 0, "cpu": 0, "disk": 0}
