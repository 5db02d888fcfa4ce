"""Dynamic fallback: pick the next cycle's block size from {full, reduced, 1} by expected speed.

Speculation pays only when ``E[tau_B] * t_1 > t_cycle(B)``: a cycle at block B costs
a draft forward plus a B-token verify and yields tau tokens on average, where a plain step costs
``t_1`` and yields one. This module is a small pure state machine (no torch) that the decode loop
feeds after every cycle::

    policy = make_policy(config, max_block_size)
    policy.block_size                                   # block size for the next cycle
    decision = policy.observe(block_size, accepted, draft_ms, verify_ms)

Decision rule (``AdaptivePolicy``):

- Estimates, over the last ``config.window`` cycles per block size: E[tau_b] and the cycle cost
  (a median: one step slowed by the machine must not make speculation look cheap). The window is
  long (32) because acceptance is bursty within a reply: a reply that answers a request opens
  with its hardest tokens (a name made up from the request), and an estimate from its first few
  cycles turns speculation off for the rest of the reply and, through the memory below, the
  next ones (replayed on the request pair's recorded runs: 1.05-1.24x with a window of 8 and
  first decisions after 2 cycles, 1.09-1.43x with 32 and 4, fixed blocks 1.11-1.44x).
  From cycles at block B we know ``accepted`` exactly, so tau at any smaller b is
  ``min(accepted, b - 1) + 1`` (no model needed). Above the block in use tau is censored, which
  is why the policy only ever moves UP through probes.
- Expected speedup over plain decoding of block b: ``E[tau_b] / cost(b) * cost(1)``.
- Every cycle (after ``min_cycles_before_switch`` in the current mode) pick the fastest block
  among the current one and the smaller ones; switch only if it beats the current one by the
  factor ``config.hysteresis`` - or by any margin when the current block is expected to be
  slower than ``config.floor`` (0.95) x plain decoding: fallback must not lose to plain.
- After some cycles below full, run ``probe_cycles`` cycles at full size with fresh acceptance
  samples; then stay at full unless a lower mode beats it by the hysteresis (the same rule as
  leaving full in the first place). How long to wait is priced with the estimates of the moment
  (re-read every cycle, so a plain step's measured cost soon replaces the prior): a probe's
  expected loss (its cycles at full against the same tokens in the mode left for, with the
  current estimates of tau and cost) may be at most ``probe_budget`` (1 %) of the time spent
  waiting for it, and the wait stays within [``probe_every``, ``probe_every_max``] cycles. Near
  break-even a probe costs almost nothing, so it comes early (acceptance is bursty: a reply often
  opens with a few hard tokens); where drafting clearly loses (T > 0 on a small target, tau ~1.4)
  probes are rare, which is what keeps fallback within 5 % of plain decoding (the floor): at 3 %
  a probe came about once per 96-token reply at T = 0.7 and cost ~2 % of it (0.96x against 0.98x
  at 1 %, one A/B sitting). A mode expected to lose is left (down) before a probe is considered:
  a probe is priced against the mode in use, and from a reduced mode as slow as full it looked
  free, so fallback cycled reduced -> probe -> reduced without reaching plain decoding.
- With ``config.preset`` a fixed threshold replaces the comparison against full: keep full blocks
  while the rolling tau >= ``PRESET_THRESHOLDS[preset]`` (quoted for blocks of 8; scaled by B/8
  for smaller full blocks), otherwise degrade: to reduced, or straight to off when the cost model
  expects plain decoding to beat reduced by the hysteresis margin (speculation stops paying).
  Probes return to full only if the probe's tau reaches the threshold again.
- A probe reports state "full"; a probe that confirms full is no change (changed=False).
- Memory across replies: the engine hands each reply's ``remember()`` to the next reply with
  the same settings, which goes on from there as if the replies were one stream: the mode it
  ended in (a probe cut short by the reply's end counts as the mode it left), its estimates and
  the probe clock (cycles below full since the last probe). At T = 0.7 on the tiny coder every
  reply used to pay two cycles at full block, one plain-step measurement and a probe to re-learn
  that drafting loses (about 5-10 % of a 96-token reply). The clock matters as much as the mode:
  when it restarted with every reply, replies shorter than the probe's wait never probed, and
  one reply whose opening cycles drafted badly (tau 2.0 over its first 4) kept speculation off
  for every short greedy reply after it, though full blocks paid 1.4x on them.

A plain step's cost is what every estimate is relative to, and the prior below misjudges it
(on this CPU a verify of 16 costs 2.3 plain steps, not 1.5), so with ``measure_plain_step`` the
cycle after the first one is one plain step (block 1, no mark in the UI: the decision is not a
change of mode), unless a plain step was measured already. It yields one token at exactly plain
decoding's cost, so it never loses to plain decoding, and costs a greedy reply at tau 5.7 about
0.6 % against fixed blocks.

Cost prior (until measurements exist): a plain step costs ``verify_ms(B) / 1.5`` where B is the
largest block measured so far (a B-token verify is ~1.5-2.4 plain steps on CPU, so 1.5 is the
speculation-friendly end: we do not switch off on a guess). An unmeasured block b > 1 costs its
verify, interpolated linearly between the measured/prior verify times (extrapolated along the
last segment), plus one draft forward as measured at the nearest drafted size (a draft pass costs
about the same at any block size). At block 1 the decode loop reports ``draft_ms=0`` and
``verify_ms`` = one plain step, which replaces the prior.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Protocol, runtime_checkable

from .config import FallbackConfig
from .events import FallbackDecision, FallbackState

# A rule of thumb by kind of task, near the mean τ published DFlash drafts reach on code (about 6),
# math (5) and agent traces (4): keep full blocks while the rolling tau stays at or above this.
# Read-only, so that no caller can mutate module state.
PRESET_THRESHOLDS: Mapping[str, float] = MappingProxyType({"code": 6.0, "math": 5.0, "agent": 4.0})
# The thresholds are quoted for blocks of 8 (MiMo's drafts); smaller blocks scale them by B / 8.
PRESET_REFERENCE_BLOCK = 8
# Until block 1 is measured, a plain step is assumed to cost the full block's verify / 1.5.
VERIFY_STEPS_PRIOR = 1.5
_MIN_COST_MS = 1e-6  # guards the divisions against a zero timing
MEMORY_MIN_CYCLES = 8  # a reply shorter than this says too little to start the next one from


# --- small pure helpers ----------------------------------------------------------------------


def reduced_size(reduced_block_size: int, max_block_size: int) -> int | None:
    """The intermediate block, strictly between 1 and full; ``None`` when there is no room."""
    size = min(reduced_block_size, max_block_size - 1)
    return size if size > 1 else None


def preset_threshold(preset: str, max_block_size: int) -> float:
    """The preset's tau threshold for this full block size (scaled down below blocks of 8)."""
    if preset not in PRESET_THRESHOLDS:
        known = ", ".join(sorted(PRESET_THRESHOLDS))
        raise ValueError(f"unknown fallback preset {preset!r} (known: {known})")
    return PRESET_THRESHOLDS[preset] * min(1.0, max_block_size / PRESET_REFERENCE_BLOCK)


def expected_tau(accepted: "list[int] | deque[int]", block_size: int) -> float:
    """E[tau] at ``block_size`` from cycles run at a block >= it: mean of min(a, b - 1) + 1."""
    return sum(min(a, block_size - 1) + 1 for a in accepted) / len(accepted)


def interpolate(points: Mapping[int, float], x: int) -> float:
    """Piecewise-linear through ``points`` (size -> cost), extended along the end segments."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    if x in points:
        return points[x]
    # The segment containing x, or the first/last one when x lies outside.
    i = next((k for k in range(1, len(xs)) if x < xs[k]), len(xs) - 1)
    x0, x1 = xs[i - 1], xs[i]
    y0, y1 = points[x0], points[x1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def speedup(tau: float, cost_ms: float, plain_ms: float) -> float:
    """Expected tokens per ms of a block relative to plain decoding: (tau / cost) / (1 / t_1)."""
    return tau * plain_ms / max(cost_ms, _MIN_COST_MS)


# --- rolling statistics ----------------------------------------------------------------------


@dataclass
class SizeWindow:
    """The last ``window`` cycles run at one block size."""

    window: int
    accepted: deque = field(init=False)
    draft_ms: deque = field(init=False)
    verify_ms: deque = field(init=False)
    last_cycle: int = 0  # when acceptance was last recorded here (to find the freshest source)

    def __post_init__(self) -> None:
        self.accepted = deque(maxlen=self.window)
        self.draft_ms = deque(maxlen=self.window)
        self.verify_ms = deque(maxlen=self.window)


@dataclass
class RollingStats:
    """Per-block-size rolling windows of acceptance and cost, and the estimates built on them."""

    window: int
    sizes: dict[int, SizeWindow] = field(default_factory=dict)
    cycles: int = 0

    def record(self, block_size: int, accepted: int, draft_ms: float, verify_ms: float) -> None:
        self.cycles += 1
        stats = self.sizes.setdefault(block_size, SizeWindow(self.window))
        stats.accepted.append(accepted)
        stats.draft_ms.append(draft_ms)
        stats.verify_ms.append(verify_ms)
        stats.last_cycle = self.cycles

    def forget_acceptance(self, block_size: int) -> None:
        """Drop a size's acceptance samples (a probe re-measures them from scratch)."""
        if block_size in self.sizes:
            self.sizes[block_size].accepted.clear()

    def tau(self, block_size: int) -> tuple[float, int] | None:
        """(E[tau], number of cycles) at ``block_size``, or None when nothing covers it.

        Uses the size >= ``block_size`` with the most recent acceptance samples: fresh cycles at
        a larger block are better evidence than stale ones at this very size.
        """
        if block_size <= 1:
            return 1.0, 0
        sources = [s for b, s in self.sizes.items() if b >= block_size and s.accepted]
        if not sources:
            return None
        freshest = max(sources, key=lambda s: s.last_cycle)
        return expected_tau(freshest.accepted, block_size), len(freshest.accepted)

    def cost(self, block_size: int) -> float | None:
        """Typical cycle cost (ms) at ``block_size`` (median of the window): measured, else the prior."""
        measured = {b: s for b, s in self.sizes.items() if s.verify_ms}
        if not measured:
            return None
        if block_size in measured:
            return _typical(measured[block_size].draft_ms) + _typical(measured[block_size].verify_ms)
        verify = {b: _typical(s.verify_ms) for b, s in measured.items()}
        if 1 not in verify:
            verify[1] = verify[max(verify)] / VERIFY_STEPS_PRIOR
        if block_size == 1:
            return verify[1]
        # One draft forward costs about the same at any block size: borrow the nearest measured one.
        drafted = [b for b in measured if b > 1]
        draft_ms = _typical(measured[min(drafted, key=lambda b: abs(b - block_size))].draft_ms) if drafted else 0.0
        return interpolate(verify, block_size) + draft_ms

    def speedup(self, block_size: int) -> float | None:
        """Expected speedup of ``block_size`` over plain decoding; None without estimates."""
        tau, cost, plain = self.tau(block_size), self.cost(block_size), self.cost(1)
        if tau is None or cost is None or plain is None:
            return None
        return speedup(tau[0], cost, plain)


def _typical(values: "deque[float]") -> float:
    """A cost's estimate: the median of its window. One step slowed by the machine (a pause of
    the process, another program) is common on a shared CPU, and in a mean it doubled a plain
    step's cost, so that speculation looked worth switching on at T = 0.7 where it loses."""
    return statistics.median(values)


# --- policies --------------------------------------------------------------------------------


@runtime_checkable
class FallbackPolicy(Protocol):
    """What the decode loop needs: the next block size, and a decision after every cycle."""

    @property
    def block_size(self) -> int: ...

    @property
    def state(self) -> FallbackState: ...

    def observe(self, block_size: int, accepted: int, draft_ms: float, verify_ms: float) -> FallbackDecision: ...


@dataclass(frozen=True)
class FixedPolicy:
    """Dynamic fallback switched off: always the same block size, state ``fixed``."""

    block_size: int

    @property
    def state(self) -> FallbackState:
        return "fixed"

    def observe(self, block_size: int, accepted: int, draft_ms: float, verify_ms: float) -> FallbackDecision:
        return FallbackDecision(self.block_size, "fixed")


class AdaptivePolicy:
    """The state machine of the module docstring: modes full / reduced / off, plus probes."""

    def __init__(self, config: FallbackConfig, max_block_size: int, memory: "PolicyMemory | None" = None) -> None:
        self.config = config
        self.full = max_block_size
        self.reduced = reduced_size(config.reduced_block_size, max_block_size)
        self.sizes = tuple(b for b in (self.full, self.reduced, 1) if b is not None)  # descending
        self.threshold = preset_threshold(config.preset, max_block_size) if config.preset else None
        self.stats = RollingStats(max(1, config.window))
        self._block = self.full
        self._cycles = 0  # cycles this reply has decided on (remember() needs enough of them)
        self._cycles_in_mode = 0  # cycles since the last switch (decisions wait for enough data)
        self._cycles_below_full = 0  # counts towards the next probe
        self._probe_left = 0  # > 0 while probing full size
        self._probe_from = self.full  # the mode a probe left (where a probe cut short returns)
        if memory is not None and memory.block_size in self.sizes:
            # the previous reply with these settings: go on where it ended, with its estimates
            # and its probe clock (so a reply at T > 0 need not re-learn that drafting loses,
            # and a run of short replies below full still reaches its next probe)
            self.stats = copy.deepcopy(memory.stats)
            self._block = memory.block_size
            if self._block != self.full:
                self._cycles_below_full = memory.cycles_below_full
        self._measuring_plain = False  # the next cycle is one plain step (the cost model's unit)

    @property
    def block_size(self) -> int:
        return 1 if self._measuring_plain else self._block

    @property
    def state(self) -> FallbackState:
        return _state(self._block, self.full)

    @property
    def probing(self) -> bool:
        return self._probe_left > 0

    def observe(self, block_size: int, accepted: int, draft_ms: float, verify_ms: float) -> FallbackDecision:
        _check_cycle(block_size, accepted, self.full)
        self.stats.record(block_size, accepted, draft_ms, verify_ms)
        if self._measuring_plain:
            self._measuring_plain = False  # the plain step is measured; back to the mode's block
            return self._unchanged()
        decision = self._decide(block_size)
        if not decision.changed and self._block > 1 and self.config.measure_plain_step and 1 not in self.stats.sizes:
            self._measuring_plain = True
            return FallbackDecision(1, self.state, reason="one plain step, to measure what speculation competes with")
        return decision

    def remember(self) -> "PolicyMemory | None":
        """What the next reply with the same settings goes on from: the mode this one ended in
        (a probe cut short by the end of the reply counts as the mode it left), a copy of its
        estimates and the probe clock; None after too few cycles to tell."""
        if self._cycles < MEMORY_MIN_CYCLES:
            return None
        mode = self._probe_from if self._probe_left else self._block
        clock = 0 if mode == self.full else self._cycles_below_full
        return PolicyMemory(mode, copy.deepcopy(self.stats), clock)

    def _decide(self, block_size: int) -> FallbackDecision:
        """The mode's rule after a cycle at ``block_size`` (the module docstring)."""
        self._cycles += 1
        if block_size != self._block:
            # The loop shrank the last block to fit max_new_tokens: the sample is kept (it is
            # exact evidence for sizes <= block_size) but it is no cycle of the current mode.
            return self._unchanged()
        if self._probe_left:
            self._probe_left -= 1
            return self._end_probe() if self._probe_left == 0 else self._unchanged()
        self._cycles_in_mode += 1
        if self._block != self.full:
            self._cycles_below_full += 1
        # Leaving a losing mode comes before probing a larger one: a probe is priced against the
        # mode in use, so from a reduced mode as slow as full it looked free, and fallback went
        # reduced -> probe -> reduced without ever reaching plain decoding (T = 0.7, block 8).
        if self._cycles_in_mode >= max(1, self.config.min_cycles_before_switch):
            # Only downwards (or stay): above the current block tau is censored; probes go up.
            allowed = tuple(b for b in self.sizes if b <= self._block)
            target = self._pick(allowed, self._block)
            if target != self._block:
                return self._switch(target, self._reason(self._why(self._block), target))
        if self._block != self.full and self.config.probe_every > 0 and self._cycles_below_full >= self._budgeted_wait():
            return self._start_probe()
        return self._unchanged()

    # --- the rule -----------------------------------------------------------------------------

    def _pick(self, allowed: tuple[int, ...], current: int) -> int:
        """The block the rule wants among ``allowed`` (descending), given the ``current`` mode."""
        if self.threshold is None:
            return self._fastest(allowed, current)
        # Preset: the kind of task's tau threshold decides full or not; the cost model picks reduced/off.
        if self.full in allowed:
            tau_full = self.stats.tau(self.full)
            if tau_full is not None and tau_full[0] >= self.threshold:
                return self.full
        lower = tuple(b for b in allowed if b != self.full)
        return self._fastest(lower, current if current in lower else lower[0])

    def _fastest(self, allowed: tuple[int, ...], base: int) -> int:
        """``base`` unless another allowed block is expected to be faster by the hysteresis."""
        scores = {b: s for b in allowed if (s := self.stats.speedup(b)) is not None}
        if base not in scores:
            return base
        best = max(scores, key=lambda b: (scores[b], b == base))  # ties keep the base
        # The floor: a mode expected to be slower than floor x plain decoding is left for any
        # faster one at once; otherwise a switch must gain the hysteresis margin.
        margin = 1.0 if scores[base] < self.config.floor else self.config.hysteresis
        return best if scores[best] >= margin * scores[base] else base

    # --- probes -------------------------------------------------------------------------------

    def _start_probe(self) -> FallbackDecision:
        self._probe_left = max(1, self.config.probe_cycles)
        self._probe_from = self._block
        self.stats.forget_acceptance(self.full)  # those samples are what sent us down
        reason = (
            f"probe after {self._cycles_below_full} cycles below full; block {self._block} → "
            f"{self.full} for {self._probe_left} cycles to re-measure acceptance"
        )
        self._cycles_below_full = 0
        return self._switch(self.full, reason)

    def _end_probe(self) -> FallbackDecision:
        # Leaving full after a probe needs the same margin as leaving it in the first place.
        target = self._pick(self.sizes, self.full)
        if target == self.full:
            self._cycles_in_mode = 0  # acceptance recovered: full again, with a fresh clock
            return self._unchanged()
        return self._switch(target, self._reason("probe: " + self._why(self.full), target))

    # --- decisions ----------------------------------------------------------------------------

    def _why(self, measured: int) -> str:
        """What the decision rests on: tau at ``measured`` (plus the preset's threshold)."""
        tau = self.stats.tau(measured)
        n = tau[1] if tau else 0
        why = f"τ {tau[0]:.1f} over last {n} cycles at block {measured}" if tau else "no τ yet"
        if self.threshold is not None and measured == self.full and tau is not None:
            relation = "≥" if tau[0] >= self.threshold else "<"
            why += f" ({relation} the {self.config.preset} preset's {self.threshold:g})"
        return why

    def _reason(self, why: str, target: int) -> str:
        """``why``, then both block sizes and (when known) both expected speedups."""
        off = " (speculation off)" if target == 1 else ""
        reason = f"{why}; block {self._block} → {target}{off}"
        before, after = self.stats.speedup(self._block), self.stats.speedup(target)
        if before is not None and after is not None:
            reason += f", expected {before:.1f}× → {after:.1f}× over plain decoding"
        return reason

    def _switch(self, target: int, reason: str) -> FallbackDecision:
        if self._block == self.full:
            self._cycles_below_full = 0  # leaving full (or ending a probe): the probe clock starts
        self._block = target
        self._cycles_in_mode = 0
        return FallbackDecision(target, self.state, changed=True, reason=reason)

    def _budgeted_wait(self) -> int:
        """Cycles below full before the next probe: long enough that the probe's expected loss
        (``probe_cycles`` at full, against the same tokens in the current mode) is at most
        ``probe_budget`` of the time spent waiting; within [probe_every, probe_every_max]."""
        config = self.config
        low = config.probe_every
        high = max(low, config.probe_every_max)
        tau_full, tau_now = self.stats.tau(self.full), self.stats.tau(self._block)
        cost_full, cost_now = self.stats.cost(self.full), self.stats.cost(self._block)
        if config.probe_budget <= 0 or None in (tau_full, tau_now, cost_full, cost_now):
            return low
        ms_per_token_now = cost_now / tau_now[0]
        loss = max(1, config.probe_cycles) * max(0.0, cost_full - tau_full[0] * ms_per_token_now)
        wait = math.ceil(loss / (config.probe_budget * max(cost_now, _MIN_COST_MS)))
        return int(min(high, max(low, wait)))

    def _unchanged(self) -> FallbackDecision:
        return FallbackDecision(self._block, self.state)


def _state(block_size: int, full: int) -> FallbackState:
    return "full" if block_size == full else "off" if block_size == 1 else "reduced"


def _check_cycle(block_size: int, accepted: int, max_block_size: int) -> None:
    if not 1 <= block_size <= max_block_size:
        raise ValueError(f"block_size must be between 1 and {max_block_size} (got {block_size})")
    if not 0 <= accepted <= block_size - 1:
        raise ValueError(f"accepted must be between 0 and {block_size - 1} (got {accepted})")


@dataclass(frozen=True)
class PolicyMemory:
    """What one reply's adaptive policy learned, handed to the next reply with the same settings
    (``LocalEngine`` keeps one per setting): the mode to start in, the rolling estimates, and
    the cycles spent below full since the last probe (the next probe's clock)."""

    block_size: int
    stats: RollingStats
    cycles_below_full: int = 0


@dataclass
class MemorySlot:
    """Where a reply leaves its ``PolicyMemory`` for the next one (the engine keeps one slot per
    block size and sampling settings)."""

    memory: PolicyMemory | None = None

    def keep(self, policy: FallbackPolicy) -> None:
        remembered = policy.remember() if isinstance(policy, AdaptivePolicy) else None
        if remembered is not None:
            self.memory = remembered


def make_policy(config: FallbackConfig, max_block_size: int, memory: PolicyMemory | None = None) -> FallbackPolicy:
    """The adaptive policy (starting from ``memory`` when given), or a ``FixedPolicy`` when
    fallback is off or there is nothing to vary."""
    if not config.enabled or max_block_size <= 1:
        return FixedPolicy(max_block_size)
    return AdaptivePolicy(config, max_block_size, memory)
