"""``ReplyTrace``: what one reply's decoding did, token by token, built from the engine's events
(live) or from stored cycle dicts (a past reply). The renderer and the charts read only this.

A live reply's ``Cycle`` events and a stored reply's cycle dicts (``SessionStore.get_cycles``)
both become ``TraceCycle``s, so they go through the same code. Pure values, no gradio, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from engine.acceptance import AcceptanceCounts
from engine.events import Cycle
from engine.fallback import VERIFY_STEPS_PRIOR  # a B-token verify ~ this many plain steps, until measured
from engine.interface import CAPABILITIES

from .speed import fallback_summary, speed_verdict

Origin = Literal["accepted", "bonus", "rejected", "prefill"]


def engine_note(kind: str | None) -> str:
    """The note for replies made by an engine of this kind (stored in each reply's settings)."""
    capabilities = CAPABILITIES.get(kind or "local")
    return capabilities.rejected_note if capabilities is not None and not capabilities.rejected_drafts else ""


@dataclass(frozen=True)
class Token:
    text: str
    origin: Origin  # "prefill" is the target's first token (drawn like a bonus token)
    cycle: int  # 0 for the prefill token
    slot: int  # position in the block: drafts at 1..B-1, the bonus at accepted + 1
    block_size: int
    draft_prob: float | None = None  # the draft's probability of its own proposal
    target_prob: float | None = None  # the target's probability of the drafted token
    part: str = "answer"  # "reasoning" for a reasoning model's reasoning (engine.reasoning)


@dataclass(frozen=True)
class FallbackMark:
    after_cycle: int
    state: str
    next_block_size: int
    reason: str


@dataclass(frozen=True)
class TraceCycle:
    """What a trace needs of one cycle. Built from a live ``Cycle`` event (typed, nothing to
    guess) or from a stored cycle dict, where older rows and figure-only rows may lack fields."""

    index: int
    block_size: int
    accepted: int
    tau: int
    emitted_pieces: tuple[str, ...] = ()
    rejected_pieces: tuple[str, ...] = ()
    slot_probs: tuple[tuple[float | None, float | None], ...] = ()  # per draft slot: (draft p, target p)
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    cost_in_plain_steps: float | None = None
    fallback_state: str = "fixed"
    fallback_changed: bool = False
    next_block_size: int | None = None
    fallback_reason: str = ""
    emitted_parts: tuple[str, ...] = ()  # empty: every token is answer
    rejected_parts: tuple[str, ...] = ()

    def part(self, j: int, rejected: bool = False) -> str:
        parts = self.rejected_parts if rejected else self.emitted_parts
        return parts[j] if j < len(parts) else "answer"

    def probs(self, j: int) -> tuple[float | None, float | None]:
        return self.slot_probs[j] if j < len(self.slot_probs) else (None, None)

    @classmethod
    def from_event(cls, cycle: Cycle) -> TraceCycle:
        probs = tuple((float(slot.draft_top[0][2]) if slot.draft_top else None, slot.target_prob)
                      for slot in cycle.slots)
        f = cycle.fallback
        return cls(cycle.index, cycle.block_size, cycle.accepted, cycle.tau, tuple(cycle.emitted_pieces),
                   tuple(cycle.rejected_pieces), probs, cycle.draft_ms, cycle.verify_ms, cycle.cost_in_plain_steps,
                   f.state, f.changed, f.next_block_size, f.reason, tuple(cycle.emitted_parts),
                   tuple(cycle.rejected_parts))

    @classmethod
    def from_stored(cls, row: Mapping) -> TraceCycle:
        """The one place that reads a stored cycle defensively."""
        pieces = tuple(row.get("emitted_pieces") or ())
        fallback = row.get("fallback") or {}
        return cls(int(row["index"]), int(row["block_size"]), int(row["accepted"]), int(row.get("tau") or len(pieces)),
                   pieces, tuple(row.get("rejected_pieces") or ()),
                   tuple(_stored_probs(slot) for slot in row.get("slots") or ()),
                   float(row.get("draft_ms") or 0.0), float(row.get("verify_ms") or 0.0),
                   row.get("cost_in_plain_steps"), str(fallback.get("state") or "fixed"), bool(fallback.get("changed")),
                   int(fallback["next_block_size"]) if fallback.get("next_block_size") else None,
                   str(fallback.get("reason") or ""), tuple(row.get("emitted_parts") or ()),
                   tuple(row.get("rejected_parts") or ()))


def _first_text(content: str, reasoning: str, cycles: list[TraceCycle]) -> tuple[str, str]:
    """The prefill token's text and part: what the stored answer (or reasoning) holds before
    the cycles' pieces of that part (a reply without cycles is drawn whole as one token)."""
    if not cycles:
        return "", "answer"
    for part, whole in (("answer", content), ("reasoning", reasoning)):
        emitted = "".join(piece for c in cycles for j, piece in enumerate(c.emitted_pieces) if c.part(j) == part)
        if whole and whole.endswith(emitted) and len(whole) > len(emitted):
            return whole[: len(whole) - len(emitted)], part
    return "", "answer"


def _stored_probs(slot) -> tuple[float | None, float | None]:
    """(draft probability, target probability) of one stored draft slot."""
    if not slot:
        return None, None
    top = slot.get("draft_top") or ()
    draft_p = float(top[0][2]) if top and len(top[0]) >= 3 else None
    target_p = slot.get("target_prob")
    return draft_p, (float(target_p) if target_p is not None else None)


@dataclass
class ReplyTrace:
    """Accumulates one reply. ``tokens`` hold emitted AND rejected tokens in display order:
    per cycle the accepted drafts, then the rejected drafts, then the target's bonus token."""

    tokens: list[Token] = field(default_factory=list)
    marks: list[FallbackMark] = field(default_factory=list)
    taus: list[int] = field(default_factory=list)
    block_sizes: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    cycle_ms: list[float] = field(default_factory=list)  # draft + verify per cycle
    cycle_steps: list[float | None] = field(default_factory=list)  # measured cost in plain steps per cycle
    cycle_parts: list[str] = field(default_factory=list)  # per cycle: the part of its first emitted token
    fallback_states: list[str] = field(default_factory=list)
    max_block_size: int = 1
    prefill_ms: float = 0.0
    finished: dict | None = None  # event_to_dict(Finished), or a stored message's stats
    error: str | None = None
    cancelled: bool = False
    engine_note: str = ""  # what the engine that made the reply cannot report (vLLM: rejected drafts)
    measured_timings: bool = True  # False: the engine does not time draft and verify (vLLM): no cost-based estimate

    # ------------------------------------------------------------------ building
    @classmethod
    def for_engine(cls, kind: str | None) -> "ReplyTrace":
        """An empty trace for a reply made by an engine of this kind (``local`` | ``vllm``)."""
        capabilities = CAPABILITIES.get(kind or "local")
        return cls(engine_note=engine_note(kind), measured_timings=capabilities is None or capabilities.timings)

    def start(self, first_text: str, block_size: int = 1, prefill_ms: float = 0.0, first_part: str = "answer") -> None:
        self.max_block_size = max(1, int(block_size or 1))
        self.prefill_ms = float(prefill_ms or 0.0)
        if first_text:
            self.tokens.append(Token(first_text, "prefill", 0, 0, self.max_block_size, part=first_part))

    def add_cycle(self, cycle: Cycle | Mapping) -> None:
        """One cycle: a live ``Cycle`` event, or a stored cycle dict (``SessionStore.get_cycles``)."""
        c = TraceCycle.from_event(cycle) if isinstance(cycle, Cycle) else TraceCycle.from_stored(cycle)
        index, block, accepted, pieces = c.index, c.block_size, c.accepted, c.emitted_pieces
        self.max_block_size = max(self.max_block_size, block)
        for j, piece in enumerate(pieces):
            if j < accepted:
                self.tokens.append(Token(piece, "accepted", index, j + 1, block, *c.probs(j), part=c.part(j)))
        for k, piece in enumerate(c.rejected_pieces):
            j = accepted + k
            self.tokens.append(Token(piece, "rejected", index, j + 1, block, *c.probs(j), part=c.part(k, True)))
        for j in range(accepted, len(pieces)):
            self.tokens.append(Token(pieces[j], "bonus", index, j + 1, block, part=c.part(j)))
        self.cycle_parts.append(c.part(0))
        self.taus.append(c.tau)
        self.block_sizes.append(block)
        self.accepted.append(accepted)
        self.cycle_ms.append(c.draft_ms + c.verify_ms)
        steps = c.cost_in_plain_steps
        self.cycle_steps.append(float(steps) if steps else (1.0 if block == 1 else None))
        self.fallback_states.append(c.fallback_state)
        if c.fallback_changed:
            self.marks.append(FallbackMark(index, c.fallback_state, c.next_block_size or block, c.fallback_reason))

    @classmethod
    def from_stored(cls, content: str, cycles: list[dict], message: dict | None = None) -> "ReplyTrace":
        """Rebuild a stored reply: its text holds the prefill token followed by every cycle's pieces."""
        reasoning = (message or {}).get("reasoning") or ""
        first, first_part = _first_text(content, reasoning, [TraceCycle.from_stored(c) for c in cycles])
        settings = (message or {}).get("settings") or {}
        trace = cls.for_engine(settings.get("engine"))
        trace.start(first, max([c["block_size"] for c in cycles] + [int(settings.get("block_size") or 1)]),
                    (message or {}).get("prefill_ms") or 0.0, first_part)
        for cycle in cycles:
            trace.add_cycle(cycle)
        if not cycles and content:
            trace.tokens.append(Token(content, "prefill", 0, 0, 1))
        if message:
            trace.finished = {key: message.get(key) for key in ("new_tokens", "tokens_per_s", "total_ms", "finish_reason")}
            trace.error = message.get("error")
            trace.cancelled = message.get("status") == "interrupted"
        return trace

    # ------------------------------------------------------------------ figures
    @property
    def text(self) -> str:
        """The answer (a reasoning model's reasoning is ``reasoning``)."""
        return "".join(t.text for t in self.tokens if t.origin != "rejected" and t.part == "answer")

    @property
    def reasoning(self) -> str:
        return "".join(t.text for t in self.tokens if t.origin != "rejected" and t.part == "reasoning")

    @property
    def reasoning_tokens(self) -> int:
        return sum(1 for t in self.tokens if t.origin != "rejected" and t.part == "reasoning")

    def acceptance_counts_of(self, part: str) -> AcceptanceCounts:
        """``acceptance_counts`` of the cycles that began in ``part`` (reasoning or answer)."""
        return AcceptanceCounts.of((b, a, t) for b, a, t, p in zip(self.block_sizes, self.accepted, self.taus,
                                                                   self.cycle_parts) if p == part)

    @property
    def new_tokens(self) -> int:
        return sum(1 for t in self.tokens if t.origin != "rejected")

    @property
    def cycles(self) -> int:
        return len(self.taus)

    @property
    def mean_tau(self) -> float | None:
        return sum(self.taus) / len(self.taus) if self.taus else None

    @property
    def current_block_size(self) -> int | None:
        return self.block_sizes[-1] if self.block_sizes else None

    @property
    def fallback_state(self) -> str | None:
        return self.fallback_states[-1] if self.fallback_states else None

    def acceptance_counts(self) -> AcceptanceCounts:
        return AcceptanceCounts.of(zip(self.block_sizes, self.accepted, self.taus))

    def per_position_acceptance(self) -> list[float]:
        """P(slot j accepted | slot j was drafted), j = 1..max block - 1 (``engine.acceptance``)."""
        return self.acceptance_counts().per_position_acceptance

    def tau_histogram(self) -> dict[int, int]:
        return self.acceptance_counts().sorted_tau_histogram()

    def cost_in_plain_steps(self) -> float | None:
        """Mean cost of this reply's cycles in plain steps, from the engine's measured costs for
        this model and each cycle's block (None for replies recorded without them)."""
        if not self.cycle_steps or any(s is None for s in self.cycle_steps):
            return None
        return sum(self.cycle_steps) / len(self.cycle_steps)

    def estimated_speedup(self) -> float | None:
        """Speedup over plain decoding: mean τ ÷ mean cycle cost in plain steps (measured costs).
        Replies recorded without measured costs: tokens per ms of the cycles over a plain step's
        cost (measured at block 1 when the reply has such cycles, else the largest block's
        verify / 1.5, the fallback policy's prior)."""
        steps = self.cost_in_plain_steps()
        if self.taus and steps:
            return (sum(self.taus) / len(self.taus)) / steps
        if not self.taus or sum(self.cycle_ms) <= 0 or not self.measured_timings:
            return None
        plain = [ms for ms, b in zip(self.cycle_ms, self.block_sizes) if b == 1]
        if plain:
            plain_ms = sum(plain) / len(plain)
        else:
            biggest = max(self.block_sizes)
            costs = [ms for ms, b in zip(self.cycle_ms, self.block_sizes) if b == biggest]
            plain_ms = sum(costs) / len(costs) / VERIFY_STEPS_PRIOR
        return sum(self.taus) / sum(self.cycle_ms) * plain_ms

    def estimate(self) -> dict | None:
        """The estimate's parts, {"speedup", "tau", "steps"}, when it rests on measured costs."""
        steps, speedup = self.cost_in_plain_steps(), self.estimated_speedup()
        if self.mean_tau is None or not steps or speedup is None:
            return None
        return {"speedup": speedup, "tau": self.mean_tau, "steps": steps}

    def speed_explanation(self) -> str | None:
        """Why this reply was as fast as it was, in one line: τ ÷ cycle cost = speedup."""
        steps, speedup = self.cost_in_plain_steps(), self.estimated_speedup()
        if self.mean_tau is None or not steps or speedup is None:
            return None
        verdict = speed_verdict(speedup, self.block_sizes)
        return (f"τ {self.mean_tau:.2f} ÷ cycle cost {steps:.2f} plain steps = {speedup:.2f}× "
                f"over plain decoding ({verdict})")

    def fallback_summary(self) -> str | None:
        """What dynamic fallback did to the block size in this reply (None: nothing)."""
        return fallback_summary(self.block_sizes, self.max_block_size, self.fallback_states)

    def tokens_per_s(self) -> float | None:
        if self.finished and self.finished.get("tokens_per_s"):
            return float(self.finished["tokens_per_s"])
        decode_ms = sum(self.cycle_ms) + self.prefill_ms
        return self.new_tokens / (decode_ms / 1000) if decode_ms > 0 and self.new_tokens else None
