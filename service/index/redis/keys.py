"""The redis backend's key names and value encodings, the one place that knows them.

Scripts take block keys built here, so the tag rule lives here alone. A block key is the
block's raw hash behind a one-byte cluster tag (``{T}HASH``, its value sorted 4-byte
(handle, tier bits) entries); every control key shares the tag ``{ctl}`` (one slot). The
tag depends on the hash alone, so one chain spreads over every shard and a writer needs
nothing but the hash. A *handle* names one worker's current entries: retiring it drops them
all at once for every reader; the sweep deletes them later. The full key table (checked by
``tests/service/test_redis_index.py``) is in the architecture page.

See docs/architecture.md#the-redis-layout-serviceindexredis.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

from redis.crc import key_slot

from kvmesh.contract import TIERS
from kvmesh.quota import ALL_TENANTS, Quota, Quotas

CTL = "kvm:{ctl}:"
REGISTRY = CTL + "workers"
QUOTAS = CTL + "quotas"  # tenant ("*": the default) -> its Quota as JSON
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
PREFIX_BY_BYTE = tuple(TAG_PREFIXES[3 * (b % N_TAGS):3 * (b % N_TAGS) + 3] for b in range(256))


def tag(h: bytes) -> int:
    """Index of the tag of block hash ``h`` (its first byte, modulo 64)."""
    return h[0] % N_TAGS


def block_key(h: bytes) -> bytes:
    return PREFIX_BY_BYTE[h[0]] + h


def block_keys(hashes: Sequence[bytes]) -> bytes:
    """The block keys of ``hashes``, concatenated (what the scripts take)."""
    out: list[bytes] = []
    for h in hashes:
        out += (PREFIX_BY_BYTE[h[0]], h)
    return b"".join(out)


def prov_key(ns: str, h: bytes) -> bytes:
    return b"p" + block_key(h) + ns.encode()


def prov_keys(ns: str, hashes: Sequence[bytes]) -> bytes:
    """The provisional keys of ``hashes``, concatenated."""
    tail = ns.encode()
    out: list[bytes] = []
    for h in hashes:
        out += (b"p", PREFIX_BY_BYTE[h[0]], h, tail)
    return b"".join(out)


def worker_key(ns: str, worker_id: str) -> str:
    return f"{CTL}w:{ns}|{worker_id}"


def lane_key(ns: str, worker_id: str) -> str:
    """A worker's event lane on a Redis Cluster (its seq, handle and ticket; no ``{ctl}``
    tag, so lanes spread over the shards: ``service/index/lanes.py``)."""
    return f"kvm:lane:{ns}|{worker_id}"


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


def quota_value(quota: Quota) -> str:
    """A tenant's field value in :data:`QUOTAS`: ``{"gpu": 0.3}``, set tiers only."""
    return json.dumps({t: quota.get(t) for t in TIERS if quota.get(t) is not None},
                      sort_keys=True)


def quotas_of(fields: Mapping[str, str]) -> Quotas:
    """The :class:`Quotas` of :data:`QUOTAS`' fields. A field no quota can be (written by
    hand, or by another version) is skipped with a warning: one bad tenant must not take
    every tenant's quotas away."""
    default, tenants = Quota(), {}
    for tenant, value in sorted(fields.items()):
        try:
            quota = Quota(**{t: float(v) for t, v in json.loads(value).items()})
            if tenant == ALL_TENANTS:
                default = quota
            else:
                tenants[tenant] = quota
        except (ValueError, TypeError, AttributeError) as e:
            logging.getLogger("kvmesh.service").warning(
                "ignoring the stored quota of tenant %r (%s): %s", tenant, QUOTAS, e)
    return Quotas(default, tenants)
