"""The dynamic-fallback policy on scripted acceptance and timing sequences (pure, no torch).

A "run length" r is how many drafts the target would accept with an unlimited block; a cycle at
block b then accepts min(r, b - 1), which is exactly the censoring the policy sees. Timings come
from one fixed cost model: a cycle at block b costs 4 ms of draft plus (20 + 2b) ms of verify, a
plain step 22 ms (so block 8 = 40 ms, block 4 = 32 ms, and the prior for a plain step before one
is measured is 36 / 1.5 = 24 ms).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.config import FallbackConfig
from engine.events import FallbackDecision
from engine.fallback import (
    PRESET_THRESHOLDS,
    AdaptivePolicy,
    FallbackPolicy,
    FixedPolicy,
    expected_tau,
    interpolate,
    make_policy,
    preset_threshold,
    reduced_size,
)

FULL = 8
# The scripted scenarios below use a fixed probe period (no backoff) and a 10 % margin.
CONFIG = FallbackConfig(window=8, hysteresis=1.10, probe_every=24, probe_every_max=24, probe_cycles=4, min_cycles_before_switch=4,
                        measure_plain_step=False)  # reduced 4, window 8; the plain-step measurement has its own tests


def timing(block: int) -> tuple[float, float]:
    """(draft_ms, verify_ms) of one cycle at ``block``; block 1 is a plain step (no draft)."""
    return (0.0, 22.0) if block == 1 else (4.0, 20.0 + 2.0 * block)


def drive(policy, run_lengths, timing=timing):
    """Feed one cycle per run length; returns [(block used, decision)]."""
    trace = []
    for r in run_lengths:
        block = policy.block_size
        decision = policy.observe(block, min(r, block - 1), *timing(block))
        trace.append((block, decision))
    return trace


def blocks(trace) -> list[int]:
    return [block for block, _ in trace]


def changes(trace) -> list[tuple[int, int]]:
    return [(block, d.next_block_size) for block, d in trace if d.changed]


def policy(**overrides) -> AdaptivePolicy:
    made = make_policy(replace(CONFIG, **overrides), FULL)
    assert isinstance(made, AdaptivePolicy)
    return made


# --- pure helpers ----------------------------------------------------------------------------


def test_expected_tau_censors_at_the_smaller_block():
    assert expected_tau([0, 3, 7], 8) == pytest.approx((1 + 4 + 8) / 3)
    assert expected_tau([0, 3, 7], 4) == pytest.approx((1 + 4 + 4) / 3)
    assert expected_tau([0, 3, 7], 1) == 1.0


def test_interpolate_is_piecewise_linear_and_extends_the_end_segments():
    points = {1: 24.0, 8: 40.0}
    assert interpolate(points, 1) == 24.0
    assert interpolate(points, 4) == pytest.approx(24.0 + 16.0 * 3 / 7)
    assert interpolate({1: 20.0, 3: 30.0}, 8) == pytest.approx(55.0)  # beyond: last slope
    assert interpolate({4: 32.0}, 8) == 32.0


def test_reduced_size_and_preset_thresholds():
    assert reduced_size(4, 8) == 4
    assert reduced_size(4, 4) == 3
    assert reduced_size(4, 2) is None
    assert PRESET_THRESHOLDS == {"code": 6.0, "math": 5.0, "agent": 4.0}
    assert preset_threshold("code", 16) == 6.0
    assert preset_threshold("code", 4) == 3.0  # quoted for blocks of 8, scaled below
    with pytest.raises(ValueError, match="unknown fallback preset"):
        make_policy(replace(CONFIG, preset="poetry"), FULL)


def test_cost_prior_is_replaced_by_measurements():
    p = policy()
    p.observe(8, 7, *timing(8))
    assert p.stats.cost(8) == 40.0
    assert p.stats.cost(1) == pytest.approx(36.0 / 1.5)  # prior: verify of full / 1.5
    # unmeasured: the verify interpolated between the prior and block 8, plus block 8's draft
    assert p.stats.cost(4) == pytest.approx(24.0 + 12.0 * 3 / 7 + 4.0)
    p.stats.record(1, 0, *timing(1))
    assert p.stats.cost(1) == 22.0


# --- make_policy and FixedPolicy ---------------------------------------------------------------


@pytest.mark.parametrize(("config", "max_block"), [(replace(CONFIG, enabled=False), 8), (CONFIG, 1)])
def test_fixed_policy_never_changes(config, max_block):
    p = make_policy(config, max_block)
    assert isinstance(p, FixedPolicy) and isinstance(p, FallbackPolicy)
    assert (p.block_size, p.state) == (max_block, "fixed")
    for r in [0] * 50 + [7] * 50:
        assert p.observe(max_block, min(r, max_block - 1), 5.0, 50.0) == FallbackDecision(max_block, "fixed")
    assert p.observe(1, 0, 0.0, 22.0) == FallbackDecision(max_block, "fixed")  # shrunk last block


def test_adaptive_policy_starts_full():
    p = make_policy(CONFIG, FULL)
    assert isinstance(p, FallbackPolicy)
    assert (p.block_size, p.state) == (FULL, "full")


# --- the cost-model rule -----------------------------------------------------------------------


def test_stays_full_when_acceptance_is_high():
    trace = drive(policy(), [7] * 100)
    assert set(blocks(trace)) == {8}
    assert all(d == FallbackDecision(8, "full") for _, d in trace)


def test_drops_to_reduced_when_tau_is_low_and_reduced_is_faster():
    # r = 1: tau 2 at both sizes; block 8 costs 40 ms, block 4 ~33 ms (prior), so 4 wins by 20 %.
    trace = drive(policy(), [1] * (3 + CONFIG.probe_every))  # up to, not into, the first probe
    assert changes(trace) == [(8, 4)]
    index = next(i for i, (_, d) in enumerate(trace) if d.changed)
    assert index == CONFIG.min_cycles_before_switch - 1  # not before enough cycles
    decision = trace[index][1]
    assert decision.state == "reduced" and decision.next_block_size == 4
    assert "τ 2.0 over last 4 cycles" in decision.reason and "8 → 4" in decision.reason
    assert "1.2× → 1.4× over plain decoding" in decision.reason
    assert set(blocks(trace)[index + 1 :]) == {4}  # and the measured cost of 4 keeps it there


def test_turns_off_when_drafting_never_pays():
    trace = drive(policy(), [0] * 20)
    assert changes(trace) == [(8, 1)]
    decision = next(d for _, d in trace if d.changed)
    assert decision.state == "off"
    assert "8 → 1 (speculation off)" in decision.reason
    assert set(blocks(trace)[CONFIG.min_cycles_before_switch :]) == {1}


def test_reduced_turns_off_when_it_stops_paying():
    # r = 1 sends 8 -> 4; then a slower reduced verify (block 4 at 60 ms) makes plain faster.
    slow_four = lambda b: (4.0, 56.0) if b == 4 else timing(b)  # noqa: E731
    p = policy()
    drive(p, [1] * 4)
    assert p.block_size == 4
    trace = drive(p, [1] * 10, timing=slow_four)
    assert changes(trace) == [(4, 1)]
    assert "τ 2.0 over last 4 cycles at block 4; block 4 → 1" in next(d.reason for _, d in trace if d.changed)


# A borderline sequence: over the rolling window, reduced is between 20 % slower and 7 % faster
# than full, crossing break-even again and again but never by the 10 % margin.
BORDERLINE = [5, 5, 5, 5, 5, 4, 2, 4, 3, 4, 3, 4, 2] * 20


def test_borderline_sequence_straddles_break_even_within_the_margin():
    p = policy(hysteresis=100.0)  # never switches: just watch the estimates
    ratios = []
    for r in BORDERLINE:
        assert not drive(p, [r])[0][1].changed
        ratios.append(p.stats.speedup(4) / p.stats.speedup(8))
    decided = ratios[CONFIG.min_cycles_before_switch - 1 :]  # the ones the policy acts on
    assert min(decided) < 1.0 < max(decided) < CONFIG.hysteresis


def test_hysteresis_prevents_flapping_on_a_borderline_sequence():
    steady = drive(policy(), BORDERLINE)
    assert changes(steady) == []
    eager = drive(policy(hysteresis=1.0), BORDERLINE)
    assert changes(eager)  # the same sequence does move without the margin


def test_down_only_between_probes():
    """Low acceptance then recovery: reduced stays reduced until the probe, never earlier."""
    p = policy()
    trace = drive(p, [1] * 4 + [7] * (CONFIG.probe_every - 1))
    assert changes(trace) == [(8, 4)]
    assert blocks(trace)[4:] == [4] * (CONFIG.probe_every - 1)


# --- probes ------------------------------------------------------------------------------------


def test_probe_returns_to_full_when_acceptance_recovered():
    p = policy()
    trace = drive(p, [1] * 4 + [7] * 200)
    assert changes(trace) == [(8, 4), (4, 8)]
    probe = [d for _, d in trace if d.changed][1]
    assert "probe after 24 cycles below full; block 4 → 8 for 4 cycles" in probe.reason
    probe_start = 4 + CONFIG.probe_every
    assert blocks(trace)[4:probe_start] == [4] * CONFIG.probe_every
    assert set(blocks(trace)[probe_start:]) == {8}
    assert all(d == FallbackDecision(8, "full") for _, d in trace[probe_start:])


def test_probe_goes_back_down_when_full_does_not_beat_the_lower_mode():
    p = policy()
    trace = drive(p, [1] * 80)
    probe_len, period = CONFIG.probe_cycles, CONFIG.probe_every + CONFIG.probe_cycles
    assert changes(trace) == [(8, 4)] + [(4, 8), (8, 4)] * 2
    back = [d for _, d in trace if d.changed][2]
    assert back.reason.startswith("probe: τ 2.0 over last 4 cycles at block 8; block 8 → 4")
    assert back.state == "reduced"
    assert blocks(trace)[4 + CONFIG.probe_every :][:period] == [8] * probe_len + [4] * CONFIG.probe_every


def test_probe_from_off_comes_back_when_acceptance_recovered():
    p = policy()
    trace = drive(p, [0] * 4 + [0] * CONFIG.probe_every + [6] * 40)
    assert changes(trace) == [(8, 1), (1, 8)]
    assert p.stats.cost(1) == 22.0  # measured while off, replacing the prior
    assert p.block_size == 8 and p.state == "full"


def test_probe_from_off_returns_off_when_drafting_still_does_not_pay():
    trace = drive(policy(), [0] * 70)
    assert changes(trace) == [(8, 1), (1, 8), (8, 1), (1, 8), (8, 1)]


def test_probe_can_land_on_reduced_when_coming_back_from_off():
    # Off at r = 0; the probe then sees r = 1, where block 4 beats both full and plain.
    trace = drive(policy(), [0] * (4 + CONFIG.probe_every) + [1] * 10)
    assert changes(trace) == [(8, 1), (1, 8), (8, 4)]


def test_probes_can_be_disabled():
    trace = drive(policy(probe_every=0), [1] * 4 + [7] * 200)
    assert changes(trace) == [(8, 4)]


# --- presets (a fixed tau threshold per kind of task) ----------------------------------------


@pytest.mark.parametrize(
    ("preset", "run_length", "expected"),
    [
        ("code", 5, 8),  # tau 6 >= 6
        ("code", 4, 4),  # tau 5 < 6
        ("math", 4, 8),  # tau 5 >= 5
        ("math", 3, 4),  # tau 4 < 5
        ("agent", 3, 8),  # tau 4 >= 4
        ("agent", 2, 4),  # tau 3 < 4
        ("agent", 0, 1),  # tau 1: speculation stops paying, off
    ],
)
def test_presets_on_scripted_tau(preset, run_length, expected):
    p = policy(preset=preset)
    trace = drive(p, [run_length] * 20)
    assert p.block_size == expected
    if expected != FULL:
        (change,) = [d for _, d in trace if d.changed]
        assert f"< the {preset} preset's {PRESET_THRESHOLDS[preset]:g}" in change.reason
        assert f"block 8 → {expected}" in change.reason


def test_code_preset_degrades_where_the_cost_model_would_not():
    # tau 5 at block 8: 3.0x expected at full vs 3.1x at reduced, within the hysteresis.
    assert changes(drive(policy(), [4] * 20)) == []
    assert changes(drive(policy(preset="code"), [4] * 20)) == [(8, 4)]


def test_preset_probes_back_up_when_tau_recovers():
    p = policy(preset="code")
    trace = drive(p, [3] * 4 + [7] * (CONFIG.probe_every + 20))
    assert changes(trace) == [(8, 4), (4, 8)]
    assert p.block_size == 8


def test_preset_probe_falls_back_when_tau_stays_below_threshold():
    trace = drive(policy(preset="code"), [4] * 40)
    assert changes(trace) == [(8, 4), (4, 8), (8, 4)]
    back = [d for _, d in trace if d.changed][-1]
    assert back.reason.startswith("probe: τ 5.0 over last 4 cycles at block 8 (< the code preset's 6); block 8 → 4")


# --- decisions and the decode loop's shrunk last block -----------------------------------------


SCENARIOS = [[7] * 60, [1] * 80, [0] * 70, [1] * 4 + [7] * 60, BORDERLINE[:120], [0] * 28 + [1] * 20]


@pytest.mark.parametrize("preset", [None, "code", "agent"])
def test_every_change_has_a_reason_naming_the_block_sizes(preset):
    for script in SCENARIOS:
        p = policy(preset=preset)
        previous = p.block_size
        for block, decision in drive(p, script):
            assert block == previous
            if decision.changed:
                assert decision.next_block_size != previous
                assert f"block {previous} → {decision.next_block_size}" in decision.reason
            else:
                assert decision.next_block_size == previous and decision.reason == ""
            assert decision.state == {8: "full", 4: "reduced", 1: "off"}[decision.next_block_size]
            previous = decision.next_block_size


def test_shrunk_last_block_is_recorded_but_is_no_mode_cycle():
    p = policy()
    drive(p, [1] * 3)
    decision = p.observe(3, 1, *timing(3))  # the loop shrank the block to fit max_new_tokens
    assert decision == FallbackDecision(8, "full")
    assert 3 in p.stats.sizes and p.stats.cost(3) == 30.0
    assert p.observe(8, 1, *timing(8)).changed  # the 4th full cycle decides, not the shrunk one


def test_shrunk_block_while_reduced_or_probing_changes_nothing():
    p = policy()
    drive(p, [1] * 4)
    assert p.observe(2, 1, *timing(2)) == FallbackDecision(4, "reduced")
    drive(p, [1] * CONFIG.probe_every)
    assert p.probing and p.block_size == 8
    for _ in range(10):  # shrunk cycles do not use up the probe
        assert p.observe(5, 1, *timing(5)) == FallbackDecision(8, "full")
    assert p.probing


def test_rejects_impossible_cycles():
    p = policy()
    with pytest.raises(ValueError, match="accepted"):
        p.observe(8, 8, 1.0, 1.0)
    with pytest.raises(ValueError, match="block_size"):
        p.observe(9, 0, 1.0, 1.0)


def test_small_full_blocks_have_no_reduced_mode():
    p = make_policy(CONFIG, 2)
    assert isinstance(p, AdaptivePolicy) and p.sizes == (2, 1)
    trace = drive(p, [0] * 10)
    assert changes(trace) == [(2, 1)]


def test_a_probe_keeps_full_unless_the_lower_mode_beats_it_by_the_margin():
    # r = 4 after the drop: block 4 accepts 3 (tau 4 for 32 ms), block 8 accepts 4 (tau 5 for
    # 40 ms): a tie. Leaving full needs the margin, so the probe stays at full.
    trace = drive(policy(), [1] * 4 + [4] * (CONFIG.probe_every + 40))
    assert changes(trace) == [(8, 4), (4, 8)]
    assert blocks(trace)[-40:] == [8] * 40


def probe_waits(trace) -> list[int]:
    """How many cycles below full each probe waited (from the decisions' reasons)."""
    reasons = [d.reason for _, d in trace if d.changed and d.next_block_size == FULL]
    return [int(r.split("probe after ")[1].split()[0]) for r in reasons]


def test_probe_wait_keeps_a_probes_expected_loss_within_the_budget():
    budgeted = policy(probe_every=4, probe_every_max=200, probe_cycles=2, probe_budget=0.05)
    # drafting never pays: off, a plain step 22 ms; a 2-cycle probe at block 8 (40 ms, tau 1)
    # loses 2 * (40 - 22) = 36 ms, which must be <= 5 % of the time waited: 36 / (0.05 * 22)
    assert probe_waits(drive(budgeted, [0] * 120))[:2] == [33, 33]
    # near break-even (r = 1: reduced block 4, tau 2 for 32 ms = 16 ms a token), a probe loses
    # 2 * (40 - 2 * 16) = 16 ms: it may come after 16 / (0.05 * 32) = 10 cycles
    near = policy(probe_every=4, probe_every_max=200, probe_cycles=2, probe_budget=0.05)
    assert probe_waits(drive(near, [1] * 60))[:2] == [10, 10]
    # the bounds hold, and without a budget the wait is probe_every
    assert set(probe_waits(drive(policy(probe_every=4, probe_every_max=16, probe_cycles=2, probe_budget=0.05),
                                 [0] * 120))) == {16}
    assert set(probe_waits(drive(policy(probe_every=6, probe_budget=0.0), [0] * 60))) == {6}


def test_a_losing_reduced_mode_goes_off_before_it_probes_again():
    # Off at r = 0; a probe sees r = 1 twice and lands on reduced (tau 2 in 32 ms beats plain's
    # 22 ms a token), then acceptance is gone again (r = 0: reduced makes 0.69x plain). Priced
    # against that reduced mode a probe looks free (full is no worse), so when the probe came
    # first fallback went reduced -> probe -> reduced and never reached plain decoding (seen at
    # T = 0.7, block 8, on the tiny coder). Leaving the losing mode comes first.
    p = policy(probe_every=4, probe_every_max=8, probe_cycles=2, probe_budget=0.01)
    trace = drive(p, [0] * 12 + [1, 1] + [0] * 40)
    assert changes(trace)[:4] == [(8, 1), (1, 8), (8, 4), (4, 1)]
    assert blocks(trace)[14:19] == [4, 4, 4, 4, 1]


def test_default_probe_budget_keeps_a_losing_setting_off_for_a_whole_reply():
    # Drafting never pays (r = 0): off, and the next probe waits 2 * (40 - 22) / (0.01 * 22) ->
    # the 128-cycle cap, longer than a 96-token reply: a probe there cost about 2 % of the reply.
    p = make_policy(replace(FallbackConfig(), window=8, measure_plain_step=False), FULL)
    assert FallbackConfig().probe_budget == 0.01
    assert probe_waits(drive(p, [0] * 300))[:2] == [128, 128]


def test_one_slow_plain_step_does_not_make_a_losing_block_look_fast():
    # Off, four plain steps measured, one of them slowed 18x by the machine (a pause of the
    # process); a probe at block 8 then accepts nothing (0.55x plain). A mean of the steps
    # (116 ms) would price the probe at 2.9x and keep it; the median (22 ms) goes back off.
    p = policy(probe_every=4, probe_every_max=4, probe_cycles=2, probe_budget=0.0)
    plain_ms = iter([22.0] * 4 + [22.0, 22.0, 400.0, 22.0] + [22.0] * 10)
    trace = drive(p, [0] * 16, timing=lambda b: (0.0, next(plain_ms)) if b == 1 else timing(b))
    assert p.stats.cost(1) == 22.0
    assert changes(trace) == [(8, 1), (1, 8), (8, 1), (1, 8), (8, 1)]  # every probe goes back off


def test_floor_leaves_a_losing_block_without_the_hysteresis_margin():
    # r = 0: block 8 makes a token per 40 ms against 22 for plain (0.55x). With a 2x margin the
    # policy would keep it (off gains only 1.8x); the floor (0.95x) leaves it at once.
    assert changes(drive(policy(hysteresis=2.0, floor=0.95), [0] * 6)) == [(8, 1)]
    assert changes(drive(policy(hysteresis=2.0, floor=0.0), [0] * 6)) == []
    assert FallbackConfig().floor == 0.95


def test_one_plain_step_after_the_first_cycle_measures_the_cost_unit():
    p = make_policy(FallbackConfig(), FULL)
    trace = drive(p, [7] * 6)
    assert blocks(trace) == [8, 1, 8, 8, 8, 8]
    assert trace[0][1].next_block_size == 1 and not trace[0][1].changed and "plain step" in trace[0][1].reason
    assert p.stats.cost(1) == 22.0  # measured, no longer the prior
    # once a plain step is measured (here: speculation went off) there is no extra one
    q = make_policy(FallbackConfig(measure_plain_step=False), FULL)
    assert blocks(drive(q, [7] * 3)) == [8, 8, 8]


def test_a_reply_goes_on_where_the_last_one_with_the_same_settings_ended():
    from engine.fallback import MemorySlot

    slot = MemorySlot()
    first = make_policy(FallbackConfig(), FULL)
    drive(first, [0] * 30)  # drafting never pays: speculation goes off
    slot.keep(first)
    assert slot.memory is not None and slot.memory.block_size == 1
    second = make_policy(FallbackConfig(), FULL, slot.memory)
    trace = drive(second, [0] * 20)
    assert blocks(trace)[:20] == [1] * 20  # no full-block cycles and no plain-step measurement to re-learn it
    assert second.stats is not slot.memory.stats  # a copy: the next reply does not write into this one
    # greedy-like replies run at full and start at full; a short reply leaves the slot as it was
    good = make_policy(FallbackConfig(), FULL)
    drive(good, [7] * 20)
    slot.keep(good)
    assert slot.memory.block_size == FULL
    short = make_policy(FallbackConfig(), FULL)
    drive(short, [0] * 3)
    slot.keep(short)
    assert slot.memory.block_size == FULL


def test_a_reply_that_probed_its_way_back_to_full_hands_full_on():
    """Most of its cycles were plain steps, but it ended at full: the next reply starts there."""
    p = policy(probe_every=12, probe_every_max=12, probe_cycles=2)
    trace = drive(p, [0] * 4 + [7] * 16)  # 4 at full, 12 plain steps, a probe of 2, then 2 at full
    assert changes(trace)[0] == (8, 1) and blocks(trace)[-1] == FULL
    assert blocks(trace).count(1) > blocks(trace).count(FULL)
    assert p.remember().block_size == FULL


def test_a_probe_cut_short_by_the_end_of_a_reply_hands_on_the_mode_it_left():
    p = policy(probe_every=4, probe_every_max=4, probe_cycles=4)
    trace = drive(p, [0] * 10)
    assert p.probing and trace[-1][1].next_block_size == FULL
    memory = p.remember()
    assert memory.block_size == 1 and memory.cycles_below_full == 0  # the clock restarted at the probe


def test_the_probe_clock_runs_across_replies_so_short_replies_still_probe():
    """One reply whose opening cycles draft badly turns speculation off. Every later reply
    drafts well but is shorter than the probe's wait: with a clock that restarted each reply,
    none of them ever probed and speculation stayed off for good."""
    from engine.fallback import MemorySlot

    slot = MemorySlot()
    first = make_policy(FallbackConfig(), FULL)
    trace = drive(first, [0] * 5 + [7] * 5)
    assert (8, 1) in changes(trace) and blocks(trace)[-1] == 1
    slot.keep(first)
    used = []
    for _ in range(20):
        reply = make_policy(FallbackConfig(), FULL, slot.memory)
        used.append(blocks(drive(reply, [7] * 10)))
        slot.keep(reply)
    first_full = next(n for n, reply in enumerate(used) if FULL in reply)
    # the wait is the budget's longest (128 cycles: the stale tau at full is 1.0), counted over replies
    assert first_full * 10 <= FallbackConfig().probe_every_max
    assert all(reply == [FULL] * 10 for reply in used[first_full + 1:])  # full again, and it stays
