"""The typed events one generation yields: ``Started``, one ``Cycle`` per draft+verify step,
then ``Finished`` or ``Failed``.

Plain frozen dataclasses with no torch inside, so that the UI, storage and the CLI can consume
them without importing torch. Token ids are ints, probabilities floats, times milliseconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Literal, Union

Origin = Literal["accepted", "bonus", "rejected"]
Part = Literal["reasoning", "answer"]  # what a token is part of (engine.reasoning reads it)
FinishReason = Literal["stop", "length", "cancelled"]
FallbackState = Literal["full", "reduced", "off", "fixed"]


@dataclass(frozen=True)
class LoadStatus:
    """Where loading a model stands: reported by the host that loads engines, shown by the UI.

    Not part of a generation's event stream; it lives here because it is a plain value that
    both the app (which loads) and the UI (which shows) need, and neither may own it for the other.
    """

    state: Literal["loading", "ready", "failed"]
    fraction: float = 0.0
    message: str = ""
    model_key: str = ""  # the model being loaded, or the one that is loaded
    error: str = ""  # why the last load failed (the previous model, if any, stays in use)


@dataclass(frozen=True)
class FallbackDecision:
    """What the fallback policy decided after a cycle: the block size of the NEXT cycle."""

    next_block_size: int
    state: FallbackState  # "fixed" when dynamic fallback is switched off
    changed: bool = False
    reason: str = ""


@dataclass(frozen=True)
class DraftSlot:
    """One draft slot (block position j = 1..B-1) of one cycle, for the teaching view."""

    token: int  # the token the draft proposed (its argmax; at T > 0 possibly a sample from its q)
    text: str  # that token on its own, for display
    draft_top: tuple[tuple[int, str, float], ...]  # the draft's top-3 (token, text, probability)
    target_prob: float  # the target's probability of the drafted token (at the sampling temperature)
    target_token: int  # the token the target chose at this position (argmax or sample)
    verdict: Literal["accepted", "rejected", "unverified"]


@dataclass(frozen=True)
class Started:
    prompt_tokens: int
    max_new_tokens: int
    block_size: int  # the block size asked for (B_max)
    temperature: float
    first_token: int  # the target's own token from prefill (the first anchor)
    first_text: str
    prefill_ms: float
    speculative: bool  # False when a draft is absent or block_size == 1
    first_part: Part = "answer"

    @property
    def first_answer_text(self) -> str:
        return self.first_text if self.first_part == "answer" else ""


@dataclass(frozen=True)
class Cycle:
    """One draft+verify step. ``emitted`` = accepted drafts + bonus, cut at a stop token/length."""

    index: int  # 1-based; 0 is the prefill token carried by Started
    block_size: int  # block size used in this cycle (1 = plain autoregressive step)
    anchor: int
    anchor_position: int  # absolute position of the anchor in the sequence
    draft_tokens: tuple[int, ...]  # B-1 proposals (empty when block_size == 1)
    accepted: int  # leading drafts the target confirmed
    bonus: int | None  # the target's own token ending the cycle; None when cut off
    emitted: tuple[int, ...]
    emitted_pieces: tuple[str, ...]  # text of each emitted token (never splits a UTF-8 char)
    rejected: tuple[int, ...]  # drafts after the first mismatch, including it
    rejected_pieces: tuple[str, ...]
    slots: tuple[DraftSlot, ...]
    draft_ms: float
    verify_ms: float
    fallback: FallbackDecision
    context_length: int  # target cache length after this cycle's commit
    new_context_features: int  # positions whose target features the draft receives next
    # What this cycle costs in plain steps (a verify of one token), from the engine's measured
    # costs for this model and block; None when not measured. tau / this = the cycle's speedup.
    cost_in_plain_steps: float | None = None
    # The part of each emitted / rejected token (engine.reasoning); empty: every token is answer
    emitted_parts: tuple[Part, ...] = ()
    rejected_parts: tuple[Part, ...] = ()

    @property
    def tau(self) -> int:
        """Acceptance length of this cycle (accepted + 1, cut at a stop token/length)."""
        return len(self.emitted)

    @property
    def emitted_text(self) -> str:
        return "".join(self.emitted_pieces)

    @property
    def rejected_text(self) -> str:
        return "".join(self.rejected_pieces)

    def parts(self) -> tuple[Part, ...]:
        return self.emitted_parts or ("answer",) * len(self.emitted)

    @property
    def answer_text(self) -> str:
        return "".join(p for p, part in zip(self.emitted_pieces, self.parts()) if part == "answer")

    def origins(self) -> tuple[Origin, ...]:
        """Origin of each emitted token: accepted drafts, then the target's bonus token."""
        return tuple("accepted" if i < self.accepted else "bonus" for i in range(len(self.emitted)))


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    token_ids: tuple[int, ...]  # generated ids only, the prefill token included, prompt excluded
    text: str
    acceptance_lengths: tuple[int, ...]  # one tau per cycle
    prompt_tokens: int
    prefill_ms: float
    decode_ms: float
    total_ms: float
    cycles: int
    per_position_acceptance: tuple[float, ...] = field(default=())  # P(slot j accepted | verified)
    context_full: bool = False  # reason "length" because the context window ran out (not max_new_tokens)
    reasoning: str = ""  # a reasoning model's reasoning; ``text`` is then the answer alone
    reasoning_tokens: int = 0  # of ``token_ids``, those in the reasoning (its markers included)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def mean_acceptance_length(self) -> float:
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths) if self.acceptance_lengths else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / (self.total_ms / 1000.0) if self.total_ms > 0 else 0.0


@dataclass(frozen=True)
class Failed:
    """The generation ended with an error; what was emitted before it is kept by consumers."""

    kind: str  # name of the exception class
    message: str
    interrupted: bool = False  # the engine went away mid-reply (a vLLM server died): the text so far stands


Event = Union[Started, Cycle, Finished, Failed]


def event_to_dict(event: Event) -> dict:
    """JSON-ready dict with a ``type`` field (used by the CLI's JSON, storage and the API)."""
    data = asdict(event)
    data["type"] = type(event).__name__
    if isinstance(event, Cycle):
        data["tau"] = event.tau
        for key in ("emitted_parts", "rejected_parts"):
            if not data[key]:  # a reply with no reasoning: every token is answer, nothing to store
                del data[key]
    if isinstance(event, Finished):
        data["mean_acceptance_length"] = event.mean_acceptance_length
        data["tokens_per_s"] = event.tokens_per_s
    return data


def mark_context_full(events, context_window: int):
    """Pass ``events`` through, marking a ``Finished`` cut at the context window (``context_full``):
    the edges then say "the context window is full" rather than a bare ``length``."""
    for event in events:
        if (isinstance(event, Finished) and event.reason == "length" and context_window
                and event.prompt_tokens + event.new_tokens >= context_window - 1):
            event = replace(event, context_full=True)
        yield event
