"""Back-to-back repetition in a token sequence: the bench's loop metric and the draft trainer's
loop trimming share this one scan (pure Python, no torch)."""

from __future__ import annotations

from collections.abc import Iterator


def repetitions(tokens: list[int], min_span: int = 8) -> Iterator[tuple[int, int]]:
    """Yield ``(end, covered)`` wherever ``tokens[end - covered:end]`` is back-to-back copies (at
    least two) of one span of >= min_span tokens, at each end such a run reaches."""
    for period in range(1, len(tokens) // 2 + 1):
        span = period * -(-min_span // period)  # the shortest whole-period span of >= min_span tokens
        run = 0
        for i in range(len(tokens) - period):
            run = run + 1 if tokens[i] == tokens[i + period] else 0
            if run + period >= 2 * span:
                yield i + period + 1, run + period


def loop_coverage(tokens: list[int], min_span: int = 8) -> float:
    """Largest fraction of the reply covered by back-to-back repeats of one span of >= min_span
    tokens (0 when there is none)."""
    best = max((covered for _, covered in repetitions(tokens, min_span)), default=0)
    return best / len(tokens) if tokens else 0.0


def is_loop(tokens: list[int]) -> bool:
    return loop_coverage(tokens) > 0.5
