"""Engine events to OpenAI-shaped objects: chat.completion(.chunk), text_completion, usage, and
the ``dflash`` extension. Pure functions and one tally; no I/O.

``usage.completion_tokens_details`` follows OpenAI's predicted-outputs fields:
``accepted_prediction_tokens`` = draft tokens the target confirmed that are in the reply,
``rejected_prediction_tokens`` = draft tokens the target refused (verified, then thrown away).

``dflash`` on each streamed chunk: ``cycle`` (0 = the target's first token, from the prompt
pass), ``block_size``, ``accepted``, and ``origins`` (one per token the cycle emitted:
``prefill`` | ``accepted`` | ``bonus``). On the final chunk / response: ``block_size``,
``acceptance_lengths`` (τ per cycle), ``mean_acceptance_length``, ``per_position_acceptance``,
``draft_tokens``, ``accepted_tokens``, ``rejected_tokens``, ``fallback_changes``, timings.
An engine that does not report rejected drafts (vLLM) gets ``null`` there, and no
``rejected_prediction_tokens`` in ``usage``: left out, never invented.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.errors import CONTEXT_FULL
from engine.events import Cycle, Finished, Started

FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "stop"}


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass
class ReplyTally:
    """Everything the API reports about one reply, built from its events as they come."""

    text: str = ""  # the answer (a reasoning model's reasoning is apart, in ``reasoning``)
    reasoning: str = ""
    reasoning_tokens: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    block_size: int = 1
    speculative: bool = False
    accepted: int = 0
    rejected: int = 0
    drafted: int = 0
    taus: list[int] = field(default_factory=list)
    fallback_changes: list[dict] = field(default_factory=list)
    finished: Finished | None = None
    rejected_known: bool = True  # False for an engine that does not report rejected drafts (vLLM)

    def add(self, event) -> dict | None:
        """Count one event; return the per-chunk ``dflash`` object for the text it adds."""
        if isinstance(event, Started):
            self.prompt_tokens, self.block_size, self.speculative = event.prompt_tokens, event.block_size, event.speculative
            self.text, self.completion_tokens = event.first_answer_text, 1
            self.reasoning = event.first_text if event.first_part == "reasoning" else ""
            self.reasoning_tokens = int(event.first_part == "reasoning")
            return {"cycle": 0, "block_size": event.block_size, "accepted": 0, "origins": ["prefill"]}
        if isinstance(event, Cycle):
            return self._add_cycle(event)
        if isinstance(event, Finished):
            self.finished = event
            self.prompt_tokens = event.prompt_tokens
            self.completion_tokens = event.new_tokens
            if event.text or event.reason == "stop":  # a stop string may have cut earlier text
                self.text = event.text
            if event.reasoning_tokens:
                self.reasoning, self.reasoning_tokens = event.reasoning, event.reasoning_tokens
        return None

    def _add_cycle(self, cycle: Cycle) -> dict:
        origins = list(cycle.origins())
        self.text += cycle.answer_text
        parts = cycle.parts()
        self.reasoning += "".join(p for p, part in zip(cycle.emitted_pieces, parts) if part == "reasoning")
        self.reasoning_tokens += parts.count("reasoning")
        self.completion_tokens += len(cycle.emitted)
        self.accepted += origins.count("accepted")
        self.rejected += len(cycle.rejected)
        self.drafted += len(cycle.draft_tokens)
        self.taus.append(cycle.tau)
        if cycle.fallback.changed:
            self.fallback_changes.append({"cycle": cycle.index, "state": cycle.fallback.state,
                                          "next_block_size": cycle.fallback.next_block_size,
                                          "reason": cycle.fallback.reason})
        return {"cycle": cycle.index, "block_size": cycle.block_size, "accepted": cycle.accepted,
                "origins": origins}

    @property
    def finish_reason(self) -> str:
        return FINISH_REASONS.get(self.finished.reason if self.finished else "cancelled", "stop")

    def usage(self) -> dict:
        details = {"accepted_prediction_tokens": self.accepted, "reasoning_tokens": self.reasoning_tokens}
        if self.rejected_known:  # else left out, never invented
            details["rejected_prediction_tokens"] = self.rejected
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens, "completion_tokens_details": details}

    def summary(self) -> dict:
        """The final ``dflash`` object."""
        finished = self.finished
        taus = list(finished.acceptance_lengths) if finished is not None else self.taus
        return {
            "block_size": self.block_size, "speculative": self.speculative, "cycles": len(taus),
            "acceptance_lengths": taus,
            "mean_acceptance_length": round(sum(taus) / len(taus), 4) if taus else 0.0,
            "per_position_acceptance": [round(p, 4) for p in (finished.per_position_acceptance if finished else ())],
            "draft_tokens": self.drafted if self.rejected_known else None, "accepted_tokens": self.accepted,
            "rejected_tokens": self.rejected if self.rejected_known else None,
            "fallback_changes": self.fallback_changes,
            "cancelled": bool(finished is None or finished.reason == "cancelled"),
            "prefill_ms": round(finished.prefill_ms, 2) if finished else None,
            "total_ms": round(finished.total_ms, 2) if finished else None,
            "tokens_per_s": round(finished.tokens_per_s, 2) if finished else None,
            "finish_note": CONTEXT_FULL if finished is not None and finished.context_full else "",
        }


@dataclass(frozen=True)
class Envelope:
    """The fields every object of one response shares."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    kind: str = "chat"  # "chat" | "complete"

    def _base(self, object_: str) -> dict:
        return {"id": self.id, "object": object_, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def chunk(self, text: str | None, finish_reason: str | None = None, dflash: dict | None = None,
              first: bool = False, reasoning: str = "") -> dict:
        """One streamed chunk carrying ``text`` (chat: a delta; completions: the text) and, from a
        reasoning model, the ``reasoning`` it adds (``reasoning_content``, as vLLM and DeepSeek send it)."""
        if self.kind == "chat":
            delta = {"role": "assistant", "content": text or ""} if first else ({"content": text} if text else {})
            if reasoning:
                delta["reasoning_content"] = reasoning
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            body = self._base("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            body = self._base("text_completion")
        body["choices"] = [choice]
        if dflash is not None:
            body["dflash"] = dflash
        return body

    def usage_chunk(self, tally: ReplyTally) -> dict:
        body = self._base("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        body.update(choices=[], usage=tally.usage())
        return body

    def response(self, tally: ReplyTally) -> dict:
        """The whole (non-streamed) response."""
        if self.kind == "chat":
            body = self._base("chat.completion")
            message = {"role": "assistant", "content": tally.text, "refusal": None}
            if tally.reasoning_tokens:
                message["reasoning_content"] = tally.reasoning
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": tally.finish_reason}
        else:
            body = self._base("text_completion")
            choice = {"index": 0, "text": tally.text, "logprobs": None, "finish_reason": tally.finish_reason}
        body.update(choices=[choice], usage=tally.usage(), dflash=tally.summary())
        return body
