"""Our paged model against `transformers` on the same random checkpoints (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from worker.model import ModelConfig, load_model
from worker.model.rope import inverse_frequencies

from .conftest import PagedRunner, hf_logits, make_hf_model, prompts

ARCHS = ["LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"]
TOL = 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_full_forward_logits_match(hf_pair, arch):
    """One flattened step over prompts of different lengths == HF forward of each prompt."""
    hf, ours = hf_pair(arch)
    batch = prompts(4, [5, 17, 1, 33], seed=1)
    run = PagedRunner(ours)
    got = run.step([(f"s{i}", p) for i, p in enumerate(batch)])
    for p, logits in zip(batch, got, strict=True):
        torch.testing.assert_close(logits, hf_logits(hf, p), atol=TOL, rtol=0)


def test_tied_embeddings_qwen2(hf_pair):
    hf, ours = hf_pair("Qwen2ForCausalLM", tie_word_embeddings=True)
    assert ours.lm_head.weight is ours.embed_tokens.weight
    p = prompts(1, [12], seed=2)[0]
    torch.testing.assert_close(PagedRunner(ours).step([("a", p)])[0], hf_logits(hf, p),
                               atol=TOL, rtol=0)


def _greedy_hf(hf, prompt: list[int], max_new: int) -> list[int]:
    out = hf.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=max_new,
        do_sample=False,
        pad_token_id=0,
    )
    return out[0, len(prompt):].tolist()


def _greedy_ours(run: PagedRunner, batch: dict[str, list[int]], max_new: int, eos: int,
                 cached: dict[str, tuple[str, int]] | None = None) -> dict[str, list[int]]:
    """Batched greedy: prefill every prompt in one step (``cached`` sequences start from
    another sequence's blocks and prefill only their suffix), then batched decode steps."""
    cached = cached or {}
    items = []
    for sid, prompt in batch.items():
        skip = run.share_prefix(sid, *cached[sid]) if sid in cached else 0
        items.append((sid, prompt[skip:]))
    logits = run.step(items)
    nxt = {sid: int(lg[-1].argmax()) for (sid, _), lg in zip(items, logits, strict=True)}
    out: dict[str, list[int]] = {sid: [t] for sid, t in nxt.items()}
    for _ in range(max_new - 1):
        live = [sid for sid in batch if out[sid][-1] != eos and len(out[sid]) < max_new]
        if not live:
            break
        logits = run.step([(sid, [out[sid][-1]]) for sid in live])
        for sid, lg in zip(live, logits, strict=True):
            out[sid].append(int(lg[-1].argmax()))
    return out


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_greedy_matches_hf_generate(hf_pair, arch):
    """Greedy decode of a batch (fresh prompts and one whose prefix comes from the cache)
    equals HF ``generate(do_sample=False)`` token for token."""
    hf, ours = hf_pair(arch)
    max_new = 12
    base = prompts(3, [9, 22, 14], seed=3)
    run = PagedRunner(ours)
    # Warm the cache with a shared prefix of 12 tokens (3 blocks of 4), then ask for a prompt
    # that continues it in the same batch as two fresh prompts.
    shared = base[1][:12]
    run.step([("warm", shared)])
    batch = {"a": base[0], "b": base[1], "c": base[2], "hit": shared + base[2][:7]}
    got = _greedy_ours(run, batch, max_new, eos=2, cached={"hit": ("warm", 3)})
    for sid, prompt in batch.items():
        assert got[sid] == _greedy_hf(hf, prompt, max_new)[: len(got[sid])], sid
        assert len(got[sid]) == max_new or got[sid][-1] == 2


def test_llama3_rope_scaling_matches_hf(tmp_path):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    hf = make_hf_model("LlamaForCausalLM", tmp_path, seed=4, rope_parameters=rope)
    ours, cfg = load_model(tmp_path, device="cpu", dtype=torch.float32)
    assert cfg.rope_scaling.rope_type == "llama3" and cfg.rope_theta == 500000.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf.config, "cpu")
    got = inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    torch.testing.assert_close(got, want.float(), atol=0, rtol=0)
    plain = ModelConfig.from_dict({**hf.config.to_dict(), "rope_parameters": None})
    assert not torch.equal(got, inverse_frequencies(cfg.head_dim, 500000.0, plain.rope_scaling))
    p = prompts(1, [150], seed=5)[0]  # well past original_max_position_embeddings
    torch.testing.assert_close(PagedRunner(ours, num_blocks=64).step([("a", p)])[0],
                               hf_logits(hf, p), atol=TOL, rtol=0)
