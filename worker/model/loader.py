"""Build a `LlamaModel`: the built-in seeded ``tiny`` model or a Hugging Face directory.

A directory must hold ``config.json`` and ``*.safetensors`` weights, either one file or
shards listed by ``model.safetensors.index.json``. HF tensor names
(``model.layers.N.self_attn.q_proj.weight``, ..., ``lm_head.weight``) are mapped onto the
model, q/k/v and gate/up into their fused matrices. Every parameter must be covered: a
missing tensor raises ``KeyError`` naming it; an unsupported architecture raises
``ValueError`` (from `ModelConfig`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import torch
from safetensors import safe_open

from kvmesh.openai import vocab
from worker.model.config import ModelConfig
from worker.model.llama import STACKED, FusedLinear, LlamaModel

log = logging.getLogger(__name__)

TINY = vocab.TINY
TINY_SEED = 0
TINY_INIT_STD = 0.2
# Byte-level vocabulary (kvmesh.openai.vocab): ids 0..255 are bytes, then three specials.
TINY_BOS, TINY_EOS, TINY_PAD = vocab.BOS, vocab.EOS, vocab.PAD
TINY_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": vocab.VOCAB,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": vocab.CONTEXT,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "bos_token_id": TINY_BOS,
    "eos_token_id": TINY_EOS,
    "pad_token_id": TINY_PAD,
}

# Tensors some checkpoints carry that the model recomputes instead.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device, cfg: ModelConfig | None = None) -> torch.dtype:
    """fp32 on CPU; on CUDA the checkpoint's fp16 if it says so, else bf16 where the GPU
    supports it (fp16 otherwise)."""
    if device.type == "cpu":
        return torch.float32
    if cfg is not None and cfg.torch_dtype == "float16":
        return torch.float16
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def load_model(
    path_or_name: str | Path,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[LlamaModel, ModelConfig]:
    """Return ``(model, config)`` in eval mode, without gradients, on ``device``/``dtype``.

    ``"tiny"`` gives the built-in random model: the same weights on every machine (seeded
    CPU generator, fp32 draw, then cast). Anything else must be a HF model directory.
    """
    dev = torch.device(device) if device is not None else default_device()
    if str(path_or_name) == TINY:
        cfg = ModelConfig.from_dict(TINY_CONFIG)
        model = _empty_model(cfg, dev, dtype or default_dtype(dev))
        init_random(model, TINY_SEED, TINY_INIT_STD)
        return model, cfg
    path = Path(path_or_name)
    if not path.is_dir():
        raise FileNotFoundError(f"model {str(path_or_name)!r} is neither 'tiny' nor a directory")
    cfg = ModelConfig.from_file(path)
    if cfg.sliding_window is not None:
        log.warning("sliding_window=%d is not implemented: attention is full, which matches "
                    "the checkpoint only for contexts up to the window", cfg.sliding_window)
    model = _empty_model(cfg, dev, dtype or default_dtype(dev, cfg))
    load_weights(model, path)
    return model, cfg


def _empty_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> LlamaModel:
    # Build on the meta device so no memory is spent on an init that is overwritten anyway.
    with torch.device("meta"):
        model = LlamaModel(cfg)
    model = model.to(dtype).to_empty(device=device)
    model.tie_weights()
    model.eval().requires_grad_(False)
    return model


@torch.no_grad()
def init_random(model: LlamaModel, seed: int, std: float) -> None:
    """Deterministic init: norms 1, biases 0, other weights N(0, std) drawn in fp32 on CPU
    in parameter order, so a seed gives identical weights on any device/dtype."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            param.copy_(torch.empty(param.shape).normal_(0.0, std, generator=gen))


def _shard(root: Path, name: object) -> Path:
    """``root / name`` for a shard ``name`` of the index, confined to ``root``.

    The index is data that travels with downloaded checkpoints: an absolute name, a ``..``
    part or a folder resolving outside ``root`` raises ``ValueError``. The file itself may be
    a symlink (a Hugging Face cache snapshot links its files to ``../../blobs``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"model.safetensors.index.json names shard {name!r}: not a file name")
    rel = PurePosixPath(name.replace("\\", "/"))
    if rel.is_absolute() or PureWindowsPath(name).drive or ".." in rel.parts:
        raise ValueError(f"model.safetensors.index.json names shard {name!r}, outside the "
                         f"model directory {root}: shards must be relative paths inside it")
    file = root / rel
    if not file.parent.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"model.safetensors.index.json names shard {name!r}, whose folder "
                         f"resolves outside the model directory {root}")
    return file


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        with index.open() as f:
            weight_map: dict[str, str] = json.load(f)["weight_map"]
        return [_shard(path, name) for name in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    return files


def _expected_names(model: LlamaModel) -> set[str]:
    """The HF tensor names the model needs (tied lm_head excluded)."""
    unfused: dict[str, list[str]] = {}
    for hf, (fused, _) in STACKED.items():
        unfused.setdefault(fused, []).append(hf)
    names = set()
    for name, _ in model.named_parameters():
        parts = name.split(".")
        for sub in unfused.get(parts[-2], [parts[-2]]):
            full = ".".join([*parts[:-2], sub, parts[-1]])
            names.add(full if full.startswith("lm_head.") else "model." + full)
    return names


@torch.no_grad()
def load_weights(model: LlamaModel, path: Path) -> None:
    """Copy every tensor of the checkpoint at ``path`` into ``model``.

    Raises ``KeyError`` naming missing tensors, ``ValueError`` on a shape mismatch.
    Unknown extra tensors are logged and skipped.
    """
    params = dict(model.named_parameters())
    expected = _expected_names(model)
    loaded: set[str] = set()
    unexpected: list[str] = []
    for file in _weight_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                if key.endswith(_IGNORED_SUFFIXES):
                    continue
                if key not in expected:
                    if not (key == "lm_head.weight" and model.config.tie_word_embeddings):
                        unexpected.append(key)
                    continue
                _copy_tensor(model, params, key, f.get_tensor(key))
                loaded.add(key)
    missing = sorted(expected - loaded)
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        shown = ", ".join(missing[:5]) + more
        raise KeyError(f"checkpoint {path} is missing tensor(s): {shown}")
    if unexpected:
        log.warning("ignored %d unexpected tensor(s), e.g. %r", len(unexpected), unexpected[0])


def _copy_tensor(
    model: LlamaModel, params: dict[str, torch.nn.Parameter], key: str, tensor: torch.Tensor
) -> None:
    name = key.removeprefix("model.") if not key.startswith("lm_head.") else key
    parts = name.split(".")
    if parts[-2] in STACKED:
        fused, index = STACKED[parts[-2]]
        module_name = ".".join([*parts[:-2], fused])
        module = model.get_submodule(module_name)
        assert isinstance(module, FusedLinear)
        dst = module.shard(params[f"{module_name}.{parts[-1]}"].data, index)
    else:
        dst = params[name].data
    if dst.shape != tensor.shape:
        raise ValueError(f"tensor {key}: checkpoint shape {tuple(tensor.shape)}, "
                         f"model expects {tuple(dst.shape)}")
    dst.copy_(tensor)
