"""Next-token choice: greedy argmax, or temperature sampling with a per-request generator."""
from __future__ import annotations

import torch

from worker.engine.sequence import Seq


def sample(logits: torch.Tensor, seqs: list[Seq]) -> list[int]:
    """One token per row of ``logits`` ([len(seqs), vocab], fp32).

    Greedy rows take the argmax (ties go to the lowest id, deterministically). Sampled rows
    use the sequence's own ``torch.Generator`` so a seeded request gives the same tokens
    whatever else shares its batch.
    """
    out = logits.argmax(dim=-1).tolist()
    for row, seq in enumerate(seqs):
        if seq.params.sampled:
            probs = torch.softmax(logits[row].float() / seq.params.temperature, dim=-1)
            out[row] = int(torch.multinomial(probs.cpu(), 1, generator=seq.generator).item())
    return out
