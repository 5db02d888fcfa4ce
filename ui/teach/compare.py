"""Compare a stored reply with plain decoding: re-run its prompt with speculation off (same
settings and seed) on the engine worker, and DFlash again right after it (so that the speed
ratio comes from one back-to-back measurement on the same machine load), then say whether the outputs are
identical and how much faster DFlash was.

``run_comparison`` runs on the engine worker (``ctx.replies.run_job``); everything else is pure.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from engine.config import FallbackConfig, SamplingConfig
from engine.events import Cycle, Failed, Finished, Started
from engine.interface import capabilities_of

from .steps import first_text, reply_prompt

DEFAULT_SEED = 0  # stored replies carry no seed; at T > 0 both runs of a comparison use this one


@dataclass
class Run:
    """One generation, reduced to what the comparison shows."""

    label: str
    text: str = ""
    token_ids: tuple[int, ...] = ()
    tokens_per_s: float | None = None
    total_ms: float = 0.0
    prefill_ms: float = 0.0
    cycles: int = 0
    mean_tau: float | None = None
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (ms since start, tokens so far)
    pieces: list[str] = field(default_factory=list)  # the text each timeline point added (a race replays it)
    error: str | None = None

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids) if self.token_ids else (self.timeline[-1][1] if self.timeline else 0)


def collect(label: str, events) -> Run:
    """Drain one generation's events into a ``Run`` (a ``Failed`` event becomes ``error``)."""
    run = Run(label)
    elapsed, tokens = 0.0, 0
    for event in events:
        if isinstance(event, Started):
            run.prefill_ms = elapsed = float(event.prefill_ms)
            tokens = 1
            run.timeline.append((elapsed, tokens))
            run.pieces.append(event.first_text)
        elif isinstance(event, Cycle):
            elapsed += event.draft_ms + event.verify_ms
            tokens += event.tau
            run.timeline.append((elapsed, tokens))
            run.pieces.append(event.emitted_text)
        elif isinstance(event, Finished):
            run.text, run.token_ids = event.text, tuple(event.token_ids)
            run.tokens_per_s, run.total_ms = event.tokens_per_s, event.total_ms
            run.cycles, run.mean_tau = event.cycles, event.mean_acceptance_length or None
        elif isinstance(event, Failed):
            run.error = event.message
    return run


def stored_run(message: dict, cycles: list[dict]) -> Run:
    """The stored reply as a ``Run`` (its text, tokens/s and timeline from its cycles)."""
    run = Run("stored reply", text=message.get("content") or "", tokens_per_s=message.get("tokens_per_s"),
              total_ms=float(message.get("total_ms") or 0.0), prefill_ms=float(message.get("prefill_ms") or 0.0),
              cycles=len(cycles))
    elapsed, tokens = run.prefill_ms, 1
    run.timeline.append((elapsed, tokens))
    run.pieces.append(first_text(run.text, cycles))
    for cycle in cycles:
        elapsed += float(cycle.get("draft_ms") or 0.0) + float(cycle.get("verify_ms") or 0.0)
        tokens += int(cycle.get("tau") or len(cycle.get("emitted_pieces") or ()))
        run.timeline.append((elapsed, tokens))
        run.pieces.append("".join(str(p) for p in cycle.get("emitted_pieces") or ()))
    taus = [int(c.get("tau") or 0) for c in cycles]
    run.mean_tau = sum(taus) / len(taus) if taus else None
    return run


def sampling_from_settings(settings: dict) -> tuple[SamplingConfig, FallbackConfig]:
    """The reply's stored settings as engine configs (a fixed seed when none was stored)."""
    seed = settings.get("seed")
    sampling = SamplingConfig(
        max_new_tokens=int(settings.get("max_new_tokens") or 256),
        block_size=int(settings["block_size"]) if settings.get("block_size") else None,
        temperature=float(settings.get("temperature") or 0.0),
        top_p=float(settings.get("top_p") or 1.0),
        top_k=int(settings.get("top_k") or 0),
        seed=int(seed) if seed is not None else DEFAULT_SEED,
    )
    return sampling, FallbackConfig(enabled=bool(settings.get("fallback", False)))


@dataclass
class Comparison:
    stored: Run
    plain: Run
    dflash: Run | None  # DFlash re-run right after the plain run (None when it was skipped)
    temperature: float
    model_note: str = ""  # set when the reply was made by another model than the one loaded now
    method: str = ""  # how the engine measured plain decoding (engine.interface.Capabilities.plain_decoding)

    @property
    def identical(self) -> bool:
        return not self.plain.error and self.plain.text == self.stored.text

    @property
    def dflash_identical(self) -> bool | None:
        if self.dflash is None or self.dflash.error:
            return None
        return self.dflash.text == self.plain.text

    @property
    def speedup(self) -> float | None:
        """DFlash tokens/s over plain tokens/s, both measured now, back to back (else the stored reply's)."""
        fast = self.dflash if self.dflash is not None and self.dflash.tokens_per_s else self.stored
        if not fast.tokens_per_s or not self.plain.tokens_per_s:
            return None
        return fast.tokens_per_s / self.plain.tokens_per_s

    def first_difference(self) -> int | None:
        """Index of the first differing character between the stored reply and the plain run."""
        a, b = self.stored.text, self.plain.text
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return i
        return None if len(a) == len(b) else min(len(a), len(b))


# ---------------------------------------------------------------------------- a comparison kept with its reply

RECORD_VERSION = 1  # the shape of ``comparison_record``; a reader skips records of another version


def run_record(run: Run | None) -> dict | None:
    """A run as JSON-ready values: its figures and, per timeline point, (ms, tokens so far, text added)."""
    if run is None:
        return None
    return {"label": run.label, "text": run.text, "tokens": run.new_tokens, "tokens_per_s": run.tokens_per_s,
            "total_ms": run.total_ms, "prefill_ms": run.prefill_ms, "cycles": run.cycles, "mean_tau": run.mean_tau,
            "error": run.error,
            "steps": [[round(float(ms), 3), int(n), piece] for (ms, n), piece in zip(run.timeline, run.pieces)]}


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def run_from_record(record) -> Run | None:
    """The ``Run`` a ``run_record`` describes (None for anything that is not one)."""
    if not isinstance(record, dict) or not isinstance(record.get("steps"), list):
        return None
    run = Run(str(record.get("label") or ""), text=str(record.get("text") or ""),
              tokens_per_s=_number(record.get("tokens_per_s")), total_ms=_number(record.get("total_ms")) or 0.0,
              prefill_ms=_number(record.get("prefill_ms")) or 0.0, cycles=int(_number(record.get("cycles")) or 0),
              mean_tau=_number(record.get("mean_tau")), error=record.get("error") or None)
    for step in record["steps"]:
        if isinstance(step, list) and len(step) == 3 and _number(step[0]) is not None and _number(step[1]) is not None:
            run.timeline.append((float(step[0]), int(step[1])))
            run.pieces.append(str(step[2]))
    return run


def comparison_record(comparison: Comparison, model: str = "") -> dict:
    """What Compare measured, as JSON-ready values (the store keeps it with the reply; a shared
    replay plays it as a race)."""
    c = comparison
    return {"version": RECORD_VERSION, "model": model, "method": c.method, "temperature": c.temperature,
            "note": c.model_note, "identical": c.identical, "dflash_identical": c.dflash_identical,
            "speedup": c.speedup, "plain": run_record(c.plain), "dflash": run_record(c.dflash)}


def comparison_from_record(record, stored: Run) -> Comparison | None:
    """The ``Comparison`` a stored record describes, against the stored reply (None when unreadable)."""
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return None
    plain = run_from_record(record.get("plain"))
    if plain is None:
        return None
    return Comparison(stored, plain, run_from_record(record.get("dflash")),
                      _number(record.get("temperature")) or 0.0, str(record.get("note") or ""),
                      str(record.get("method") or ""))


def run_comparison(engine, prompt, raw: bool, settings: dict, rerun_dflash: bool = True,
                   cancel: threading.Event | None = None) -> tuple[Run, Run | None]:
    """On the engine worker: plain decoding (block 1, no draft), then DFlash with the reply's settings."""
    sampling, fallback = sampling_from_settings(settings)
    ids = engine.encode(prompt, raw=raw)
    sampling = engine.check_request(ids, sampling)
    warm_up(engine, ids, sampling, cancel)
    plain = collect("plain decoding", engine.generate(
        ids, replace(sampling, block_size=1), FallbackConfig(enabled=False), cancel,
        slot_details=False, speculative=False))
    dflash = None
    if rerun_dflash and getattr(engine, "speculative", True) and not (cancel is not None and cancel.is_set()):
        dflash = collect("DFlash (re-run now)", engine.generate(ids, sampling, fallback, cancel, slot_details=False))
    return plain, dflash


def rerun_settings(message: dict, cycles: list[dict]) -> tuple[dict, int | None]:
    """The settings to re-run a stored reply with, and the tokens it produced: a stopped reply is
    compared over the tokens it has."""
    settings = dict(message.get("settings") or {})
    produced = 1 + sum(int(c.get("tau") or 0) for c in cycles) if cycles else message.get("new_tokens")
    if message.get("status") != "complete" and produced:
        settings["max_new_tokens"] = int(produced)
    return settings, produced


def compare_stored_reply(engine, message: dict, messages: list[dict], cycles: list[dict],
                         cancel: threading.Event | None = None) -> Comparison:
    """On the engine worker: Compare for a stored reply (its prompt re-run plain, then DFlash)."""
    prompt, raw = reply_prompt(messages, message)
    settings, produced = rerun_settings(message, cycles)
    plain, dflash = run_comparison(engine, prompt, raw, settings, True, cancel)
    name = getattr(engine, "name", "")
    notes = []
    if message.get("model") and name and message["model"] != name:
        notes.append(f"This reply was made by {message['model']}; the model loaded now is {name}, "
                     "so the texts need not match.")
    if message.get("status") != "complete" and produced:
        notes.append(f"This reply was {message['status']} after {produced} tokens; both runs were limited to "
                     f"{produced} tokens.")
    return Comparison(stored_run(message, cycles), plain, dflash, float(settings.get("temperature") or 0.0),
                      " ".join(notes), capabilities_of(engine).plain_decoding)


def warm_up(engine, ids, sampling: SamplingConfig, cancel=None, tokens: int = 4) -> None:
    """A few untimed tokens of each kind of run first, so that neither timed run pays for
    first-call setup (allocations, kernel selection), which would be charged to whichever ran first."""
    short = replace(sampling, max_new_tokens=min(tokens, sampling.max_new_tokens))
    for _ in engine.generate(ids, replace(short, block_size=1), FallbackConfig(enabled=False), cancel,
                             slot_details=False, speculative=False):
        pass
    if getattr(engine, "speculative", True):
        for _ in engine.generate(ids, short, FallbackConfig(enabled=False), cancel, slot_details=False):
            pass


WHY_DIFFERENT_SAMPLED = (
    "At temperature {t:g} every token is a random sample from the target's distribution. DFlash draws its "
    "drafts from the draft's distribution and accepts or replaces them with random draws (speculative sampling), "
    "while plain decoding draws one sample per step, so the same seed is consumed differently and the texts part "
    "ways at the first token where the random draws differ. Both are exact samples from the same target "
    "distribution (DFlash is lossless in distribution); only greedy decoding (T = 0) must match token for token."
)
WHY_DIFFERENT_GREEDY = (
    "At temperature 0 DFlash must reproduce plain greedy decoding token for token, so a difference means the "
    "reply was made under other conditions (another model, an edited history, a stopped reply) or that the "
    "target's logits have near-ties that change with the batch shape (fp16/bf16 on a GPU)."
)


def why_different(comparison: Comparison) -> str:
    if comparison.identical:
        return ""
    if comparison.temperature > 0:
        return WHY_DIFFERENT_SAMPLED.format(t=comparison.temperature)
    return WHY_DIFFERENT_GREEDY
