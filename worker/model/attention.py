"""Paged attention: per-step metadata and the attention op over a block-paged KV cache.

Per layer, K and V caches are ``[num_blocks, block_size, kv_heads, head_dim]``; token ``p``
of a sequence lives at slot ``table[p // block_size] * block_size + p % block_size``.
`AttentionMetadata.build` runs once per step; every layer's `paged_attention` writes the new
K/V, batches all decodes in one SDPA call, and attends prefills one by one with a
bottom-right-aligned causal mask. GQA without repeating K/V.

See docs/architecture.md#worker-engine-and-model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class DecodeGroup:
    """Sequences with one new token, attended together.

    ``token_idx`` ``[D]`` indexes the flattened batch (None when every sequence of the step
    is a decode, in order). ``block_tables`` ``[D, max_blocks]`` is padded with block 0;
    contexts are gathered up to ``max_len`` (the longest) and ``mask`` ``[D, 1, 1, max_len]``
    is True on real context positions (None when all contexts have the same length).
    """

    token_idx: torch.Tensor | None
    block_tables: torch.Tensor
    max_len: int
    mask: torch.Tensor | None
    _bias: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False)

    def bias(self, dtype: torch.dtype) -> torch.Tensor | None:
        """``mask`` as an additive bias (0 / -inf) in ``dtype``, made once per step."""
        return None if self.mask is None else _additive(self.mask, dtype, self._bias)


@dataclass
class PrefillSeq:
    """One sequence with several new tokens: ``start:end`` in the flattened batch.

    ``blocks`` holds the block ids covering its ``context_len`` tokens and ``mask`` the
    ``[n, context_len]`` bottom-right causal mask; both are None when nothing is cached yet
    (then ``context_len == end - start``).
    """

    start: int
    end: int
    context_len: int
    blocks: torch.Tensor | None
    mask: torch.Tensor | None
    _bias: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False)

    def bias(self, dtype: torch.dtype) -> torch.Tensor:
        """``mask`` as an additive bias (0 / -inf) in ``dtype``, made once per step."""
        assert self.mask is not None
        return _additive(self.mask, dtype, self._bias)


def _additive(mask: torch.Tensor, dtype: torch.dtype, memo: dict) -> torch.Tensor:
    # SDPA would convert a boolean mask in every layer's call; converting once is cheaper.
    if dtype not in memo:
        memo[dtype] = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            ~mask, float("-inf")
        )
    return memo[dtype]


@dataclass
class AttentionMetadata:
    """Everything attention needs for one step, built once and shared by all layers.

    Tensors (on the model's device): ``positions`` ``[T]``, ``slot_mapping`` ``[T]``,
    ``block_tables`` ``[S, max_blocks]`` (padded with 0, trimmed to the blocks the context
    needs), ``seq_lens`` ``[S]`` (context including the new tokens), ``query_start_loc``
    ``[S + 1]`` and ``last_token_indices`` ``[S]`` (each sequence's last new token in the
    flattened batch: where to compute logits). Host-side ``query_lens`` / ``seq_lens_cpu``
    and ``max_seq_len`` let the model run without device syncs.
    """

    block_size: int
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    last_token_indices: torch.Tensor
    query_lens: list[int]
    seq_lens_cpu: list[int]
    max_seq_len: int
    decode: DecodeGroup | None
    prefills: list[PrefillSeq]

    @property
    def num_tokens(self) -> int:
        """``T``, the number of new tokens in the step."""
        return sum(self.query_lens)

    @classmethod
    def build(
        cls,
        seqs: Sequence[tuple[Sequence[int], int, int]],
        block_size: int,
        device: torch.device | str | None = None,
    ) -> AttentionMetadata:
        """Build the step's metadata.

        ``seqs`` lists, in the order their tokens appear in the flattened ``input_ids``,
        ``(block_table, num_computed_tokens, num_new_tokens)`` per sequence:
        ``block_table`` the ids of the blocks holding the sequence's tokens in order (it must
        already include the blocks the new tokens go to), ``num_computed_tokens`` how many
        leading tokens already have K/V in the cache (cache hit + earlier chunks/steps), and
        ``num_new_tokens >= 1`` how many follow in this step. Raises ``ValueError`` when a
        table is too short or a count is invalid.

        Typical engine step::

            meta = AttentionMetadata.build(seqs, block_size, device)
            hidden = model(input_ids, meta.positions, meta, kv_cache)
            logits = model.compute_logits(hidden[meta.last_token_indices])  # [S, vocab]
        """
        if not seqs:
            raise ValueError("a step needs at least one sequence")
        # Plain Python lists, then one host->device copy per field: per-sequence torch ops
        # would cost more than the arithmetic for the usual decode-heavy steps.
        positions: list[int] = []
        slots: list[int] = []
        tables: list[list[int]] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        for i, (table, computed, new) in enumerate(seqs):
            total = computed + new
            if new < 1 or computed < 0:
                raise ValueError(f"seq {i}: invalid counts computed={computed} new={new}")
            need = -(-total // block_size)
            if len(table) < need:
                raise ValueError(
                    f"seq {i}: {total} tokens need {need} blocks, block table has {len(table)}"
                )
            tab = list(table[:need])
            positions.extend(range(computed, total))
            slots.extend(tab[p // block_size] * block_size + p % block_size
                         for p in range(computed, total))
            tables.append(tab)
            query_lens.append(new)
            seq_lens.append(total)
        max_blocks = max(len(t) for t in tables)
        table_pad = [t + [0] * (max_blocks - len(t)) for t in tables]
        qsl = [0]
        for n in query_lens:
            qsl.append(qsl[-1] + n)

        dev = torch.device(device) if device is not None else torch.device("cpu")
        block_tables = torch.tensor(table_pad, dtype=torch.long, device=dev)
        seq_lens_t = torch.tensor(seq_lens, dtype=torch.long, device=dev)
        qsl_t = torch.tensor(qsl, dtype=torch.long, device=dev)
        decode_rows = [i for i, n in enumerate(query_lens) if n == 1]
        decode = _decode_group(decode_rows, qsl, block_tables, seq_lens, block_size, dev)
        prefills = [
            _prefill_seq(qsl[i], qsl[i + 1], seq_lens[i], tables[i], dev)
            for i, n in enumerate(query_lens)
            if n > 1
        ]
        return cls(
            block_size=block_size,
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            block_tables=block_tables,
            seq_lens=seq_lens_t,
            query_start_loc=qsl_t,
            last_token_indices=qsl_t[1:] - 1,
            query_lens=query_lens,
            seq_lens_cpu=seq_lens,
            max_seq_len=max(seq_lens),
            decode=decode,
            prefills=prefills,
        )


def _decode_group(
    rows: list[int],
    qsl: list[int],
    block_tables: torch.Tensor,
    seq_lens: list[int],
    block_size: int,
    dev: torch.device,
) -> DecodeGroup | None:
    if not rows:
        return None
    all_decode = len(rows) == block_tables.shape[0]
    lens = [seq_lens[i] for i in rows]
    width = -(-max(lens) // block_size)
    if all_decode:
        tables, token_idx = block_tables[:, :width], None
    else:
        row_t = torch.tensor(rows, dtype=torch.long, device=dev)
        tables = block_tables.index_select(0, row_t)[:, :width]
        token_idx = torch.tensor([qsl[i] for i in rows], dtype=torch.long, device=dev)
    max_len = max(lens)
    mask = None
    if min(lens) != max_len:
        lens_t = torch.tensor(lens, dtype=torch.long, device=dev)
        mask = (torch.arange(max_len, device=dev)[None, :] < lens_t[:, None])[:, None, None, :]
    return DecodeGroup(token_idx, tables.contiguous(), max_len, mask)


def _prefill_seq(
    start: int, end: int, context_len: int, table: list[int], dev: torch.device
) -> PrefillSeq:
    n = end - start
    if context_len == n:
        return PrefillSeq(start, end, context_len, None, None)
    q_pos = torch.arange(n, device=dev)[:, None] + (context_len - n)
    mask = torch.arange(context_len, device=dev)[None, :] <= q_pos
    blocks = torch.tensor(table, dtype=torch.long, device=dev)
    return PrefillSeq(start, end, context_len, blocks, mask)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store new ``k``/``v`` ``[T, kv_heads, head_dim]`` at ``slot_mapping`` ``[T]``.

    The caches must be contiguous (``view`` raises otherwise, so a write can never land in a
    temporary copy).
    """
    kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _gather(cache: torch.Tensor, blocks: torch.Tensor, length: int | None = None) -> torch.Tensor:
    """Context of ``blocks`` (``[nb]`` or ``[D, nb]``) as ``[(D,) kv_heads, L, head_dim]``,
    ``L = nb * block_size`` or ``length``. ``index_select`` on the flat block list is much
    faster than advanced indexing with a 2-D index."""
    g = cache.index_select(0, blocks.reshape(-1))  # [D * nb, block_size, kv_heads, head_dim]
    g = g.view(*blocks.shape[:-1], -1, *cache.shape[-2:])  # [(D,) nb * block_size, kvh, hd]
    if length is not None:
        g = g[..., :length, :, :]
    return g.transpose(-3, -2)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of the step's new tokens over their whole (paged) context.

    ``q`` ``[T, heads, head_dim]``, ``k``/``v`` ``[T, kv_heads, head_dim]`` (already rotated);
    returns ``[T, heads, head_dim]``. Writes ``k``/``v`` into the caches as a side effect.
    """
    write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    dec = meta.decode
    if dec is None and len(meta.prefills) == 1:
        return _prefill(q, k, v, k_cache, v_cache, meta.prefills[0], scale)
    out = torch.empty_like(q)
    if dec is not None:
        qd = q if dec.token_idx is None else q.index_select(0, dec.token_idx)
        res = F.scaled_dot_product_attention(
            qd.unsqueeze(2),  # [D, heads, 1, head_dim]
            _gather(k_cache, dec.block_tables, dec.max_len).to(q.dtype),
            _gather(v_cache, dec.block_tables, dec.max_len).to(q.dtype),
            attn_mask=dec.bias(q.dtype),
            scale=scale,
            enable_gqa=True,
        ).squeeze(2)
        if dec.token_idx is None:
            return res
        out.index_copy_(0, dec.token_idx, res)
    for p in meta.prefills:
        out[p.start : p.end] = _prefill(q, k, v, k_cache, v_cache, p, scale)
    return out


def _prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    p: PrefillSeq,
    scale: float | None,
) -> torch.Tensor:
    """Attention of one sequence's ``n`` new tokens; returns ``[n, heads, head_dim]``."""
    qs = q[p.start : p.end].transpose(0, 1).unsqueeze(0)  # [1, heads, n, head_dim]
    if p.blocks is None:  # nothing cached: the fresh K/V are the whole context
        ks = k[p.start : p.end].transpose(0, 1).unsqueeze(0)
        vs = v[p.start : p.end].transpose(0, 1).unsqueeze(0)
        res = F.scaled_dot_product_attention(
            qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True
        )
    else:
        ks = _gather(k_cache, p.blocks, p.context_len).unsqueeze(0).to(q.dtype)
        vs = _gather(v_cache, p.blocks, p.context_len).unsqueeze(0).to(q.dtype)
        res = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=p.bias(q.dtype), scale=scale, enable_gqa=True
        )
    return res[0].transpose(0, 1)
