"""Replaying block-size policies on recorded acceptance (pure): censoring, the shrunk last
block, modelled time, and the fallback policy on the shipped pair's real acceptance runs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from engine.config import FallbackConfig
from engine.fallback import FixedPolicy
from engine.replay import compare, fill_costs, replay

COSTS = {1: (0.0, 10.0), 2: (4.0, 12.0), 8: (4.0, 16.0)}


def test_fill_costs_interpolates_every_block_and_needs_a_plain_step():
    costs = fill_costs(COSTS, 8)
    assert costs[1] == (0.0, 10.0) and costs[8] == (4.0, 16.0)
    assert costs[5] == (4.0, pytest.approx(14.0))
    with pytest.raises(ValueError, match="block 1"):
        fill_costs({8: (4.0, 16.0)}, 8)


def test_replay_censors_at_the_block_and_shrinks_the_last_block():
    runs = [7] * 20  # 21 tokens: the draft is always right
    full = replay(runs, FixedPolicy(8), fill_costs(COSTS, 8))
    assert full.taus == (8, 8, 4) and full.tokens == 20  # 20 after the prefill's token; last block of 5
    assert replay(runs, FixedPolicy(4), fill_costs(COSTS, 8)).taus == (4,) * 5
    costs = fill_costs(COSTS, 8)
    wrong = replay([0] * 10, FixedPolicy(8), costs)
    assert wrong.taus == (1,) * 10
    assert wrong.ms == pytest.approx(sum(sum(costs[min(8, 11 - p)]) for p in range(10)))  # blocks shrink at the end


def test_compare_models_speedup_against_plain_decoding():
    runs = [[7] * 40, [0] * 40]
    result = compare(runs, {"plain": 1, "b8": 8, "fallback": FallbackConfig()}, 8, COSTS)
    assert result["plain"] == {"mean_tau": 1.0, "speedup": 1.0, "cycles": 80}
    assert result["b8"]["speedup"] < result["fallback"]["speedup"]  # the second reply never pays


def test_compare_starts_each_reply_from_the_last_ones_memory_as_the_engine_does():
    """Four replies where drafting never pays: the first pays to learn it (two cycles at full
    block), the next three start with speculation off, as the engine's fallback memory does, and
    the probe clock runs on across them: one probe (two cycles at full) in their 120, when the
    clock carried from the first reply reaches the budget's longest wait (128 cycles)."""
    hopeless = [[0] * 40 for _ in range(4)]
    first = compare(hopeless[:1], {"fallback": FallbackConfig()}, 8, COSTS)["fallback"]
    all_four = compare(hopeless, {"fallback": FallbackConfig()}, 8, COSTS)["fallback"]
    reply_plain_ms = 40 * COSTS[1][1]  # 40 tokens after the prefill's, one plain step each
    first_ms = reply_plain_ms / first["speedup"]
    later_ms = 4 * reply_plain_ms / all_four["speedup"] - first_ms
    assert first["speedup"] < 0.96
    probe_ms = 2 * (sum(COSTS[8]) - COSTS[1][1])  # two cycles at full instead of two plain steps
    assert later_ms == pytest.approx(3 * reply_plain_ms + probe_ms, rel=1e-3)


RUNS = Path(__file__).parent / "data" / "tiny_coder_runs.json"


def test_fallback_on_the_shipped_pair_keeps_up_with_fixed_blocks_and_helps_where_drafting_fails():
    """Real acceptance runs of the embedded pair (`dflash-studio bench --replay --save-runs`)."""
    document = json.loads(RUNS.read_text())
    costs = {int(b): tuple(c) for b, c in document["costs"].items()}
    block = document["block_size"]
    result = compare(document["runs"], {"fixed": block, "fallback": FallbackConfig()}, block, costs)
    assert result["fallback"]["speedup"] >= 0.97 * result["fixed"]["speedup"]
    # where drafting does not pay (the target accepts nothing), fallback turns it off
    hopeless = [[0] * 95 for _ in range(4)]
    result = compare(hopeless, {"fixed": block, "fallback": FallbackConfig()}, block, costs)
    assert result["fixed"]["speedup"] < 0.6 and result["fallback"]["speedup"] > 0.75


def sampled_runs(first_slot: float, decay: float, replies: int = 25, length: int = 96, seed: int = 0):
    """Acceptance runs like sampling at T = 0.7 on the tiny coder (slot 1 accepted ~30 % of the
    time, each further slot less often), drawn from a seeded generator."""
    rnd = random.Random(seed)
    runs = []
    for _ in range(replies):
        reply = []
        for _ in range(length - 1):
            accepted, p = 0, first_slot
            while accepted < 15 and rnd.random() < p:
                accepted, p = accepted + 1, p * decay
            reply.append(accepted)
        runs.append(reply)
    return runs


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("first_slot,decay", [(0.0, 0.0), (0.3, 0.4), (0.5, 0.7)])
def test_fallback_floor_where_drafting_does_not_pay(block, first_slot, decay):
    """The floor: with the shipped pair's measured costs (block 16 extrapolated: a cycle of 2.5
    plain steps), dynamic fallback stays within 5 % of plain decoding on 96-token replies where
    drafting loses, including its first cycles at full block, its one plain-step measurement
    and its probes."""
    document = json.loads(RUNS.read_text())
    costs = {int(b): tuple(c) for b, c in document["costs"].items()}
    runs = sampled_runs(first_slot, decay)
    result = compare(runs, {"fixed": block, "fallback": FallbackConfig()}, block, costs)
    assert result["fixed"]["speedup"] < 0.9  # drafting really loses here
    assert result["fallback"]["speedup"] >= 0.95
