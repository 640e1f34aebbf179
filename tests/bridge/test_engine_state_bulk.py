"""EngineState's bulk paths against its block-by-block reference and a model of the contract.

Random engines: chains of blocks (int or bytes engine hashes, token ids small, large, past the
CBOR table or negative), some sharing a prefix, one an alias of another (distinct engine
hashes, same content: the same chain hashes); salts, LoRA (mapped, unmapped, id only),
multimodal keys, prompt embeddings, keys no rebuild can place. Events store and remove runs
of them on every tier, twice, in any order, with unknown hashes, repeated hashes, other
groups, unknown mediums and resets, in batches of a few events.
"""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge import index_events
from bridge.engine_state import EngineState
from kvmesh.events import vllm as ve
from kvmesh.hashing import hash_block, none_hash
from kvmesh.v1 import index_pb2
from tests.bridge.index_view import IndexView

BS = 4
LORAS = {"ad": "/adapters/ad"}
MEDIUMS = [None, "GPU", "CPU", "STORAGE"]
NAMES = {index_pb2.TIER_GPU: "gpu", index_pb2.TIER_CPU: "cpu", index_pb2.TIER_DISK: "disk"}
TIER = {None: index_pb2.TIER_GPU, "GPU": index_pb2.TIER_GPU, "CPU": index_pb2.TIER_CPU,
        "STORAGE": index_pb2.TIER_DISK}
# per chain: (lora_name, lora_id, extra keys of block b given the chain's salt and image)
KINDS = ["plain", "plain", "salt", "lora", "lora_salt", "unknown_lora", "lora_id", "mm",
         "embeds", "bad_key"]

token = st.one_of(st.integers(0, 300), st.integers(0, 2**18 + 5), st.integers(-3, 2**40))


@st.composite
def engines(draw):
    """Chains: lists of (engine hash, tokens, keys), and each chain's (lora_name, lora_id)."""
    chains, loras = [], []
    for c in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(KINDS))
        n = draw(st.integers(1, 12))
        as_bytes = draw(st.booleans())
        blocks = []
        if c and draw(st.booleans()):  # a prefix shared with the first chain
            blocks = list(chains[0][:draw(st.integers(0, len(chains[0])))])
            kind = "plain" if loras[0] == (None, None) else kind
            if loras[0] != (None, None):
                blocks = []
        for b in range(len(blocks), n):
            h = 1000 * (c + 1) + b
            keys: tuple | None = None
            if kind in ("lora", "lora_salt", "unknown_lora"):
                keys = ("ad" if kind != "unknown_lora" else "zz",)
            if kind in ("salt", "lora_salt") and b == 0:
                keys = (*(keys or ()), "s1")
            if kind == "mm" and b < 2:
                keys = (("img", 3 - BS * b),)
            if kind == "embeds" and b == 1:
                keys = (b"\x01" * 32,)
            if kind == "bad_key" and b == 2:
                keys = ("late-salt",)
            blocks.append((h.to_bytes(32, "big") if as_bytes else h,
                           draw(st.lists(token, min_size=BS, max_size=BS)), keys))
        chains.append(blocks)
        loras.append({"lora": ("ad", None), "lora_salt": ("ad", None),
                      "unknown_lora": ("zz", None), "lora_id": (None, 7)}.get(kind,
                                                                              (None, None)))
    # an alias of chain 0's first blocks: other engine hashes, the same content
    chains.append([(900_000 + i, tok, keys) for i, (_, tok, keys) in enumerate(chains[0])])
    loras.append(loras[0])
    return chains, loras


def ops(n_chains: int, dups: bool):
    """Batches of ops; a start of -1 is the common case: a store continues the chain where
    its last store ended, a removal takes back the chain's last stored run."""
    c = st.integers(0, n_chains - 1)
    start = st.one_of(st.just(-1), st.just(-1), st.integers(0, 11))
    medium = st.one_of(st.just("GPU"), st.sampled_from(MEDIUMS))
    store = st.tuples(st.just("store"), c, start, st.integers(1, 4), medium,
                      st.booleans() if dups else st.just(False))
    remove = st.tuples(st.just("remove"), c, start, st.integers(1, 4), medium, st.booleans(),
                       st.booleans(), st.booleans(), st.booleans())
    other = st.sampled_from([("clear",), ("group",), ("medium",)])
    return st.lists(st.lists(st.one_of(store, store, remove, remove, other), min_size=1,
                             max_size=3), min_size=3, max_size=30)


class Engine:
    """Turns ops into vLLM events over ``chains``, remembering each chain's last stored run."""

    def __init__(self, chains, loras) -> None:
        self.chains, self.loras = chains, loras
        self.last: dict[int, tuple[int, int, str | None]] = {}  # chain -> (start, n, medium)

    def events(self, op) -> list:
        """``op``'s events: one, or for a split removal one ``BlockRemoved`` per hash, as
        vLLM's block pool emits evictions (the state releases such runs together)."""
        ev = self.event(op)
        if op[0] == "remove" and len(op) > 8 and op[8]:
            return [ve.VllmRemoved(block_hashes=[h], medium=ev.medium)
                    for h in ev.block_hashes]
        return [ev]

    def event(self, op):
        kind = op[0]
        if kind in ("clear", "group", "medium"):
            if kind == "clear":
                return ve.VllmCleared()
            return ve.VllmRemoved(block_hashes=[1], medium="GPU" if kind == "group" else
                                  "NVME", group_idx=1 if kind == "group" else None)
        _, c, i, n, medium, flag = op[:6]
        blocks = self.chains[c]
        if kind == "remove" and i < 0 and c in self.last:
            i, n, medium = self.last.pop(c)
        elif i < 0:
            i, n0, _ = self.last.get(c, (0, 0, None))
            i = (i + n0) % len(blocks)
        i = min(i, len(blocks) - 1)
        run = blocks[i:i + n]
        hashes = [h for h, _, _ in run]
        if kind == "remove":
            if flag:
                hashes.append(99)  # never stored
            if op[7]:  # with the alias's blocks: two engine hashes of one chain hash
                hashes += [h for h, _, _ in self.chains[-1][i:i + n]]
            if op[6]:
                hashes.reverse()
            return ve.VllmRemoved(block_hashes=hashes, medium=medium)
        self.last[c] = (i, len(run), medium)
        tokens = [t for _, tok, _ in run for t in tok]
        keys = [k for _, _, k in run]
        if flag:  # a hash repeated inside the event (no engine does that; the state copes)
            hashes.append(hashes[0])
            tokens += run[0][1]
            keys.append(run[0][2])
        lora_name, lora_id = self.loras[c]
        return ve.VllmStored(block_hashes=hashes,
                             parent_block_hash=blocks[i - 1][0] if i else None,
                             token_ids=tokens, block_size=BS, lora_id=lora_id, medium=medium,
                             lora_name=lora_name,
                             extra_keys=keys if any(k is not None for k in keys) else None)


def same(a: EngineState, b: EngineState) -> None:
    assert a.stats == b.stats
    assert a.snapshot() == b.snapshot()
    assert a.indexed_blocks == b.indexed_blocks and a.out_seq == b.out_seq


@pytest.mark.parametrize("max_run", [2, index_events.MAX_RUN])
# the fixture sets the same value for every example
@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), memo=st.sampled_from([0, 2, 65_536]))
def test_bulk_paths_equal_the_block_by_block_path(monkeypatch, max_run, data, memo) -> None:
    monkeypatch.setattr(index_events, "MAX_RUN", max_run)
    chains, loras = data.draw(engines())
    bulk = EngineState(block_size=BS, loras=LORAS, memo_blocks=memo)
    ref = EngineState(block_size=BS, loras=LORAS, memo_blocks=memo, bulk=False)
    view, engine = IndexView(), Engine(chains, loras)
    for seq, batch_ops in enumerate(data.draw(ops(len(chains), dups=True))):
        events = [e for op in batch_ops for e in engine.events(op)]
        payload = ve.encode_batch(ve.KVEventBatch(ts=1.0, events=events))
        out = bulk.ingest(seq, payload)
        assert out == ref.ingest(seq, payload)
        view.apply(out)  # never stored twice, never a removal of what is not held
        same(bulk, ref)
        for chain in {h for h, _ in view.held}:
            assert bulk.held(chain) == {NAMES[t] for h, t in view.held if h == chain}


def chain_of(blocks, i: int, parent: bytes, lora_name: str | None, root: bytes
             ) -> bytes | None:
    """The model: block ``i``'s chain hash below ``parent``; ``None`` for keys kvmesh cannot
    rebuild (the chain's adapter is mapped or absent)."""
    _, tokens, keys = blocks[i]
    extra: list = [("lora", "ad", LORAS["ad"])] if lora_name else []
    lora_seen, salt = False, None
    for k in keys or ():
        if isinstance(k, bytes):
            return None
        if isinstance(k, tuple):
            extra.append(("mm", *k))
        elif lora_name and not lora_seen and k == lora_name:
            lora_seen = True
        elif i == 0 and salt is None:
            salt = k
        else:
            return None
    if salt is not None:
        extra.append(("cache_salt", salt))
    return hash_block(parent or root, tokens, tuple(extra) or None, "sha256_cbor")


@settings(max_examples=120, deadline=None)
@given(data=st.data(), memo=st.sampled_from([0, 65_536]))
def test_the_index_view_follows_the_copies(data, memo) -> None:
    """A model of the contract: per (engine hash, tier) a copy count; each engine hash's chain
    hash fixed when it gains its first copy anywhere (rebuilt from its parent's, ``None``
    below anything unroutable); the index holds (chain, tier) while some engine hash of that
    chain has a copy there."""
    chains, loras = data.draw(engines())
    root = none_hash()
    state = EngineState(block_size=BS, loras=LORAS, memo_blocks=memo)
    view = IndexView()
    copies: Counter = Counter()
    chain: dict = {}
    engine = Engine(chains, loras)
    for seq, batch_ops in enumerate(data.draw(ops(len(chains), dups=False))):
        per_op = [(op, ev) for op in batch_ops for ev in engine.events(op)]
        events = [ev for _, ev in per_op]
        for op, ev in per_op:
            if op[0] == "clear":
                copies.clear()
                chain.clear()
            elif op[0] == "store":
                c = op[1]
                i = [h for h, _, _ in chains[c]].index(ev.block_hashes[0])
                t = TIER[ev.medium]
                parent = b"" if i == 0 else chain.get(ev.parent_block_hash)
                # the event's chain cannot be rebuilt (an unmapped adapter, an orphan, then
                # a key kvmesh cannot place): nothing new after that is routable
                lost = loras[c] not in ((None, None), ("ad", None)) or parent is None
                for k, h in enumerate(ev.block_hashes):
                    if h not in chain:
                        ch = None
                        if not lost and parent is not None:
                            ch = chain_of(chains[c], i + k, parent, loras[c][0], root)
                            lost = ch is None
                        chain[h] = ch
                    copies[(h, t)] += 1
                    parent = chain[h]
            elif op[0] == "remove":
                t = TIER[ev.medium]
                for h in ev.block_hashes:
                    if copies[(h, t)]:
                        copies[(h, t)] -= 1
                        if not any(copies[(h, u)] for u in TIER.values()):
                            del chain[h]
        view.apply(state.ingest(seq, ve.encode_batch(ve.KVEventBatch(ts=1.0, events=events))))
        want = {(chain[h], t) for (h, t), n in copies.items() if n and chain[h] is not None}
        assert set(view.held) == want
        assert state.indexed_blocks == len({ch for ch, _ in want})


@pytest.mark.parametrize("bulk", [True, False])
def test_one_removal_of_two_engine_hashes_of_one_chain(bulk: bool) -> None:
    tokens = list(range(2 * BS))
    x = [hash_block(none_hash(), tokens[:BS], None, "sha256_cbor")]
    x.append(hash_block(x[0], tokens[BS:], None, "sha256_cbor"))
    state = EngineState(block_size=BS, bulk=bulk)
    stored = [ve.VllmStored(block_hashes=hs, parent_block_hash=None, token_ids=tokens,
                            block_size=BS, lora_id=None, medium=None, lora_name=None)
              for hs in ([1, 2], [11, 12])]
    view = IndexView().apply(state.apply(ve.KVEventBatch(ts=1.0, events=stored)))
    assert set(view.held) == {(x[0], index_pb2.TIER_GPU), (x[1], index_pb2.TIER_GPU)}
    out = state.apply(ve.KVEventBatch(ts=1.0, events=[
        ve.VllmRemoved(block_hashes=[1, 11, 2], medium=None)]))
    assert [list(e.removed.block_hashes) for e in out] == [[x[0]]]
    assert set(view.apply(out).held) == {(x[1], index_pb2.TIER_GPU)}
    assert state.indexed_blocks == 1 and state.stats.removed_blocks == 3
