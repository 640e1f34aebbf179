"""Hypothesis strategies of random and malformed kvmesh requests, as serialized bytes.

``index_requests(limits)`` and ``worker_requests(limits)`` map every RPC of IndexService and
WorkerService to a strategy of request bytes: well-formed requests (so some calls succeed
and change state), requests with wrong fields (hash sizes, negative and huge ids and seqs,
empty and giant strings and lists, unknown tiers, broken and out-of-order events, unknown
workers), giant requests sized around the server's configured limits, and raw random bytes.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.message import Message
from hypothesis import strategies as st

from kvmesh.contract import ALGOS
from kvmesh.hashing import none_hash
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import worker_pb2 as wpb

KNOWN_WORKERS = ("w0", "w1")
HASH_POOL = tuple(bytes([i]) * 32 for i in range(1, 9))  # valid sha256_cbor-sized hashes


@dataclass(frozen=True)
class Limits:
    """The limits the server under test runs with (the giant strategies aim around them)."""

    max_message_bytes: int = 64 * 1024
    max_prompt_tokens: int = 2000
    max_batch_events: int = 64
    max_batch_hashes: int = 256
    max_snapshot_blocks: int = 256
    max_salt_bytes: int = 4096


def _around(n: int) -> st.SearchStrategy[int]:
    return st.integers(max(0, n - 2), n + 2)


U32 = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2**31, 2**32 - 1]))
U64 = st.one_of(st.integers(0, 2**64 - 1),
                st.sampled_from([0, 1, 2, 2**53 - 1, 2**53, 2**63, 2**64 - 1]))
I64 = st.one_of(st.integers(-(2**63), 2**63 - 1),
                st.sampled_from([-(2**63), -1, 0, 2**31, 2**63 - 1]))
RAW = st.binary(max_size=300)


def texts(limit: int = 4096) -> st.SearchStrategy[str]:
    """Short, odd, and giant (around ``limit`` bytes) strings."""
    return st.one_of(st.text(max_size=24), st.sampled_from(["", " ", "\x00", "é" * 3]),
                     _around(limit).map(lambda n: "s" * n))


def worker_ids() -> st.SearchStrategy[str]:
    """Mostly the registered workers (so calls get past validation), else anything."""
    known = st.sampled_from(KNOWN_WORKERS)
    return st.one_of(known, known, known,
                     st.sampled_from(["ghost", "", "bad id!", "-x", "a" * 129]),
                     st.text(max_size=20), st.from_regex(r"[a-z][a-z0-9._:@/-]{0,12}",
                                                         fullmatch=True))


def hashes() -> st.SearchStrategy[bytes]:
    """Mostly valid 32-byte hashes from a small pool (chains share blocks), else wrong sizes."""
    pool = st.sampled_from(HASH_POOL)
    return st.one_of(pool, pool, pool, st.binary(max_size=40),
                     st.binary(min_size=16, max_size=16))


def loads() -> st.SearchStrategy[pb.WorkerLoad]:
    """Empty, plausible, and arbitrary (often free > total) loads."""
    plausible = st.integers(0, 64).flatmap(lambda total: st.builds(
        pb.WorkerLoad, running=st.integers(0, 8), free_blocks=st.integers(0, total),
        total_blocks=st.just(total)))
    arbitrary = st.builds(pb.WorkerLoad, running=U32, waiting=U32, queued_prefill_tokens=U64,
                          free_blocks=U32, total_blocks=U32, decode_tokens=U64)
    cost = st.one_of(st.just(0.0), st.floats(0, 1e4), st.floats())  # NaN, inf, negative too
    measured = st.builds(pb.WorkerLoad, total_blocks=st.just(64), free_blocks=st.just(8),
                         prefill_us_per_token=cost, onboard_us_per_block_cpu=cost,
                         onboard_us_per_block_disk=cost, fetch_us_per_block=cost,
                         fetch_us_per_call=cost, peer_fetch=st.booleans())
    return st.one_of(st.just(pb.WorkerLoad()), plausible, arbitrary, measured)


def tokens(limit: int) -> st.SearchStrategy[list[int]]:
    """Prompts: short valid ones, ones with negative/huge ids, and giant ones."""
    small = st.lists(st.integers(0, 255), max_size=80)
    odd = st.lists(st.one_of(st.integers(0, 400), I64), max_size=40)
    giant = _around(limit).map(lambda n: [7] * n)
    return st.one_of(small, small, odd, giant)


def _tier() -> st.SearchStrategy[int]:
    known = st.sampled_from([0, 1, 2, 3])
    return st.one_of(known, known, known, st.integers(-(2**31), 2**31 - 1))


def _stored() -> st.SearchStrategy[pb.BlockStored]:
    return st.builds(pb.BlockStored, block_hashes=st.lists(hashes(), max_size=6),
                     parent_hash=st.one_of(st.just(b""), hashes()), tier=_tier())


def _event(seq: st.SearchStrategy[int]) -> st.SearchStrategy[pb.KvEvent]:
    removed = st.builds(pb.BlockRemoved, block_hashes=st.lists(hashes(), max_size=6),
                        tier=_tier())
    return st.one_of(
        st.builds(lambda s, b: pb.KvEvent(seq=s, stored=b), seq, _stored()),
        st.builds(lambda s, b: pb.KvEvent(seq=s, removed=b), seq, removed),
        st.builds(lambda s: pb.KvEvent(seq=s, cleared=pb.AllBlocksCleared()), seq),
        st.builds(lambda s: pb.KvEvent(seq=s), seq))  # no event kind


def _consecutive(start: int, events: list[pb.KvEvent]) -> list[pb.KvEvent]:
    for i, ev in enumerate(events):
        ev.seq = start + i
    return events


def _events(lim: Limits) -> st.SearchStrategy[list[pb.KvEvent]]:
    anyseq = st.lists(_event(U64), max_size=6)
    ordered = st.builds(_consecutive, st.integers(1, 40), st.lists(_event(st.just(0)),
                                                                   min_size=1, max_size=6))
    many = _around(lim.max_batch_events).map(lambda n: _consecutive(1, [
        pb.KvEvent(cleared=pb.AllBlocksCleared()) for _ in range(n)]))
    wide = _around(lim.max_batch_hashes).map(lambda n: [pb.KvEvent(seq=1, stored=pb.BlockStored(
        block_hashes=[HASH_POOL[0]] * n))])
    return st.one_of(anyseq, ordered, ordered, ordered, many, wide)


def _register() -> st.SearchStrategy[pb.RegisterWorkerRequest]:
    algo = st.one_of(st.sampled_from(ALGOS), st.text(max_size=10))

    def root(a: str, good: bool, junk: bytes) -> bytes:
        return none_hash(a) if good and a in ALGOS else junk

    return st.builds(
        lambda wid, addr, model, bs, a, good, junk, load: pb.RegisterWorkerRequest(
            worker_id=wid, address=addr, model=model, block_size=bs, hash_algo=a,
            root_hash=root(a, good, junk), load=load),
        worker_ids(), st.one_of(st.just("127.0.0.1:9999"), st.just("127.0.0.1:9999"),
                                texts(300)),
        st.one_of(st.just("tiny"), st.just("tiny"), texts(300)),
        st.one_of(st.just(4), st.just(4), U32), st.one_of(st.just("sha256_cbor"), algo),
        st.booleans(), st.binary(max_size=40), loads())


def packed_tokens(limit: int) -> st.SearchStrategy[bytes]:
    """``token_ids_packed``: none, valid uint32 ids (any, and around the prompt limit), and
    byte strings of any length (not a multiple of 4 three times in four)."""
    ids = st.lists(st.integers(0, 2**32 - 1), max_size=40)
    return st.one_of(st.just(b""), st.just(b""), ids.map(lambda t: struct.pack(
        f"<{len(t)}I", *t)), st.binary(max_size=40),
        _around(limit).map(lambda n: b"\x07\x00\x00\x00" * n))


def _route(lim: Limits) -> st.SearchStrategy[pb.RouteRequest]:
    mm = st.builds(pb.MultimodalItem, identifier=texts(1100), offset=I64, length=I64)
    lora = st.builds(pb.Lora, name=st.text(max_size=8), path=st.text(max_size=8))
    return st.builds(
        pb.RouteRequest, token_ids=st.one_of(st.just([]), tokens(lim.max_prompt_tokens)),
        token_ids_packed=packed_tokens(lim.max_prompt_tokens),
        salt=texts(lim.max_salt_bytes), lora=st.one_of(st.none(), lora),
        mm=st.lists(mm, max_size=3), model=st.one_of(st.just(""), st.just("tiny"), texts(64)),
        policy=st.one_of(st.just(""), st.sampled_from(["kvmesh", "round_robin", "fastest"]),
                         st.text(max_size=10)),
        max_candidates=U32, dry_run=st.booleans())


def _prefix(lim: Limits) -> st.SearchStrategy[pb.PrefixRef]:
    """Prefixes to pin: token ids, block hashes, both or neither, with extra keys."""
    mm = st.builds(pb.MultimodalItem, identifier=texts(1100), offset=I64, length=I64)
    lora = st.builds(pb.Lora, name=st.text(max_size=8), path=st.text(max_size=8))
    many = _around(lim.max_batch_hashes).map(lambda n: [HASH_POOL[0]] * n)
    chain = st.one_of(st.just([]), st.just([]), st.lists(hashes(), max_size=5), many)
    return st.builds(
        pb.PrefixRef, token_ids=st.one_of(st.just([]), tokens(lim.max_prompt_tokens)),
        salt=st.one_of(st.just(""), texts(lim.max_salt_bytes)), lora=st.one_of(st.none(), lora),
        mm=st.one_of(st.just([]), st.lists(mm, max_size=2)),
        model=st.one_of(st.just(""), st.just("tiny"), texts(64)), block_hashes=chain)


def _oversized(lim: Limits, make: Callable[[list[int]], Message]) -> st.SearchStrategy[bytes]:
    """A request (``make(token_ids)``) just over the message limit, or far over gRPC's
    transport cap (token id 300 takes 2 bytes)."""
    sizes = st.sampled_from([lim.max_message_bytes // 2 + 64, 3 * lim.max_message_bytes])
    return sizes.map(lambda n: make([300] * n).SerializeToString())


def _as_bytes(messages: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    """Serialized messages, and (a quarter of the time) raw random bytes."""
    serialized = messages.map(lambda m: m.SerializeToString())
    return st.one_of(serialized, serialized, serialized, RAW)


def index_requests(lim: Limits) -> dict[str, st.SearchStrategy[bytes]]:
    """IndexService method name -> strategy of serialized (possibly malformed) requests."""
    events = st.builds(pb.PublishEventsRequest, worker_id=worker_ids(), events=_events(lim))
    snap_blocks = st.one_of(st.lists(_stored(), max_size=5), _around(
        lim.max_snapshot_blocks).map(lambda n: [pb.BlockStored(block_hashes=[HASH_POOL[1]] * n)]))
    return {
        "RegisterWorker": _as_bytes(_register()),
        "Heartbeat": _as_bytes(st.builds(pb.HeartbeatRequest, worker_id=worker_ids(),
                                         load=loads(), last_seq=U64, quota_version=U64)),
        "PublishEvents": _as_bytes(events),
        "SyncWorker": _as_bytes(st.builds(pb.SyncWorkerRequest, worker_id=worker_ids(),
                                          seq=U64, blocks=snap_blocks)),
        "Route": st.one_of(_as_bytes(_route(lim)),
                           _oversized(lim, lambda t: pb.RouteRequest(token_ids=t)),
                           _oversized(lim, lambda t: pb.RouteRequest(
                               token_ids_packed=struct.pack(f"<{len(t)}I", *t)))),
        "Stats": st.one_of(st.just(b""), RAW),
        "PinPrefix": st.one_of(
            _as_bytes(st.builds(pb.PinPrefixRequest, prefix=st.one_of(st.none(), _prefix(lim)),
                                ttl_s=st.one_of(st.just(0.0), st.floats()),
                                max_workers=st.one_of(st.integers(0, 3), U32))),
            _oversized(lim, lambda t: pb.PinPrefixRequest(prefix=pb.PrefixRef(token_ids=t)))),
        "UnpinPrefix": _as_bytes(st.builds(pb.UnpinPrefixRequest,
                                           prefix=st.one_of(st.none(), _prefix(lim)))),
        "SetTenantQuota": _as_bytes(st.builds(pb.SetTenantQuotaRequest, quota=st.one_of(
            st.none(), _tenant_quota()), clear=st.booleans())),
        "GetTenantQuotas": st.one_of(st.just(b""), RAW),
    }


def _tenant_quota() -> st.SearchStrategy[pb.TenantQuota]:
    """A tenant's quota: a name or '*' or a bad one, each tier unset, a fraction or not."""
    tier = st.one_of(st.none(), st.floats(0.0, 1.0), st.floats())
    return st.builds(pb.TenantQuota, tenant=st.one_of(st.sampled_from(["*", "", "a", "(other)"]),
                                                      st.text(max_size=70)),
                     gpu=tier, cpu=tier, disk=tier)


def worker_requests(lim: Limits, vocab: int = 256) -> dict[str, st.SearchStrategy[bytes]]:
    """WorkerService method name -> strategy of serialized (possibly malformed) requests.

    Valid Generate requests stay small (a few tokens out) so the suite stays fast; the bad
    ones aim at every check the worker makes (vocabulary, context, pool, salt, mm, params).
    """
    temperature = st.one_of(st.just(0.0), st.floats(allow_nan=True, allow_infinity=True,
                                                    width=32))
    few = st.integers(1, 3)
    sampling = st.builds(wpb.SamplingParams, max_tokens=st.one_of(few, few, st.just(0), U32),
                         temperature=temperature, seed=st.one_of(st.none(), I64),
                         ignore_eos=st.booleans())
    mm = st.builds(pb.MultimodalItem, identifier=st.text(max_size=6),
                   offset=st.one_of(st.integers(-20, 60), I64),
                   length=st.one_of(st.integers(-2, 30), I64))
    lora = st.builds(pb.Lora, name=st.text(max_size=8), path=st.text(max_size=8))
    valid = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=40)
    prompt = st.one_of(valid, valid, tokens(lim.max_prompt_tokens))
    generate = st.builds(
        wpb.GenerateRequest, request_id=st.one_of(st.just(""), st.text(max_size=8), texts(300)),
        token_ids=prompt, sampling=sampling,
        salt=st.one_of(st.just(""), st.just("tenant"), texts(lim.max_salt_bytes)),
        lora=st.one_of(st.none(), st.none(), lora),
        mm=st.one_of(st.just([]), st.lists(mm, max_size=2)), index_matched_tokens=U64)
    fetch = st.builds(wpb.FetchBlocksRequest,
                      requester_id=st.one_of(st.just(""), st.just("w-peer"), texts(1100)),
                      block_hashes=st.lists(hashes(), max_size=4),
                      ticket=st.one_of(st.just(b""), st.binary(max_size=200)),
                      proof=st.binary(max_size=40),
                      transport=st.one_of(st.just(""), st.just("grpc"), st.text(max_size=6)))
    pin = st.builds(
        wpb.PinRequest, token_ids=st.one_of(st.just([]), prompt),
        block_hashes=st.one_of(st.just([]), st.just([]), st.lists(hashes(), max_size=4)),
        salt=st.one_of(st.just(""), st.just("tenant"), texts(lim.max_salt_bytes)),
        lora=st.one_of(st.none(), st.none(), lora),
        mm=st.one_of(st.just([]), st.lists(mm, max_size=2)),
        ttl_s=st.one_of(st.just(0.0), st.floats(0, 1e4), st.floats()), warm=st.booleans(),
        unpin=st.booleans())
    return {
        "Pin": st.one_of(_as_bytes(pin), _oversized(lim, lambda t: wpb.PinRequest(token_ids=t))),
        "Generate": st.one_of(_as_bytes(generate),
                              _oversized(lim, lambda t: wpb.GenerateRequest(token_ids=t))),
        "Stats": st.one_of(st.just(b""), RAW),
        "FetchBlocks": _as_bytes(fetch),
    }

