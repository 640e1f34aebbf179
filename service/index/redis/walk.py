"""The chain walk of the redis backend's lookup, in the service, over block values read in
one round trip (``RedisBackend.lookup``). Same rules as ``base.py`` and the memory backend.

Inputs: ``values[i]``, block i's holders (sorted 4-byte entries: 3-byte handle, tier bits;
None: nobody), ``pvalues[i]``, its provisional holders (``;worker|expiry_ms;...``; None, or
no list at all when the namespace has none), and ``live``, the namespace's live handles
(handle -> worker id; entries of other handles are retired or of another namespace and
never count). Block 0's live holders and unexpired provisional holders start the candidate
set (only those in ``allowed``, None: any); a later block keeps a candidate while it holds
the block on some tier, or holds it provisionally (counted as GPU). A block whose values
equal the previous block's (sorted entries: equal holder sets give equal bytes) extends a
run: runs are grouped in C (``itertools.groupby``) and the walk visits runs, not blocks.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from itertools import groupby
from typing import Any

from service.index.base import BlockMatch


def _holders(v: bytes | None) -> dict[int, int]:
    if not v:
        return {}
    return {int.from_bytes(v[i:i + 3], "big"): v[i + 3] for i in range(0, len(v), 4)}


def _provisional(pv: bytes | None, now_ms: int) -> set[str]:
    """The workers of a provisional value whose entry has not expired."""
    out: set[str] = set()
    if pv:
        for part in pv.decode().split(";")[1:]:
            wid, _, exp = part.rpartition("|")
            if int(exp) > now_ms:
                out.add(wid)
    return out


def walk(values: Sequence[bytes | None], pvalues: Sequence[bytes | None] | None,
         live: dict[int, str], now_ms: int,
         allowed: Collection[str] | None) -> dict[str, BlockMatch]:
    """Per worker, the consecutive blocks from block 0 it holds (see the module rules)."""
    if not values:
        return {}
    # runs of equal consecutive (holders, provisional holders), grouped in C: a fully
    # indexed prefix is one run, whatever its length
    seq: Iterable[Any] = values if pvalues is None else zip(values, pvalues, strict=True)
    runs = [(key, len(list(group))) for key, group in groupby(seq)]
    v0, pv0 = (runs[0][0], None) if pvalues is None else runs[0][0]
    handle_of = {wid: h for h, wid in live.items()}
    # candidate: worker id -> [handle or -1, counts (blocks, gpu, cpu, disk), last mask]
    cands: dict[str, list[int]] = {}
    for h, m in _holders(v0).items():
        wid = live.get(h)
        if wid is not None and (allowed is None or wid in allowed):
            cands[wid] = [h, 0, 0, 0, 0, m]
    for wid in _provisional(pv0, now_ms):
        if wid not in cands and (allowed is None or wid in allowed):
            cands[wid] = [handle_of.get(wid, -1), 0, 0, 0, 0, 1]
    for c in cands.values():
        _credit(c, runs[0][1])
    done: dict[str, BlockMatch] = {}
    for key, n in runs[1:]:
        if not cands:
            break
        v, pv = (key, None) if pvalues is None else key
        held = _holders(v)
        prov = _provisional(pv, now_ms) if pv else ()
        for wid in list(cands):
            c = cands[wid]
            m = held.get(c[0], 0) or (1 if wid in prov else 0)
            if m:
                c[5] = m
                _credit(c, n)
            else:
                done[wid] = BlockMatch(*c[1:5])
                del cands[wid]
    for wid, c in cands.items():
        done[wid] = BlockMatch(*c[1:5])
    return done


def _credit(c: list[int], times: int) -> None:
    """``times`` more blocks to candidate ``c`` at its last mask."""
    c[1] += times
    c[2 if c[5] & 1 else 3 if c[5] & 2 else 4] += times
