"""One speed story: the verdict under a reply's estimate, what dynamic fallback did to the block
size, and how Compare's measurement relates to the estimate (or why it differs).

The estimate under a reply is τ ÷ a cycle's cost in plain steps, the cost measured once when
the model loaded (``engine.costs``: a 128-token context, the machine as it was then). Compare
measures tokens per second of two runs now. The two agree when τ and the cycle's cost are what
the estimate assumed; this module says which of them moved when they do not. Pure functions.
"""

from __future__ import annotations

from collections import Counter

# The estimate's stated error. Within it a reply is "about even" with plain decoding: the cycle
# cost behind the estimate was measured once, at load, and moves with the context and the machine.
ESTIMATE_ERROR = 0.15


def speed_verdict(speedup: float, block_sizes: list[int]) -> str:
    """The words after an estimate: never "pays" at or below 1.0×, nor for plain decoding."""
    if block_sizes and all(b <= 1 for b in block_sizes):
        return "block 1: plain decoding, nothing was drafted"
    if speedup > 1 + ESTIMATE_ERROR:
        return "speculation pays"
    if speedup < 1 - ESTIMATE_ERROR:
        return "speculation loses: τ is below the cycle cost"
    return f"about even with plain decoding, within the estimate's ±{ESTIMATE_ERROR:.0%}"


def fallback_summary(block_sizes: list[int], chosen_block: int | None, states: list[str] | None = None) -> str | None:
    """What dynamic fallback did to the block size in one reply, or None when every cycle ran at
    the block chosen: "fallback: block 8→4 for 12 of 30 cycles (8 for 17, 1 for 1)"; and when the
    reply started below it, that it started where the previous reply with these settings ended.
    A block-1 cycle in a speculating mode (``states``: not "off") is fallback measuring one plain
    step, not a change of mode: it is left out."""
    if states is not None:
        block_sizes = [b for b, state in zip(block_sizes, states) if b > 1 or state == "off"]
    if not block_sizes:
        return None
    chosen = max(chosen_block or 0, max(block_sizes))
    if all(b == chosen for b in block_sizes):
        return None
    counts = Counter(block_sizes)
    others = sorted((b for b in counts if b != chosen), key=lambda b: -counts[b])
    main = others[0]
    rest = [f"{b} for {counts[b]}" for b in sorted(counts, reverse=True) if b != main]
    text = (f"fallback: block {chosen}→{main} for {counts[main]} of {len(block_sizes)} cycles"
            + (f" ({', '.join(rest)})" if rest else ""))
    if block_sizes[0] < chosen:
        text += (f"; it started at block {block_sizes[0]}, where the previous reply with these settings "
                 "left fallback, so τ differs from a reply that starts at full blocks")
    return text


def _decode(run) -> tuple[float, int, int] | None:
    """(decode ms after the first token, cycles, tokens after the first) of a Run's timeline."""
    if run is None or len(run.timeline) < 2:
        return None
    (start, first), (end, last) = run.timeline[0], run.timeline[-1]
    return end - start, len(run.timeline) - 1, last - first


def compare_story(estimate: dict | None, comparison) -> str:
    """Compare's measurement next to the reply's estimate, and why they differ when they do.

    ``estimate``: {"speedup", "tau", "steps"} of the stored reply (``ReplyTrace``), or None when
    it was recorded without measured costs."""
    measured = comparison.speedup
    fast = comparison.dflash if comparison.dflash is not None else comparison.stored
    plain, dflash = _decode(comparison.plain), _decode(fast)
    if not measured or not estimate or not estimate.get("speedup") or plain is None or dflash is None:
        return ""
    plain_ms, plain_steps, _ = plain
    cycle_ms, cycles, tokens = dflash
    if plain_ms <= 0 or cycles == 0 or cycle_ms <= 0:  # no time to divide by: no story to tell
        return ""
    step_ms = plain_ms / plain_steps
    tau_now, steps_now = tokens / cycles, (cycle_ms / cycles) / step_ms
    text = (f"The estimate under the reply, ~{estimate['speedup']:.2f}×, is τ {estimate['tau']:.2f} ÷ a cycle's "
            f"cost of {estimate['steps']:.2f} plain steps measured when the model loaded. Measured now: τ "
            f"{tau_now:.2f} ÷ {steps_now:.2f} plain steps = {tau_now / steps_now:.2f}× in the decode loop, "
            f"{measured:.2f}× in tokens per second.")
    if abs(measured / estimate["speedup"] - 1) <= ESTIMATE_ERROR:
        return text + f" They agree within the estimate's ±{ESTIMATE_ERROR:.0%}."
    reasons = []
    if steps_now > estimate["steps"] * (1 + ESTIMATE_ERROR):
        reasons.append(f"a cycle cost {steps_now / estimate['steps']:.1f}× what the estimate assumed (the "
                       "context is longer than the 128 tokens it was measured at, or the machine is busier now)")
    elif steps_now < estimate["steps"] * (1 - ESTIMATE_ERROR):
        reasons.append("a cycle cost less than the estimate assumed (the machine was busier when the model loaded)")
    if abs(tau_now / estimate["tau"] - 1) > ESTIMATE_ERROR:
        reasons.append(f"τ was {tau_now:.2f} in the re-run against {estimate['tau']:.2f} in the reply "
                       "(fallback chose other block sizes, or sampling drew other tokens)")
    loop = tau_now / steps_now
    if abs(measured / loop - 1) > ESTIMATE_ERROR:
        reasons.append("the first token and per-token overheads, the same in both runs, weigh on a short reply")
    why = "; ".join(reasons) or "the machine's load changed between the runs"
    return text + f" They differ by more than the estimate's ±{ESTIMATE_ERROR:.0%} because {why}."
