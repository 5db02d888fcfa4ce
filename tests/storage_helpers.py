"""Shared helpers for the storage tests: engine-shaped cycle dicts and a deterministic clock.

Cycles are built with the engine's own ``Cycle`` dataclass and ``event_to_dict`` (plain
dataclasses, no torch), so the storage tests break if the engine's dict shape drifts away from
what storage expects.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from engine.events import Cycle, DraftSlot, FallbackDecision, event_to_dict


def make_cycle(index: int, block_size: int = 8, accepted: int = 3, *, cut: bool = False,
               fallback_state: str = "full", changed: bool = False, next_block_size: int | None = None) -> dict:
    """The JSON form of a real engine ``Cycle``: ``accepted`` leading drafts confirmed, then a bonus.

    ``cut`` ends the cycle at a stop token before the bonus (tau = accepted, bonus None).
    """
    assert 0 <= accepted <= block_size - 1
    drafts = tuple(100 * index + j for j in range(1, block_size))
    targets = drafts[:accepted] + tuple(900 + index + j for j in range(accepted, block_size - 1))
    bonus = None if cut else targets[accepted] if accepted < block_size - 1 else 7000 + index
    emitted = drafts[:accepted] + (() if bonus is None else (bonus,))
    slots = tuple(
        DraftSlot(
            token=drafts[j], text=f"d{drafts[j]}", draft_top=((drafts[j], f"d{drafts[j]}", 0.75), (1, "x", 0.125)),
            target_prob=0.5 + 0.0625 * (j % 4), target_token=targets[j],
            verdict="accepted" if j < accepted else "rejected" if j == accepted else "unverified",
        )
        for j in range(block_size - 1)
    )
    cycle = Cycle(
        index=index, block_size=block_size, anchor=50 + index, anchor_position=10 + 4 * index,
        draft_tokens=drafts, accepted=accepted, bonus=bonus, emitted=emitted,
        emitted_pieces=tuple(f"«{token}»" for token in emitted),
        rejected=drafts[accepted:], rejected_pieces=tuple(f"d{token}" for token in drafts[accepted:]),
        slots=slots, draft_ms=1.5 + index * 0.25, verify_ms=10.0 + index * 0.5,
        fallback=FallbackDecision(
            next_block_size=next_block_size or block_size, state=fallback_state, changed=changed,
            reason="τ 2.1 over the last 8 cycles" if changed else "",
        ),
        context_length=20 + 4 * index, new_context_features=accepted + 1,
    )
    return json.loads(json.dumps(event_to_dict(cycle)))  # tuples become lists, as after any JSON


def expected_reply_text(cycles: int) -> str:
    """The text the crash-test writer has produced after ``cycles`` cycles."""
    return "".join(f"token{i} " for i in range(1, cycles + 1))


class FakeClock:
    """``now`` for SessionStore: one second later on every call, so whole rows are predictable."""

    def __init__(self, start: datetime = datetime(2026, 1, 1, tzinfo=timezone.utc)):
        self.calls = 0
        self.start = start

    def __call__(self) -> str:
        self.calls += 1
        return self.at(self.calls)

    def at(self, call: int) -> str:
        return (self.start + timedelta(seconds=call)).isoformat(timespec="microseconds")
