"""A small model directory for trying kvmesh offline with real clients and benchmark tools.

``python -m tools.tiny_model_dir DIR [--vocab-size 2048] [--seed 0]`` (from the repository
root, with the project's venv) writes a Hugging Face directory that ``kvmesh up --model DIR``
and ``kvmesh gateway --model-dir DIR`` both load, and that ``transformers.AutoTokenizer``
reads, as guidellm, aiperf and inference-perf do to count and make tokens
(``docs/benchmarking.md``). The built-in ``tiny`` model has no tokenizer those tools can
load; this is the same size of model with one.

Contract (the files written, nothing else; an existing DIR is overwritten file by file):

- ``tokenizer.json``: a byte-level BPE (GPT-2's scheme: every byte has a token, so any text
  encodes) of ``vocab_size`` tokens, merges trained on this repository's README and docs;
  ``<s>`` (id 0), ``</s>`` (1) and ``<pad>`` (2); ``<s>`` starts every encoded prompt.
- ``tokenizer_config.json``: ``PreTrainedTokenizerFast`` with those special tokens. No chat
  template: the gateway renders chats with its own (docs/gateway.md), so benchmarks use the
  completions API, whose prompt tokens both sides count alike.
- ``config.json``: a ``LlamaForCausalLM`` with the layer sizes of ``tiny``
  (``worker.model.loader.TINY_CONFIG``) and the tokenizer's vocabulary and special ids.
- ``model.safetensors``: random fp32 weights, normal with std 0.2 drawn from ``seed`` (norms
  1): the same DIR for the same arguments and docs. The output is noise; what it is for is
  timing, routing and caching, which do not depend on the weights' values.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SPECIALS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2: the trainer puts them first
INIT_STD = 0.2


def corpus() -> list[str]:
    """The text the merges are learned from: this repository's README and docs."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [f.read_text(encoding="utf-8") for f in files if f.is_file()]


def write_tokenizer(out: Path, vocab_size: int) -> int:
    """``tokenizer.json`` and ``tokenizer_config.json``; returns the vocabulary's size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "eos_token": "</s>", "pad_token": "<pad>", "model_max_length": 8192}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return tok.get_vocab_size()


def model_config(vocab: int) -> dict:
    """``tiny``'s config with this vocabulary and the tokenizer's special ids."""
    from worker.model.loader import TINY_CONFIG

    ids = {name: SPECIALS.index(tok) for name, tok in
           (("bos_token_id", "<s>"), ("eos_token_id", "</s>"), ("pad_token_id", "<pad>"))}
    return {**TINY_CONFIG, "vocab_size": vocab, **ids, "torch_dtype": "float32"}


def weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    """Random Llama weights in Hugging Face's tensor names, in a fixed order."""
    rng = np.random.default_rng(seed)
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                   p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                   p + "mlp.down_proj.weight": (h, inter)}
    shapes |= {"model.norm.weight": (h,), "lm_head.weight": (cfg["vocab_size"], h)}
    return {name: (np.ones(shape, np.float32) if name.endswith("norm.weight")
                   else rng.normal(0.0, INIT_STD, shape).astype(np.float32))
            for name, shape in shapes.items()}


def write_model_dir(out: Path, vocab_size: int = 2048, seed: int = 0) -> Path:
    """Write the directory (see the module contract); returns ``out``."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    cfg = model_config(write_tokenizer(out, vocab_size))
    (out / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    save_file(weights(cfg, seed), str(out / "model.safetensors"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="directory to write")
    parser.add_argument("--vocab-size", type=int, default=2048,
                        help="BPE vocabulary, special tokens and 256 bytes included")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args()
    out = write_model_dir(args.dir, args.vocab_size, args.seed)
    print(f"wrote {out}: kvmesh up --model {out}; kvmesh gateway --model-dir {out}")


if __name__ == "__main__":
    main()
