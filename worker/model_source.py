"""What ``--model`` may name, checked before anything loads (no torch: launchers call it).

Contract: :func:`check_model_source` accepts ``tiny`` (the built-in random model) and a
directory that ``worker.model.loader`` can start loading: readable, holding a readable JSON
``config.json`` and safetensors weights (``*.safetensors`` or a
``model.safetensors.index.json``). Anything else raises ``ValueError`` with one line that
says what is wrong, so a launcher refuses it at once instead of starting Redis, the service
and N workers that each die loading it. The loader still checks the weights themselves
(tensor names, shapes, shard paths): this is the cheap part that a user gets wrong.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from kvmesh.openai.vocab import TINY


def check_model_source(source: str) -> None:
    """Raise ``ValueError`` unless ``source`` is ``tiny`` or a loadable model directory."""
    if source == TINY:
        return
    path = Path(source)
    if not path.exists():
        raise ValueError(f"no such directory (give '{TINY}' or a Hugging Face model directory)")
    if not path.is_dir():
        raise ValueError("not a directory (give a Hugging Face model directory: config.json "
                         "+ *.safetensors)")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ValueError("cannot read the directory (permission denied)")
    config = path / "config.json"
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError("no config.json: not a Hugging Face model directory") from None
    except OSError as e:
        raise ValueError(f"cannot read config.json ({e.strerror or e})") from None
    except ValueError as e:
        raise ValueError(f"config.json is not JSON ({e})") from None
    weights = [*path.glob("*.safetensors"), path / "model.safetensors.index.json"]
    if not any(f.is_file() for f in weights):
        raise ValueError("no *.safetensors weights")
    unreadable = [f.name for f in weights if f.is_file() and not os.access(f, os.R_OK)]
    if unreadable:
        raise ValueError(f"cannot read {unreadable[0]} (permission denied)")
