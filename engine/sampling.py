"""Sampling: temperature, top-k, top-p, and speculative sampling over one drafted block.

At T > 0 a cycle is standard speculative sampling (lossless for ANY proposal distribution q):
draft token x_j ~ q_j; slot j is accepted with probability min(1, p_j(x_j) / q_j(x_j)); at the
first rejection one token is drawn from norm(max(0, p_j - q_j)); after a full block the bonus
is drawn from p. ``q`` is the draft's own distribution at the request's temperature/top-p/top-k
(proposal "sample"), or one-hot at the draft's argmax (proposal "argmax": accept with
probability p_j(x_j); the residual is p_j without x_j).
"""

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


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> list[int]:
    """One token per row of ``probs`` [n, vocab]."""
    return sample(probs, generator).tolist() if probs.shape[0] else []


def speculative_accept(drafts: list[int], q: torch.Tensor | None, p: torch.Tensor,
                       generator: torch.Generator | None) -> tuple[int, int]:
    """(accepted, next token) for one block: ``drafts[j]`` was drawn from ``q[j]`` (``None``:
    one-hot at ``drafts[j]``); ``p`` [len(drafts) + 1, vocab] holds the target's probabilities,
    row j for the token after [anchor, drafts[:j]]. The next token is drawn from the residual
    at the first rejection, or from ``p[-1]`` (the bonus) when every draft is accepted."""
    n = len(drafts)
    if n:
        index = torch.tensor(drafts, device=p.device)[:, None]
        p_drafted = p[:n].gather(-1, index)[:, 0]
        q_drafted = q.gather(-1, index)[:, 0] if q is not None else torch.ones_like(p_drafted)
        u = torch.rand(n, generator=generator, device=p.device)
        # accept with probability min(1, p/q): u < p/q, written without a division
        rejected = (u * q_drafted >= p_drafted).nonzero()
        accepted = int(rejected[0, 0]) if rejected.numel() else n
    else:
        accepted = 0
    if accepted == n:
        return n, draw(p[n:n + 1], generator)[0]
    q_row = q[accepted] if q is not None else torch.zeros_like(p[accepted]).index_fill_(0, index[accepted], 1.0)
    residual = (p[accepted] - q_row).clamp_min(0)
    if float(residual.sum()) <= 0:  # p == q exactly: rejection cannot happen; guard the division
        residual = p[accepted]
    return accepted, draw((residual / residual.sum())[None], generator)[0]
