"""EngineState: engine events -> kvmesh index events, exactly (salts, LoRA, duplicates, tiers)."""
from __future__ import annotations

import random

import msgspec
import pytest

from bridge.engine_state import MEMO_BLOCKS, EngineState, SeqCheck
from kvmesh import hashing
from kvmesh.events import vllm as ve
from kvmesh.hashing import block_hashes, compiled_chain
from kvmesh.v1 import index_pb2
from tests.bridge.index_view import IndexView, view

BS = 4
TOKENS = list(range(100, 112))  # three blocks


def stored(hashes, tokens, parent=None, *, medium=None, lora=None, keys=None, group=None,
           block_size=BS, lora_id=None):
    return ve.VllmStored(block_hashes=list(hashes), parent_block_hash=parent,
                         token_ids=list(tokens), block_size=block_size, lora_id=lora_id,
                         medium=medium, lora_name=lora, extra_keys=keys, group_idx=group)


def removed(hashes, medium=None, group=None):
    return ve.VllmRemoved(block_hashes=list(hashes), medium=medium, group_idx=group)


def batch(*events, ts=1.0):
    return ve.KVEventBatch(ts=ts, events=list(events), data_parallel_rank=0)


GPU, CPU, DISK = index_pb2.TIER_GPU, index_pb2.TIER_CPU, index_pb2.TIER_DISK


def test_a_chain_is_indexed_under_kvmesh_hashes_whatever_the_engine_hashes() -> None:
    expect = block_hashes(TOKENS, BS)
    views = []
    for engine_hashes in ([11, 12, 13], [b"x" * 32, b"y" * 32, b"z" * 32]):
        st = EngineState(block_size=BS)
        out = st.apply(batch(stored(engine_hashes[:2], TOKENS[:8])))
        out += st.apply(batch(stored(engine_hashes[2:], TOKENS[8:], parent=engine_hashes[1])))
        assert [e.seq for e in out] == [1, 2] and st.out_seq == 2
        assert out[0].stored.parent_hash == b"" and out[0].stored.tier == GPU
        assert list(out[0].stored.block_hashes) == expect[:2]
        assert out[1].stored.parent_hash == expect[1]
        views.append(view(out))
    assert views[0] == views[1] == {(expect[0], GPU): b"", (expect[1], GPU): expect[0],
                                    (expect[2], GPU): expect[1]}


def test_the_bridge_seed_and_algo_decide_the_chain() -> None:
    st = EngineState(block_size=BS, algo="xxhash_cbor", seed="s3")
    out = st.apply(batch(stored([1, 2, 3], TOKENS)))
    assert list(out[0].stored.block_hashes) == block_hashes(TOKENS, BS, algo="xxhash_cbor",
                                                            seed="s3")


def test_duplicates_survive_one_removal() -> None:
    st = EngineState(block_size=BS)
    out = st.apply(batch(stored([1], TOKENS[:4]), stored([1], TOKENS[:4])))
    assert len(out) == 1  # the second copy is news to nobody
    assert st.apply(batch(removed([1]))) == []
    h0 = block_hashes(TOKENS, BS)[0]
    assert st.held(h0) == {"gpu"}
    out = st.apply(batch(removed([1])))
    assert list(out[0].removed.block_hashes) == [h0] and st.held(h0) == set()
    assert st.apply(batch(removed([1]))) == [] and st.stats.unknown_removes == 1


def test_two_engine_hashes_for_one_chain_hash() -> None:
    """Distinct engine hashes that rebuild to one chain (the engine hashed something kvmesh
    does not, or a 64-bit collision): the index hears of the chain once, and loses it only
    with the last engine hash."""
    st = EngineState(block_size=BS)
    out = st.apply(batch(stored([1], TOKENS[:4]), stored([2], TOKENS[:4])))
    assert len(out) == 1 and st.indexed_blocks == 1
    assert st.apply(batch(removed([1]))) == []
    out = st.apply(batch(removed([2])))
    assert [e.WhichOneof("event") for e in out] == ["removed"] and st.indexed_blocks == 0


def test_tiers_are_counted_apart() -> None:
    st = EngineState(block_size=BS)
    h = block_hashes(TOKENS, BS)
    out = st.apply(batch(stored([1, 2], TOKENS[:8]), stored([1, 2], TOKENS[:8], medium="CPU"),
                         stored([1], TOKENS[:4], medium="STORAGE")))
    assert [(e.stored.tier, len(e.stored.block_hashes)) for e in out] == [(GPU, 2), (CPU, 2),
                                                                           (DISK, 1)]
    out = st.apply(batch(removed([1, 2], medium="GPU")))
    assert [(e.removed.tier, list(e.removed.block_hashes)) for e in out] == [(GPU, h[:2])]
    assert st.held(h[0]) == {"cpu", "disk"} and st.held(h[1]) == {"cpu"}
    assert st.apply(batch(removed([2], medium="STORAGE"))) == []  # never on disk
    assert st.stats.unknown_removes == 1


def test_salt_is_on_block_0_and_carried_down_the_chain() -> None:
    st = EngineState(block_size=BS)
    out = st.apply(batch(stored([1, 2], TOKENS[:8], keys=[("s1",), None])))
    out += st.apply(batch(stored([3], TOKENS[8:], parent=2)))
    salted = block_hashes(TOKENS, BS, salt="s1")
    assert set(view(out)) == {(h, GPU) for h in salted}
    assert not set(salted) & set(block_hashes(TOKENS, BS))
    other = EngineState(block_size=BS).apply(batch(stored([1], TOKENS[:4], keys=[("s2",)])))
    assert other[0].stored.block_hashes[0] not in salted


def test_lora_needs_its_path_from_the_map() -> None:
    loras = {"ad": "/adapters/ad", "bd": "/adapters/bd"}
    st = EngineState(block_size=BS, loras=loras)
    out = st.apply(batch(stored([1, 2], TOKENS[:8], lora="ad", keys=[("ad",), ("ad",)])))
    assert list(out[0].stored.block_hashes) == block_hashes(TOKENS[:8], BS,
                                                            lora=("ad", "/adapters/ad"))
    out_b = st.apply(batch(stored([5], TOKENS[:4], lora="bd", keys=[("bd",)])))
    assert out_b[0].stored.block_hashes[0] != out[0].stored.block_hashes[0]
    # an adapter the operator did not map is never indexed, nor what chains below it
    assert st.apply(batch(stored([7], TOKENS[:4], lora="zz", keys=[("zz",)]))) == []
    assert st.apply(batch(stored([8], TOKENS[4:8], parent=7, lora="zz"))) == []
    assert st.stats.unroutable == {"unknown_lora": 2}
    assert st.apply(batch(stored([9], TOKENS[:4], lora_id=3))) == []
    assert st.stats.unroutable["lora_without_name"] == 1


def test_lora_and_salt_with_the_same_string() -> None:
    st = EngineState(block_size=BS, loras={"x": "/x"})
    out = st.apply(batch(stored([1, 2], TOKENS[:8], lora="x", keys=[("x", "x"), ("x",)])))
    assert list(out[0].stored.block_hashes) == block_hashes(TOKENS[:8], BS, lora=("x", "/x"),
                                                            salt="x")


def test_multimodal_keys() -> None:
    st = EngineState(block_size=BS)
    # an image over token positions [2, 6): blocks 0 and 1, offsets relative to each block
    out = st.apply(batch(stored([1, 2, 3], TOKENS, keys=[(("img", 2),), (("img", -2),), None])))
    assert list(out[0].stored.block_hashes) == block_hashes(TOKENS, BS, mm=[("img", 2, 4)])


@pytest.mark.parametrize("keys, reason", [
    ([(b"\x01" * 32,)], "prompt_embeds"),
    ([(("img", "not-an-offset"),)], "extra_key"),
    ([("salt", "second-string")], "extra_key"),
    ([({"type": "mm"},)], "extra_key"),
])
def test_keys_kvmesh_cannot_rebuild_are_not_indexed(keys, reason) -> None:
    st = EngineState(block_size=BS)
    assert st.apply(batch(stored([1], TOKENS[:4], keys=keys))) == []
    assert st.apply(batch(stored([2], TOKENS[4:8], parent=1))) == []  # nor their children
    assert st.stats.unroutable == {reason: 1, "parent_unroutable": 1}
    assert st.apply(batch(removed([2, 1]))) == [] and st.stats.unknown_removes == 0


def test_a_salt_below_block_0_is_not_a_salt() -> None:
    st = EngineState(block_size=BS)
    st.apply(batch(stored([1], TOKENS[:4])))
    assert st.apply(batch(stored([2], TOKENS[4:8], parent=1, keys=[("s",)]))) == []
    assert st.stats.unroutable == {"extra_key": 1}


def test_orphans_block_sizes_groups_and_mediums() -> None:
    st = EngineState(block_size=BS)
    assert st.apply(batch(stored([2], TOKENS[4:8], parent=99))) == []
    assert st.apply(batch(stored([3], TOKENS[:8], block_size=8))) == []
    assert st.apply(batch(stored([4, 5], TOKENS[:7]))) == []  # token count does not match
    assert st.stats.unroutable == {"orphan": 1, "block_size": 3}
    assert st.apply(batch(stored([5], TOKENS[:4], group=1), stored([6], TOKENS[:4],
                                                                   medium="NVME"))) == []
    assert st.apply(batch(removed([5], group=1))) == []
    assert st.stats.ignored_events == 3 and st.indexed_blocks == 0
    assert len(EngineState(block_size=BS, group=1).apply(batch(stored([5], TOKENS[:4],
                                                                       group=1)))) == 1


def test_all_blocks_cleared() -> None:
    st = EngineState(block_size=BS)
    out = st.apply(batch(stored([1, 2], TOKENS[:8]), ve.VllmCleared(),
                         stored([3], TOKENS[:4])))
    assert [e.WhichOneof("event") for e in out] == ["stored", "cleared", "stored"]
    assert st.indexed_blocks == 1 and st.stats.clears == 1
    assert st.apply(batch(removed([1]))) == [] and st.stats.unknown_removes == 1


def test_seq_tracking() -> None:
    st = EngineState(block_size=BS)
    p0 = ve.encode_batch(batch(stored([1], TOKENS[:4])))
    p1 = ve.encode_batch(batch(stored([2], TOKENS[4:8], parent=1)))
    assert st.check(7) is SeqCheck.FIRST and st.replay_from == 0
    st.ingest(7, p0)  # the first batch seen may be anything (the engine ran before)
    assert st.expected == 8 and st.replay_from == 7 and st.is_anchor(7, p0)
    assert not st.is_anchor(7, p1) and not st.is_anchor(6, p0)
    assert [st.check(s) for s in (8, 9, 7, 0)] == [SeqCheck.NEXT, SeqCheck.GAP,
                                                   SeqCheck.BEHIND, SeqCheck.BEHIND]
    with pytest.raises(ValueError, match="gap"):
        st.ingest(9, p1)  # a gap: ask for a replay from replay_from
    with pytest.raises(ValueError):
        st.ingest(8, b"\xc1")  # garbage: nothing changes
    assert st.expected == 8 and st.indexed_blocks == 1
    st.ingest(8, p1)
    assert st.indexed_blocks == 2
    out = st.clear()  # an engine restart
    assert [e.WhichOneof("event") for e in out] == ["cleared"]
    assert st.indexed_blocks == 0 and st.check(0) is SeqCheck.FIRST and st.replay_from == 0


def test_snapshot_is_the_index_view() -> None:
    st = EngineState(block_size=BS)
    events = st.apply(batch(stored([1, 2, 3], TOKENS), stored([1, 2], TOKENS[:8],
                                                              medium="CPU")))
    events += st.apply(batch(removed([2]), stored([9], TOKENS[4:8], parent=3)))
    seq, runs = st.snapshot()
    assert seq == st.out_seq == events[-1].seq
    rebuilt = view([index_pb2.KvEvent(stored=r) for r in runs], check_seq=False)
    assert rebuilt == view(events)
    assert len(runs) == 3  # gpu: [h0], [h2, block 9] (h1 left gpu); cpu: [h0, h1]


def test_random_histories_match_a_reference_count() -> None:
    """Random stores and removals over tiers, duplicates included, checked against a plain
    multiset: the index view holds (chain, tier) exactly while some copy exists."""
    chains = block_hashes(list(range(64)), BS)
    mediums = [None, "GPU", "CPU", "STORAGE"]
    tier_of = {None: GPU, "GPU": GPU, "CPU": CPU, "STORAGE": DISK}
    for seed in range(20):
        rng = random.Random(seed)
        st, copies, index_view = EngineState(block_size=BS), {}, IndexView()
        for _ in range(200):
            i, m = rng.randrange(len(chains)), rng.choice(mediums)
            key = (i, tier_of[m])
            if rng.random() < 0.55:
                # store block i with its whole chain known: parent i-1 already stored? use a
                # fresh one-block event whose parent is i-1's engine hash when i > 0
                if i and not any(copies.get((i - 1, t)) for t in (GPU, CPU, DISK)):
                    continue
                ev = stored([1000 + i], range(i * BS, (i + 1) * BS),
                            parent=1000 + i - 1 if i else None, medium=m)
                copies[key] = copies.get(key, 0) + 1
            else:
                ev = removed([1000 + i], medium=m)
                if copies.get(key):
                    copies[key] -= 1
            index_view.apply(st.apply(batch(ev)))
            expect = {(chains[i], t) for (i, t), n in copies.items() if n}
            assert set(index_view.held) == expect, seed


@pytest.mark.parametrize("algo", ["sha256_cbor", "xxhash_cbor", "sha256"])
def test_the_memo_is_kept_by_default_only_where_rehashing_is_slow(monkeypatch, algo) -> None:
    """Only blocks stored again gain from the memo, and every removal pays for it: worth it
    where the chain hash runs in Python, not where it runs in C."""
    assert EngineState(block_size=BS, algo=algo).memo_blocks == (
        0 if compiled_chain(algo) else MEMO_BLOCKS)
    monkeypatch.setattr(hashing, "_c_chain", None)
    assert EngineState(block_size=BS, algo=algo).memo_blocks == MEMO_BLOCKS
    assert EngineState(block_size=BS, algo=algo, memo_blocks=3).memo_blocks == 3


def test_a_block_stored_again_is_not_rehashed_until_a_clear() -> None:
    st = EngineState(block_size=BS, memo_blocks=2)
    idx = IndexView()
    idx.apply(st.apply(batch(stored([1, 2, 3], TOKENS))))
    assert st.stats.rehashed == 3
    idx.apply(st.apply(batch(removed([3, 2, 1]))))
    assert idx.held == {} and st.indexed_blocks == 0
    # the memo keeps the last two removed (2, 1): block 3 is rehashed, they are not
    idx.apply(st.apply(batch(stored([1, 2, 3], TOKENS))))
    assert st.stats.rehashed == 4 and st.stats.memo_hits == 2
    assert set(idx.held) == {(h, GPU) for h in block_hashes(TOKENS, BS)}
    # a hit under an unroutable parent stays unroutable: nothing below an orphan is indexed
    idx.apply(st.apply(batch(removed([3]))))
    assert set(idx.apply(st.apply(batch(stored([3], TOKENS[8:], parent=77)))).held) == {
        (h, GPU) for h in block_hashes(TOKENS[:8], BS)}
    idx.apply(st.apply(batch(removed([3]))))  # the orphan copy: no index event
    idx.apply(st.clear())
    st.apply(batch(stored([1, 2], TOKENS[:8])))
    assert st.stats.memo_hits == 2 and st.stats.rehashed == 6  # the clear forgot the memo


def test_long_runs_are_split_so_no_event_outgrows_a_batch(monkeypatch) -> None:
    from bridge import index_events
    monkeypatch.setattr(index_events, "MAX_RUN", 2)
    tokens = list(range(5 * BS))
    st = EngineState(block_size=BS)
    out = st.apply(batch(stored(range(1, 6), tokens)))
    assert [len(e.stored.block_hashes) for e in out] == [2, 2, 1]
    assert view(out) == view([index_pb2.KvEvent(seq=1, stored=index_pb2.BlockStored(
        block_hashes=block_hashes(tokens, BS), tier=GPU))])
    out = st.apply(batch(removed(range(1, 6))))
    assert [len(e.removed.block_hashes) for e in out] == [2, 2, 1]


@pytest.mark.parametrize("memo", [0, 2, 65_536])
def test_random_multi_block_events_match_a_reference_count(memo: int) -> None:
    """As above with events of 1-4 chained blocks (runs of new blocks rehashed together,
    blocks already held or remembered in the memo in between): same exact view."""
    tokens = list(range(64))
    chains = block_hashes(tokens, BS)
    mediums = [None, "CPU", "STORAGE"]
    tier_of = {None: GPU, "CPU": CPU, "STORAGE": DISK}
    for seed in range(15):
        rng = random.Random(seed)
        st, copies, index_view = EngineState(block_size=BS, memo_blocks=memo), {}, IndexView()
        for _ in range(150):
            i, n, m = rng.randrange(len(chains)), rng.randint(1, 4), rng.choice(mediums)
            n = min(n, len(chains) - i)
            if rng.random() < 0.55:
                if i and not any(copies.get((i - 1, t)) for t in (GPU, CPU, DISK)):
                    continue
                ev = stored(range(1000 + i, 1000 + i + n), tokens[i * BS:(i + n) * BS],
                            parent=1000 + i - 1 if i else None, medium=m)
                for k in range(i, i + n):
                    copies[(k, tier_of[m])] = copies.get((k, tier_of[m]), 0) + 1
            else:
                ev = removed(range(1000 + i, 1000 + i + n), medium=m)
                for k in range(i, i + n):
                    if copies.get((k, tier_of[m])):
                        copies[(k, tier_of[m])] -= 1
            index_view.apply(st.apply(batch(ev)))
            expect = {(chains[k], t) for (k, t), c in copies.items() if c}
            assert set(index_view.held) == expect, seed
        assert st.stats.rehashed + st.stats.memo_hits >= len({k for k, _ in copies})


def test_ingest_hashes_token_ids_from_the_payload_in_c(monkeypatch) -> None:
    """The bulk state leaves token ids as msgpack bytes for C (no Python int per id) and
    indexes the same as the reference, which decodes them as lists: whole events, runs
    after a held block (sliced), negative ids (the Python path) and a length mismatch."""
    if not compiled_chain("sha256_cbor"):
        pytest.skip("no C chain (kvmesh._chain not built, or KVMESH_NO_C)")
    calls = []

    def spy(*args):
        calls.append(bytes(args[1]))
        return c_packed(*args)
    c_packed = hashing._c_packed
    monkeypatch.setattr(hashing, "_c_packed", spy)
    st, ref = EngineState(block_size=BS), EngineState(block_size=BS, bulk=False)
    batches = [batch(stored([1, 2], TOKENS[:8])),
               batch(stored([1, 2, 3], TOKENS), stored([7, 8], [-5, 1, 2, 3, 4, 5, 6, 2**63])),
               batch(stored([9], TOKENS[:5]), stored([10], [2**64 - 1] * 4, parent=3))]
    for seq, b in enumerate(batches):
        payload = ve.encode_batch(b)
        assert st.ingest(seq, payload) == ref.ingest(seq, payload)
    assert st.snapshot() == ref.snapshot() and st.stats == ref.stats
    assert st.stats.unroutable == {"block_size": 1} and st.indexed_blocks == 6
    assert calls[0] == msgspec.msgpack.encode(TOKENS[:8])  # the whole event, as sent
    assert len(calls) == 3  # the slice after the held blocks and the negative ids: lists


@pytest.mark.parametrize("token_ids", [["a", "b", "c", "d"], [1.0, 2.0, 3.0, 4.0], None,
                                       [1, 2, 3, None]])
def test_token_ids_that_are_not_ints_make_the_batch_malformed(token_ids) -> None:
    """As before token ids were left packed: the batch does not decode and changes nothing,
    however the event's group or medium would have it ignored."""
    for bulk in (True, False):
        st = EngineState(block_size=BS, bulk=bulk)
        st.ingest(0, ve.encode_batch(batch(stored([1], TOKENS[:4]))))
        for kw in ({}, {"group": 3}, {"medium": "NVME"}):
            bad = msgspec.msgpack.encode([1.0, [
                {"type": "BlockRemoved", "block_hashes": [1], "medium": None},
                {"type": "BlockStored", "block_hashes": [2], "parent_block_hash": 1,
                 "token_ids": token_ids, "block_size": BS, "lora_id": None,
                 "medium": kw.get("medium"), "lora_name": None, "group_idx": kw.get("group")}
            ], 0])
            with pytest.raises(ValueError):
                st.ingest(1, bad)
            assert st.expected == 1 and st.indexed_blocks == 1 and st.stats.batches == 1
