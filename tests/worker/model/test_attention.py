"""Paged-cache behaviour: prefix hits, chunked prefill, batched decode, mixed steps."""

from __future__ import annotations

import pytest
import torch

from worker.model import AttentionMetadata

from .conftest import PagedRunner, hf_logits, prompts

TOL = 1e-4
ARCH = "LlamaForCausalLM"


@pytest.mark.parametrize(("prompt_len", "hit_blocks", "src_len"), [
    (23, 3, 12),  # suffix of 11 tokens after 3 cached blocks
    (23, 4, 21),  # source ran past the shared blocks (partial block not shared)
    (17, 4, 16),  # everything but the last token cached: a 1-token "prefill"
])
@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_prefix_hit_computes_only_suffix(hf_pair, arch, prompt_len, hit_blocks, src_len):
    """Prefill of the uncached suffix, attending to blocks another sequence wrote, gives
    the same logits as a full forward."""
    hf, ours = hf_pair(arch)
    prompt = prompts(1, [prompt_len], seed=10)[0]
    run = PagedRunner(ours)
    run.step([("src", prompt[:src_len])])
    skip = run.share_prefix("dst", "src", hit_blocks)
    suffix = prompt[skip:]
    (got,) = run.step([("dst", suffix)])
    assert got.shape[0] == len(suffix)
    assert run.tables["dst"][:hit_blocks] == run.tables["src"][:hit_blocks]
    want = hf_logits(hf, prompt)
    torch.testing.assert_close(got, want[skip:], atol=TOL, rtol=0)
    (full,) = PagedRunner(ours, seed=1).step([("x", prompt)])
    torch.testing.assert_close(got[-1], full[-1], atol=TOL, rtol=0)


@pytest.mark.parametrize("chunks", [[11, 8, 11], [4, 26], [15, 15]])
def test_chunked_prefill_equals_one_shot(hf_pair, chunks):
    hf, ours = hf_pair(ARCH)
    prompt = prompts(1, [sum(chunks)], seed=11)[0]
    run = PagedRunner(ours)
    parts, start = [], 0
    for n in chunks:
        parts.append(run.step([("a", prompt[start : start + n])])[0])
        start += n
    torch.testing.assert_close(torch.cat(parts), hf_logits(hf, prompt), atol=TOL, rtol=0)


def test_batched_decode_equals_one_by_one(hf_pair):
    _, ours = hf_pair(ARCH)
    lengths = [3, 10, 17, 29]
    batch = prompts(4, lengths, seed=12)
    feed = prompts(4, [6] * 4, seed=13)  # fixed decode inputs, so runs cannot diverge
    together, alone = PagedRunner(ours, seed=2), PagedRunner(ours, seed=3)
    for i, p in enumerate(batch):
        together.step([(f"s{i}", p)])
        alone.step([(f"s{i}", p)])
    for t in range(6):
        got = together.step([(f"s{i}", [feed[i][t]]) for i in range(4)])
        for i in range(4):
            (want,) = alone.step([(f"s{i}", [feed[i][t]])])
            torch.testing.assert_close(got[i], want, atol=1e-5, rtol=0)


def test_mixed_step_decode_and_prefill(hf_pair):
    """Decodes interleaved with a fresh prefill and a chunk continuation in one step."""
    hf, ours = hf_pair(ARCH)
    p0, p1, p2, p3 = prompts(4, [7, 13, 9, 20], seed=14)
    run = PagedRunner(ours)
    run.step([("d0", p0[:-1]), ("d1", p1[:-1]), ("c", p3[:8])])
    got = run.step([("d0", p0[-1:]), ("new", p2), ("d1", p1[-1:]), ("c", p3[8:])])
    torch.testing.assert_close(got[0], hf_logits(hf, p0)[-1:], atol=TOL, rtol=0)
    torch.testing.assert_close(got[1], hf_logits(hf, p2), atol=TOL, rtol=0)
    torch.testing.assert_close(got[2], hf_logits(hf, p1)[-1:], atol=TOL, rtol=0)
    torch.testing.assert_close(got[3], hf_logits(hf, p3)[8:], atol=TOL, rtol=0)


def test_metadata_slots_and_masks():
    meta = AttentionMetadata.build([([7, 2, 9], 5, 3), ([4], 2, 1), ([5, 6], 0, 6)], 4)
    assert meta.positions.tolist() == [5, 6, 7, 2, 0, 1, 2, 3, 4, 5]
    # seq 0 positions 5..7 live in block 2 (offsets 1..3); seq 1 position 2 in block 4.
    assert meta.slot_mapping.tolist() == [9, 10, 11, 18, 20, 21, 22, 23, 24, 25]
    assert meta.seq_lens.tolist() == [8, 3, 6]
    assert meta.query_start_loc.tolist() == [0, 3, 4, 10]
    assert meta.last_token_indices.tolist() == [2, 3, 9]
    assert meta.block_tables.tolist() == [[7, 2], [4, 0], [5, 6]]  # trimmed, padded with 0
    assert meta.decode is not None and meta.decode.token_idx.tolist() == [3]
    assert meta.decode.mask is None and meta.decode.max_len == 3  # one decode: no padding
    first, last = meta.prefills
    assert last.blocks is None and last.mask is None  # nothing cached: plain causal
    # Bottom-right alignment: query i of 3 new tokens in a context of 8 sees <= 5 + i.
    assert first.mask.sum(1).tolist() == [6, 7, 8]
    assert first.mask[0].tolist() == [True] * 6 + [False] * 2


def test_metadata_decode_padding_mask():
    meta = AttentionMetadata.build([([1, 2], 5, 1), ([3], 2, 1), ([4, 5], 7, 1)], 4)
    dec = meta.decode
    assert dec is not None and dec.token_idx is None and dec.max_len == 8
    assert dec.mask[:, 0, 0].sum(1).tolist() == [6, 3, 8]
    assert dec.bias(torch.float32)[1, 0, 0].tolist() == [0.0] * 3 + [float("-inf")] * 5


def test_metadata_rejects_bad_input():
    with pytest.raises(ValueError, match="blocks"):
        AttentionMetadata.build([([0], 3, 2)], 4)
    with pytest.raises(ValueError, match="invalid"):
        AttentionMetadata.build([([0], 0, 0)], 4)
    with pytest.raises(ValueError):
        AttentionMetadata.build([], 4)


def test_all_decode_step_uses_one_batched_call(hf_pair, monkeypatch):
    """An all-decode step issues a single attention call per layer."""
    import worker.model.attention as attention

    _, ours = hf_pair(ARCH)
    run = PagedRunner(ours)
    batch = prompts(3, [5, 9, 14], seed=15)
    run.step([(f"s{i}", p) for i, p in enumerate(batch)])
    calls = []
    real = attention.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    run.step([(f"s{i}", [5]) for i in range(3)])
    assert len(calls) == ours.config.num_hidden_layers
    assert all(shape[0] == 3 for shape in calls)
