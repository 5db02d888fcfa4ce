"""Rebuild the typed events from what vLLM reports (pure functions; no HTTP here).

vLLM streams each engine step's new tokens as one chunk (``return_token_ids``): the first chunk
holds the target's token from prefill, each later one a verify step's accepted drafts plus the
target's own token. At the end, ``metrics.speculative_decoding.per_step_accepted`` gives the
accepted-draft count of every verify step; it is the source of truth, because vLLM merges the
chunks of several steps when its HTTP side falls behind. vLLM never reports the rejected drafts,
the draft's top-3 or per-step draft/verify times: those parts of a ``Cycle`` stay empty.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..acceptance import AcceptanceCounts
from ..events import Cycle, FallbackDecision


def make_cycle(index: int, emitted: Sequence[int], pieces: Sequence[str], accepted: int, block_size: int,
               anchor: int, anchor_position: int, elapsed_ms: float) -> Cycle:
    """One verify step as vLLM saw it: ``accepted`` leading drafts then (unless the reply was
    cut there) the target's own token. Only the accepted drafts are known, so ``draft_tokens``
    holds those and ``rejected`` is empty; the step's wall time counts as verify time."""
    emitted = tuple(int(t) for t in emitted)
    full = len(emitted) == accepted + 1
    return Cycle(
        index=index, block_size=block_size, anchor=int(anchor), anchor_position=anchor_position,
        draft_tokens=emitted[:accepted], accepted=accepted, bonus=emitted[-1] if full else None,
        emitted=emitted, emitted_pieces=tuple(pieces), rejected=(), rejected_pieces=(), slots=(),
        draft_ms=0.0, verify_ms=float(elapsed_ms), fallback=FallbackDecision(block_size, "fixed"),
        context_length=anchor_position + len(emitted), new_context_features=len(emitted),
    )


def chunk_steps(tokens: int, block_size: int, speculative: bool) -> list[int]:
    """How a chunk of ``tokens`` new tokens splits into steps as far as the stream shows it:
    without speculation every step is one token (exact); with it, one step per chunk, the
    accepted count being ``tokens - 1`` (checked against per_step_accepted at the end)."""
    if not speculative:
        return [0] * tokens
    steps = []
    while tokens > 0:  # more than a block in one chunk: certainly merged; split at full blocks
        take = min(tokens, block_size)
        steps.append(take - 1)
        tokens -= take
    return steps


def acceptance_lengths(new_tokens: int, per_step_accepted: Sequence[int]) -> tuple[int, ...]:
    """τ per verify step from vLLM's per-step accepted counts: accepted + 1 tokens each, the last
    steps cut to the tokens that were actually emitted (a stop token or the length limit)."""
    remaining = new_tokens - 1  # the first token came from prefill
    taus = []
    for accepted in per_step_accepted:
        if remaining <= 0:
            break
        tau = min(int(accepted) + 1, remaining)
        taus.append(tau)
        remaining -= tau
    return tuple(taus)


def per_position_acceptance(per_step_accepted: Sequence[int], per_step_drafted: Sequence[int]) -> tuple[float, ...]:
    """P(slot j accepted | slot j drafted), j = 1.. (the one definition: engine.acceptance)."""
    steps = ((drafted + 1, accepted, accepted + 1) for accepted, drafted in zip(per_step_accepted, per_step_drafted))
    return tuple(AcceptanceCounts.of(steps).per_position_acceptance)


def positions_from_cycles(cycles: Sequence[Cycle]) -> tuple[float, ...]:
    """The same rates from cycles (when no per-step list came: a cancelled or plain reply)."""
    return per_position_acceptance([c.accepted for c in cycles], [c.block_size - 1 for c in cycles])
