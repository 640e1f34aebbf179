"""The redis backend's key names and value encodings, the one place that knows them: the
scripts take block keys built here (``tests/service/index/redis/test_backend.py`` checks the
keyspace against this docstring).

Two kinds of keys (``NS`` = ``namespace(model, block_size, algo)``, percent-encoded, so it
holds no ``{``, ``}`` or ``|``; ``HASH`` is a block hash as raw bytes, 32 or 16 of them)::

    {T}HASH                  STRING  who holds the block: sorted 4-byte entries
                                     (3-byte worker handle, big-endian; 1 byte of tier bits)
    p{T}HASH NS              STRING  ";worker|expiry_ms;..." provisional holders (key TTL)
    kvm:{ctl}:workers        HASH    worker id -> NS                          (registry)
    kvm:{ctl}:w:NS|ID        HASH    the worker's record (address, seq, load, h, n, ...)
    kvm:{ctl}:live:NS        HASH    handle (decimal) -> worker id, live handles only;
                                     'v': its version (changes with every handle drawn
                                     or retired), 'c': the count behind the version
    kvm:{ctl}:pm:NS          STRING  "1" while provisional entries of NS may exist (TTL)
    kvm:{ctl}:handles        STRING  the last handle ever drawn (INCR)
    kvm:{ctl}:free           SET     handles swept clean, drawn again before new ones
    kvm:{ctl}:dead           SET     retired handles whose entries the sweep still drops
    kvm:{ctl}:cycle          SET     the handles the running sweep cycle drops
    kvm:{ctl}:sweep          HASH    the running sweep cycle's SCAN cursor (on a Redis
                                     Cluster: 'id' and one cursor per primary)

On a multi-shard Redis Cluster only (``cluster.py``, ``cluster_upkeep.py``)::

    {T}!                     STRING  the tag's sentinel: the identity (run_id:master_replid)
                                     of the primary serving the slot when last checked;
                                     gone or another = back empty or older
                                     (``shard_identity.py``)
    {T}#                     HASH    the tag's fences: 3-byte handle (or '*': all) -> the
                                     ticket at and below which its writes are refused
                                     (``handle_fence.py``)
    kvm:{ctl}:gen            STRING  the block shards' generation (moves when one is lost
                                     or back older)
    kvm:{ctl}:ticket         STRING  the begin steps' ticket counter (``handle_fence.py``)
    kvm:{ctl}:busy           ZSET    'handle:token' -> ms: handles a batch may still write
    kvm:{ctl}:recover        STRING  the lock of the control slot's recovery (TTL)

``T`` is one tag byte chosen by the hash's first byte (:func:`tag`): 64 tags, picked so
their Redis Cluster slots spread evenly over 16,384 (with S shards owning equal slot
ranges, no shard owns more than 1.125x its share of tags for S = 2..10). A block's key
depends on its hash alone, so keys of one chain, even of one shared prefix, spread over
every shard, and a write needs nothing but the hash. Every control key shares the tag
``ctl`` (one slot): registration, purge and handle bookkeeping are single-slot.

A *handle* (1 .. 2**24 - 1) names one worker's current set of entries: registration, a
Cleared event, a snapshot and the block-cap backstop give the worker a fresh handle and
retire the old one, which drops all its entries at once for every reader (lookups only
count handles of ``live:NS``). The sweep (``SWEEP``) later deletes retired handles' entries
and returns the handles to ``free``.
"""
from __future__ import annotations

from collections.abc import Sequence

from redis.crc import key_slot

CTL = "kvm:{ctl}:"
REGISTRY = CTL + "workers"
HANDLES, FREE, DEAD, CYCLE, SWEEP = (CTL + s for s in ("handles", "free", "dead", "cycle",
                                                       "sweep"))
MAX_HANDLE = 2 ** 24 - 1
ENTRY_BYTES = 4            # 3-byte handle + 1 byte of tier bits
N_TAGS = 64
BLOCK_KEYS_MATCH = b"{?}*"   # SCAN pattern of the block keys (nothing else starts so)
PROV_KEYS_MATCH = b"p{?}*"


def _pick_tags() -> bytes:
    """64 single-byte tags (never ``{`` or ``}``) whose slots lie nearest to 64 evenly
    spaced points of the slot space: deterministic, computed once at import."""
    slots = {b: key_slot(bytes([b])) for b in range(256) if b not in b"{}"}
    chosen: list[int] = []
    for i in range(N_TAGS):
        target = (i + 0.5) * 16384 / N_TAGS
        chosen.append(min((b for b in slots if b not in chosen),
                          key=lambda b: abs(slots[b] - target)))
    return bytes(chosen)


TAGS = _pick_tags()
# "{t}" for every tag, concatenated: the scripts slice their key prefix out of this string
TAG_PREFIXES = b"".join(b"{" + bytes([t]) + b"}" for t in TAGS)


# "{t}" by first byte of the hash
_BY_BYTE = tuple(TAG_PREFIXES[3 * (b % N_TAGS):3 * (b % N_TAGS) + 3] for b in range(256))


def tag(h: bytes) -> int:
    """Index of the tag of block hash ``h`` (its first byte, modulo 64)."""
    return h[0] % N_TAGS


def block_key(h: bytes) -> bytes:
    return _BY_BYTE[h[0]] + h


def block_keys(hashes: Sequence[bytes]) -> bytes:
    """The block keys of ``hashes``, concatenated (what the scripts take)."""
    out: list[bytes] = []
    for h in hashes:
        out += (_BY_BYTE[h[0]], h)
    return b"".join(out)


def prov_key(ns: str, h: bytes) -> bytes:
    return b"p" + block_key(h) + ns.encode()


def prov_keys(ns: str, hashes: Sequence[bytes]) -> bytes:
    """The provisional keys of ``hashes``, concatenated."""
    tail = ns.encode()
    out: list[bytes] = []
    for h in hashes:
        out += (b"p", _BY_BYTE[h[0]], h, tail)
    return b"".join(out)


def worker_key(ns: str, worker_id: str) -> str:
    return f"{CTL}w:{ns}|{worker_id}"


def live_key(ns: str) -> str:
    return f"{CTL}live:{ns}"


def prov_marker(ns: str) -> str:
    return f"{CTL}pm:{ns}"


def handle_bytes(h: int) -> bytes:
    return h.to_bytes(3, "big")


def entries(value: bytes | None) -> dict[int, int]:
    """handle -> tier bits of a block key's value (None: no holder)."""
    if not value:
        return {}
    return {int.from_bytes(value[i:i + 3], "big"): value[i + 3]
            for i in range(0, len(value), ENTRY_BYTES)}




def live_map(reply: dict[bytes, bytes] | list[bytes]) -> tuple[bytes | None, dict[int, str]]:
    """(version, handle -> worker id) of a live map's raw HGETALL reply (a map in RESP3, a
    flat list of fields and values in RESP2)."""
    fields = dict(reply) if isinstance(reply, dict) else dict(
        zip(reply[::2], reply[1::2], strict=True))
    version = fields.pop(b"v", None)
    fields.pop(b"c", None)
    return version, {int(h): wid.decode() for h, wid in fields.items()}
