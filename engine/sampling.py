"""Target-side sampling: temperature, top-k, top-p. The draft always proposes its argmax."""

from __future__ import annotations

import torch


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p (nucleus) filtering; last dim = vocab."""
    scores = logits.float() / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        keep = sorted_probs.cumsum(dim=-1) - sorted_probs < top_p
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One sample per row of ``probs`` [n, vocab] -> [n]."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def leading_matches(proposed: list[int], chosen: list[int]) -> int:
    """How many leading proposals equal the target's choices (accept-while-equal)."""
    count = 0
    for p, c in zip(proposed, chosen):
        if p != c:
            break
        count += 1
    return count
