"""Fixtures for the model tests: tiny random HF checkpoints and a hand-driven paged runner."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from tests.worker.hf_models import VOCAB, make_hf_model  # noqa: F401  (re-exported)
from worker.model import AttentionMetadata, LlamaModel, load_model


@pytest.fixture(scope="session")
def hf_pair(tmp_path_factory):
    """``arch -> (hf_model, our_model)``, built lazily once per session."""
    cache: dict[str, tuple] = {}

    def get(arch: str, **overrides):
        key = arch + repr(sorted(overrides.items()))
        if key not in cache:
            path = tmp_path_factory.mktemp(arch)
            hf = make_hf_model(arch, path, **overrides)
            ours, _ = load_model(path, device="cpu", dtype=torch.float32)
            cache[key] = (hf, ours)
        return cache[key]

    return get


@torch.no_grad()
def hf_logits(hf, ids: Sequence[int]) -> torch.Tensor:
    """All-position logits ``[n, vocab]`` of one unpadded prompt."""
    return hf(torch.tensor([list(ids)])).logits[0].float()


class PagedRunner:
    """Drives `LlamaModel` step by step, managing block tables by hand (test stand-in for
    the engine). Blocks are handed out in a shuffled order so tables are non-contiguous."""

    def __init__(self, model: LlamaModel, num_blocks: int = 96, block_size: int = 4, seed: int = 0):
        self.model = model
        self.block_size = block_size
        self.kv_cache = model.allocate_kv_cache(num_blocks, block_size)
        gen = torch.Generator().manual_seed(seed)
        self.free = torch.randperm(num_blocks, generator=gen).tolist()
        self.tables: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}

    def share_prefix(self, sid: str, src: str, num_blocks: int) -> int:
        """Start ``sid`` with the first ``num_blocks`` full blocks of ``src`` (a cache hit);
        returns the number of tokens served from the cache."""
        assert self.computed[src] >= num_blocks * self.block_size
        self.tables[sid] = list(self.tables[src][:num_blocks])
        self.computed[sid] = num_blocks * self.block_size
        return self.computed[sid]

    def step(self, items: Sequence[tuple[str, Sequence[int]]]) -> list[torch.Tensor]:
        """One forward over ``(sid, new_tokens)`` items; returns each item's logits
        ``[n_i, vocab]``."""
        seqs, ids = [], []
        for sid, toks in items:
            table = self.tables.setdefault(sid, [])
            done = self.computed.setdefault(sid, 0)
            while len(table) * self.block_size < done + len(toks):
                table.append(self.free.pop())
            seqs.append((table, done, len(toks)))
            ids.extend(toks)
        meta = AttentionMetadata.build(seqs, self.block_size, self.model.device)
        hidden = self.model(torch.tensor(ids), meta.positions, meta, self.kv_cache)
        logits = self.model.compute_logits(hidden)
        for sid, toks in items:
            self.computed[sid] += len(toks)
        return list(logits.split(meta.query_lens))


@pytest.fixture
def runner():
    return PagedRunner


def prompts(n: int, lengths: Sequence[int], seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (length,), generator=gen).tolist() for length in lengths[:n]]
