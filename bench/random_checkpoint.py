"""A seeded random model of ``bench.recompute.MODELS`` as a Hugging Face checkpoint directory,
so that real worker processes (``--model DIR``) can serve it (``kvmesh bench e2e --model
8-layer``): the tiny model recomputes a block so fast that moving it rarely pays, the
8-layer one is where a peer fetch can.

The weights are drawn as ``worker.model.loader.init_random`` draws tiny's (norms 1, the rest
N(0, 0.2), a fixed seed), in Hugging Face's tensor names; the directory is written once
under ``root/<name>`` and reused (a ``config.json`` there means it is complete).
"""
from __future__ import annotations

from pathlib import Path

from bench.recompute import MODELS

SEED = 0
STD = 0.2


def checkpoint(name: str, root: Path) -> Path:
    """The directory of model ``name`` (a key of ``MODELS``) under ``root``, written if
    absent. ``ValueError`` for an unknown name."""
    if name not in MODELS:
        raise ValueError(f"unknown random model {name!r}; one of {', '.join(MODELS)}")
    path = root / name
    if (path / "config.json").is_file():
        return path
    import torch
    import transformers

    cfg = {k: v for k, v in MODELS[name].items() if k != "architectures"}
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if pname.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.empty(param.shape).normal_(0.0, STD, generator=gen))
    tmp = root / f".{name}.partial"
    model.save_pretrained(tmp, safe_serialization=True)
    tmp.rename(path)  # complete or absent: a crash leaves only the partial directory
    return path
