"""Loader, config parsing, the built-in tiny model and tokenizers."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from worker.model import (
    TINY_BOS,
    TINY_EOS,
    AttentionMetadata,
    ByteTokenizer,
    HFTokenizer,
    ModelConfig,
    load_model,
    load_tokenizer,
)

from .conftest import PagedRunner, hf_logits, make_hf_model, prompts

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_hf_model("LlamaForCausalLM", path, seed=20)
    return path


def test_missing_tensor_is_named(llama_dir, tmp_path):
    (tmp_path / "config.json").write_text((llama_dir / "config.json").read_text())
    tensors = load_file(llama_dir / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(tmp_path, device="cpu")


def test_shape_mismatch_is_named(llama_dir, tmp_path):
    (tmp_path / "config.json").write_text((llama_dir / "config.json").read_text())
    tensors = load_file(llama_dir / "model.safetensors")
    tensors["model.norm.weight"] = torch.ones(3)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.norm\.weight"):
        load_model(tmp_path, device="cpu")


def test_unknown_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "architectures": ["GPT2LMHead"]}))
    with pytest.raises(ValueError, match="GPT2LMHead.*LlamaForCausalLM"):
        load_model(tmp_path, device="cpu")


def test_not_a_model(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "nope", device="cpu")
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(tmp_path, device="cpu")


def test_sharded_checkpoint(tmp_path):
    hf = make_hf_model("Qwen2ForCausalLM", tmp_path, seed=21)
    hf.save_pretrained(tmp_path, max_shard_size="60KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    ours, cfg = load_model(tmp_path, device="cpu")
    assert cfg.architecture == "Qwen2ForCausalLM" and cfg.attention_bias
    p = prompts(1, [10], seed=22)[0]
    torch.testing.assert_close(PagedRunner(ours).step([("a", p)])[0], hf_logits(hf, p),
                               atol=1e-4, rtol=0)


def test_config_v4_and_v5_rope_layouts_agree():
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    v4 = ModelConfig.from_dict(
        {**BASE, "rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", **scaling}}
    )
    v5 = ModelConfig.from_dict(
        {**BASE, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **scaling}}
    )
    assert v4 == v5 and v4.rope_scaling.rope_type == "llama3" and v4.rope_theta == 5e5
    legacy = ModelConfig.from_dict({**BASE, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert legacy.rope_scaling.rope_type == "linear" and legacy.rope_scaling.factor == 2.0
    with pytest.raises(ValueError, match="yarn"):
        ModelConfig.from_dict({**BASE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


def test_config_fields():
    cfg = ModelConfig.from_dict({**BASE, "eos_token_id": [5, 7], "bos_token_id": 1})
    assert cfg.eos_token_ids == (5, 7) and cfg.head_dim == 16 and cfg.rope_theta == 10000.0
    assert not cfg.attention_bias and not cfg.tie_word_embeddings
    qwen = ModelConfig.from_dict({**BASE, "architectures": ["Qwen2ForCausalLM"]})
    assert qwen.attention_bias and not qwen.o_proj_bias
    assert cfg.kv_cache_bytes_per_block(16, torch.float32) == 2 * 2 * 16 * 32 * 4
    assert ModelConfig.from_dict({**BASE, "sliding_window": 4}).sliding_window == 4
    off = {**BASE, "sliding_window": 4, "use_sliding_window": False}
    assert ModelConfig.from_dict(off).sliding_window is None
    with pytest.raises(ValueError, match="kv heads"):
        ModelConfig.from_dict({**BASE, "num_key_value_heads": 3})


def test_tiny_is_deterministic_and_long_context():
    a, cfg = load_model("tiny", device="cpu")
    b, _ = load_model("tiny", device="cpu")
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert cfg.vocab_size >= 259 and cfg.max_position_embeddings >= 8192
    assert cfg.bos_token_id == TINY_BOS and cfg.eos_token_ids == (TINY_EOS,)
    # A decode step at the last position of the context works.
    block_size, last = 16, cfg.max_position_embeddings - 1
    kv_cache = a.allocate_kv_cache(last // block_size + 1, block_size)
    meta = AttentionMetadata.build([(list(range(last // block_size + 1)), last, 1)], block_size)
    logits = a.compute_logits(a(torch.tensor([65]), meta.positions, meta, kv_cache))
    assert logits.shape == (1, cfg.vocab_size) and torch.isfinite(logits).all()


def test_tiny_bf16_path_runs_on_cpu():
    """The reduced-precision path (meant for CUDA) at least runs and roughly agrees."""
    m32, _ = load_model("tiny", device="cpu", dtype=torch.float32)
    m16, _ = load_model("tiny", device="cpu", dtype=torch.bfloat16)
    assert m16.dtype == torch.bfloat16
    p = ByteTokenizer().encode("the quick brown fox", add_bos=True)
    r16 = PagedRunner(m16, block_size=16)
    assert r16.kv_cache.dtype == torch.bfloat16
    l16 = r16.step([("a", p)])[0][-1]
    l32 = PagedRunner(m32, block_size=16).step([("a", p)])[0][-1]
    assert l16.dtype == torch.float32
    assert torch.corrcoef(torch.stack([l16, l32]))[0, 1] > 0.95


def test_byte_tokenizer():
    tok = load_tokenizer("tiny")
    assert isinstance(tok, ByteTokenizer)
    ids = tok.encode("héllo", add_bos=True)
    assert ids[0] == TINY_BOS and max(ids[1:]) < 256 and len(ids) == 7
    assert tok.decode([*ids, TINY_EOS]) == "héllo"


def test_hf_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "bos_token_id": 1,
                                                      "eos_token_id": 2}))
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, HFTokenizer) and tok.eos_token_id == 2
    assert tok.encode("hello world", add_bos=True) == [1, 3, 4]
    assert tok.decode([3, 4]) == "hello world"
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing")


def _index_dir(llama_dir, tmp_path, shard: str):
    """A model dir whose index maps every tensor to ``shard``; a full, valid checkpoint
    lies at ``tmp_path/outside.safetensors`` (what an escaping index would load)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((llama_dir / "config.json").read_text())
    tensors = load_file(llama_dir / "model.safetensors")
    save_file(tensors, tmp_path / "outside.safetensors")
    index = {"metadata": {}, "weight_map": {k: shard for k in tensors}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    return model


@pytest.mark.parametrize("shard", ["../outside.safetensors", "ABS", "sub/outside.safetensors"])
def test_index_shards_outside_the_model_dir_are_refused(llama_dir, tmp_path, monkeypatch,
                                                        shard):
    """Attack: an index naming ``../x``, an absolute path, or a folder symlinked out of the
    directory made the loader read files from outside ``--model DIR``."""
    import worker.model.loader as loader

    if shard == "ABS":
        shard = str(tmp_path / "outside.safetensors")
    model = _index_dir(llama_dir, tmp_path, shard)
    (model / "sub").symlink_to(tmp_path, target_is_directory=True)
    opened = []
    real = loader.safe_open
    monkeypatch.setattr(loader, "safe_open", lambda f, **kw: opened.append(f) or real(f, **kw))
    with pytest.raises(ValueError, match="outside the model directory"):
        load_model(model, device="cpu")
    assert opened == []  # refused before reading any shard


def test_index_shard_symlinked_file_inside_loads(llama_dir, tmp_path):
    """A Hugging Face cache snapshot links each file to ``../../blobs/<hash>``: allowed."""
    model = _index_dir(llama_dir, tmp_path, "model-00001-of-00001.safetensors")
    (model / "model-00001-of-00001.safetensors").symlink_to(tmp_path / "outside.safetensors")
    load_model(model, device="cpu")
