"""How often the draft was right, counted over cycles: the one definition of per-position
acceptance and of the τ histogram, used by the decode loop's ``Finished``, the benchmark, the
UI's live figures and its session analytics (pure Python, no torch).

Slot j (1-based) of a cycle was *drafted* when ``block_size - 1 >= j`` and *accepted* when
``accepted >= j``; per-position acceptance is P(accepted | drafted) for j = 1, 2, ... as long as
some cycle drafted slot j. τ is the number of tokens a cycle emitted (accepted + 1, fewer when a
stop token cut it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class AcceptanceCounts:
    """Counts over cycles, added one at a time (live) or all at once (``of``)."""

    cycles: int = 0
    tau_histogram: dict[int, int] = field(default_factory=dict)
    position_accepted: list[int] = field(default_factory=list)  # per slot j: cycles with accepted >= j
    position_drafted: list[int] = field(default_factory=list)  # per slot j: cycles with block size - 1 >= j

    def add(self, block_size: int, accepted: int, tau: int) -> None:
        self.cycles += 1
        self.tau_histogram[tau] = self.tau_histogram.get(tau, 0) + 1
        for j in range(1, block_size):
            while len(self.position_drafted) < j:
                self.position_drafted.append(0)
                self.position_accepted.append(0)
            self.position_drafted[j - 1] += 1
            self.position_accepted[j - 1] += accepted >= j

    @classmethod
    def of(cls, cycles: Iterable[tuple[int, int, int]]) -> AcceptanceCounts:
        """From ``(block_size, accepted, tau)`` per cycle."""
        counts = cls()
        for block_size, accepted, tau in cycles:
            counts.add(block_size, accepted, tau)
        return counts

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(slot j accepted | slot j drafted), j = 1..the longest block - 1."""
        return [a / d for a, d in zip(self.position_accepted, self.position_drafted) if d]

    def sorted_tau_histogram(self) -> dict[int, int]:
        return dict(sorted(self.tau_histogram.items()))
