"""``engine.acceptance``: the one definition of per-position acceptance and the τ histogram."""

import random
from collections import Counter

import pytest

from engine.acceptance import AcceptanceCounts


def test_a_hand_worked_example():
    # block 4 accepting 3, block 4 accepting 1, block 2 accepting 0, block 1 (no drafts)
    counts = AcceptanceCounts.of([(4, 3, 4), (4, 1, 2), (2, 0, 1), (1, 0, 1)])
    # slot 1 drafted in 3 cycles, accepted in 2; slots 2 and 3 drafted in 2, accepted in 1
    assert counts.per_position_acceptance == [2 / 3, 1 / 2, 1 / 2]
    assert counts.sorted_tau_histogram() == {1: 2, 2: 1, 4: 1} and counts.cycles == 4
    assert AcceptanceCounts().per_position_acceptance == [] and AcceptanceCounts.of([(1, 0, 1)]).position_drafted == []


def test_counts_equal_the_naive_definition_on_random_cycles():
    rng = random.Random(7)
    cycles = []
    for _ in range(300):
        block = rng.choice([1, 2, 4, 8, 16])
        accepted = rng.randint(0, block - 1)
        cycles.append((block, accepted, accepted + 1 - (rng.random() < 0.1 and accepted > 0)))
    counts = AcceptanceCounts.of(cycles)
    longest = max(block for block, _, _ in cycles)
    naive = [sum(a >= j for b, a, _ in cycles) / sum(b - 1 >= j for b, _, _ in cycles) for j in range(1, longest)]
    assert counts.per_position_acceptance == pytest.approx(naive)
    assert counts.sorted_tau_histogram() == dict(sorted(Counter(t for _, _, t in cycles).items()))
