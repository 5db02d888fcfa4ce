"""The DFlash decode loop (batch 1) as a generator of typed events.

prefill -> first token (the first anchor) and the prompt's target features; then each cycle:
draft one block [anchor, MASK*(B-1)] in ONE draft forward, verify [anchor, drafts] in ONE target
forward, accept the leading drafts the target agrees with, emit them plus the target's own bonus
token, crop the target cache to anchor + accepted drafts, and hand their features to the draft.
``B = 1`` is plain autoregressive decoding through the same loop (the baseline).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from .acceptance import AcceptanceCounts
from .config import FallbackConfig, SamplingConfig
from .detok import IncrementalDetokenizer
from .draft import DFlashDraftModel
from .errors import DFlashError
from .events import Cycle, DraftSlot, Event, Failed, Finished, Started
from .fallback import MemorySlot, make_policy
from .rope_limits import verify_limits
from .sampling import draw, leading_matches, sample, sampling_probs, speculative_accept
from .backends import EagerBackend

log = logging.getLogger(__name__)


def generate(
    target,
    draft: DFlashDraftModel | None,
    prompt_ids: Sequence[int],
    sampling: SamplingConfig,
    *,
    tokenizer=None,
    stop_token_ids: Sequence[int] = (),
    fallback: FallbackConfig | None = None,
    cancel: threading.Event | None = None,
    slot_details: bool = True,
    plain_steps: Mapping[int, float] | None = None,
    fallback_memory: MemorySlot | None = None,
    backend=None,
) -> Iterator[Event]:
    """Yield Started, Cycle..., then Finished; an exception becomes a final Failed event
    (logged with its traceback, never swallowed silently). ``plain_steps``: a cycle's measured
    cost in plain steps per block size (``Cycle.cost_in_plain_steps``), when known. ``backend``:
    how the forwards run (engine/backends.py; default eager)."""
    try:
        yield from _decode(target, draft, list(prompt_ids), sampling, tokenizer, set(stop_token_ids),
                           fallback or FallbackConfig(enabled=False), cancel, slot_details, plain_steps or {},
                           fallback_memory, backend or EagerBackend())
    except DFlashError as exc:
        yield Failed(kind=type(exc).__name__, message=str(exc))
    except Exception as exc:  # surfaced to the user as an event, with the traceback in the log
        log.exception("generation failed")
        yield Failed(kind=type(exc).__name__, message=f"{type(exc).__name__}: {exc}")


@torch.inference_mode()
def _decode(target, draft, prompt_ids, sampling, tokenizer, stop_ids, fallback, cancel, slot_details, plain_steps,
            memory, backend):
    device = target.device
    max_block = sampling.block_size or (draft.block_size if draft is not None else 1)
    speculative = draft is not None and max_block > 1
    policy = make_policy(fallback, max_block if speculative else 1, memory.memory if memory else None)
    chooser = TokenChooser(sampling, device)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids) if tokenizer is not None else None
    num_prompt = len(prompt_ids)
    max_length = num_prompt + sampling.max_new_tokens
    rope = verify_limits(target.config)  # a verify must not reach past a longrope / dynamic-NTK boundary
    session = backend.open(target, draft if speculative else None, max_length, max_block)
    try:
        # ---- prefill: the target's first token is the first anchor ----
        rope.start_reply(target)
        t0 = clock(device)
        logits, features = session.prefill(prompt_ids)
        anchor = chooser.first(logits)
        pending = [features] if speculative else []  # features not yet in the draft cache
        prefill_ms = (clock(device) - t0) * 1000
        reply = Reply(detok, anchor, plain_steps)
        yield Started(num_prompt, sampling.max_new_tokens, max_block, sampling.temperature,
                      anchor, reply.text_parts[0], prefill_ms, speculative)

        start, reason = num_prompt, None
        stopped = anchor in stop_ids
        while start + 1 < max_length and not stopped:
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            block = rope.block_room(start, min(policy.block_size, max_length - start))
            step = draft_and_verify(session, draft, pending, anchor, start, block, chooser, width=policy.block_size)
            if block > 1:
                pending = []  # the draft pass took every pending feature into its cache

            # ---- emit accepted drafts + the target's own token, cut at a stop token / the length ----
            emitted = cut_at_stop(step.emitted[: max_length - start - 1], stop_ids)
            stopped = emitted[-1] in stop_ids

            # ---- commit: the target cache kept anchor + accepted drafts; their features go to the draft ----
            if speculative:
                pending.append(step.features[:, : len(emitted)])
            decision = policy.observe(block, step.accepted, step.draft_ms, step.verify_ms)
            cycle = reply.add_cycle(step, emitted, start, decision, pending,
                                    (sampling, tokenizer) if slot_details else None)
            start += len(emitted)
            anchor = emitted[-1]
            yield cycle

        total_ms = (clock(device) - t0) * 1000
        if memory is not None:
            memory.keep(policy)
        yield reply.finish(reason or ("stop" if stopped else "length"), num_prompt, prefill_ms, total_ms, max_block)
    finally:
        session.close()


@dataclass(frozen=True)
class Verified:
    """One cycle's draft and verify: what was proposed, what the target chose, what it costs."""

    drafts: list[int]  # the B-1 proposals
    draft_logits: torch.Tensor | None  # [B-1, V]; None at block 1
    target_logits: torch.Tensor  # [B, V]: position j predicts the token after [anchor, drafts[:j]]
    chosen: list[int]  # the target's token at each verified position
    accepted: int  # leading drafts the target accepted
    draft_ms: float
    verify_ms: float
    features: torch.Tensor | None = None  # [1, B, k*H]: the target's features at the verified positions

    @property
    def emitted(self) -> list[int]:
        """Accepted drafts plus the target's own token at the first mismatch (the bonus)."""
        return self.drafts[: self.accepted] + [self.chosen[self.accepted]]


def draft_and_verify(session, draft, pending, anchor, start, block, chooser, width: int | None = None) -> Verified:
    """ONE draft forward fills the block's B-1 mask slots (none at block 1); ONE target forward
    verifies [anchor, drafts] at positions start..start+B-1 (a static backend pads it to
    ``width``, the policy's block); the target cache then keeps the anchor and the accepted
    drafts only (the rollback is part of the verify's cost)."""
    device = session.target.device
    t_draft = clock(device)
    drafts, draft_logits, q = [], None, None
    if block > 1:
        argmax, draft_logits = propose(draft, session.target, session.draft_cache, pending, anchor, start, block)
        drafts, q = chooser.proposals(argmax, draft_logits)
    t_verify = clock(device)
    logits, features = session.verify([anchor] + drafts, start, width or block)
    accepted, chosen = chooser.verify(drafts, q, logits)
    session.commit(start + accepted + 1)
    t_done = clock(device)
    return Verified(drafts, draft_logits, logits, chosen, accepted,
                    (t_verify - t_draft) * 1000, (t_done - t_verify) * 1000, features)


class Reply:
    """What one generation has emitted so far (tokens, text pieces, cycles), and the events
    that describe it: a ``Cycle`` per step (with its detokenised pieces and slot details) and
    the closing ``Finished``."""

    def __init__(self, detok: IncrementalDetokenizer | None, first_token: int, plain_steps: Mapping[int, float]):
        self.detok = detok
        self.plain_steps = plain_steps
        self.tokens = [first_token]
        self.text_parts = [detok.push(first_token) if detok else ""]
        self.cycles: list[Cycle] = []

    def _push(self, tokens: list[int]) -> list[str]:
        return [self.detok.push(t) for t in tokens] if self.detok else [""] * len(tokens)

    def add_cycle(self, step: Verified, emitted: list[int], start: int, decision, pending,
                  slot_context: tuple | None) -> Cycle:
        """The Cycle event for ``step`` (``emitted`` is its output after the stop/length cut);
        ``slot_context`` = (sampling, tokenizer) when the teaching view wants per-slot details."""
        accepted, produced = step.accepted, len(emitted)
        accepted_pieces = self._push(emitted[:accepted])
        rejected = step.drafts[accepted:]
        rejected_pieces = self.detok.peek(rejected) if self.detok else [""] * len(rejected)
        pieces = (accepted_pieces + self._push(emitted[accepted:]))[:produced]
        slots = ()
        if slot_context is not None and step.drafts:
            slots = describe_slots(step.drafts, step.draft_logits, step.target_logits, step.chosen, accepted,
                                   *slot_context)
        cycle = Cycle(
            index=len(self.cycles) + 1, block_size=len(step.drafts) + 1, anchor=self.tokens[-1],
            anchor_position=start, draft_tokens=tuple(step.drafts), accepted=accepted,
            bonus=step.chosen[accepted] if produced == accepted + 1 else None,
            emitted=tuple(emitted), emitted_pieces=tuple(pieces),
            rejected=tuple(rejected), rejected_pieces=tuple(rejected_pieces), slots=slots,
            draft_ms=step.draft_ms, verify_ms=step.verify_ms, fallback=decision,
            context_length=start + produced, new_context_features=sum(p.shape[1] for p in pending),
            cost_in_plain_steps=self.plain_steps.get(len(step.drafts) + 1),
        )
        self.cycles.append(cycle)
        self.tokens.extend(emitted)
        self.text_parts.extend(pieces)
        return cycle

    def finish(self, reason, num_prompt: int, prefill_ms: float, total_ms: float, max_block: int) -> Finished:
        if self.detok is not None:
            self.text_parts.append(self.detok.flush())
        return Finished(
            reason=reason, token_ids=tuple(self.tokens), text="".join(self.text_parts),
            acceptance_lengths=tuple(c.tau for c in self.cycles), prompt_tokens=num_prompt,
            prefill_ms=prefill_ms, decode_ms=total_ms - prefill_ms, total_ms=total_ms, cycles=len(self.cycles),
            per_position_acceptance=per_position_acceptance(self.cycles, max_block),
        )


# ------------------------------------------------------------------ small helpers


def propose(draft, target, draft_cache, pending, anchor, start, block):
    """One draft forward on [anchor, MASK*...] with the new context features. Returns the
    block-1 argmax proposals and their logits [block-1, V] (at T > 0 ``TokenChooser.proposals``
    may draw the drafts from those logits instead).

    A smaller block than the draft's own (fallback's reduced mode, the last block, a user's
    choice) still drafts the full trained block and verifies only its first slots: the mask
    slots attend to each other, so a shorter block of masks is a layout the draft never saw
    (measured on the tiny coder: block 4 gave τ 2.32 that way against 2.57 from a full block)."""
    context = torch.cat(pending, dim=1)
    device = context.device
    width = max(block, draft.block_size)
    block_ids = torch.full((1, width), draft.mask_token_id, dtype=torch.long, device=device)
    block_ids[0, 0] = anchor
    noise = draft.embed(target.get_input_embeddings(), block_ids)
    context = context.to(noise.dtype)
    if draft_cache is not None:
        hidden = draft_cache.run(draft, noise, context, start)
    else:
        hidden = draft(noise, context, torch.arange(start - context.shape[1], start + width, device=device)[None])
    return draft.draft_tokens(hidden[0, 1:block], anchor, target.get_output_embeddings())


class TokenChooser:
    """The target's choices: argmax at T = 0 (accept while equal); speculative sampling at
    T > 0 (``sampling.speculative_accept``, seeded), with proposals from the draft's own
    distribution or its argmax (``SamplingConfig.proposal``)."""

    def __init__(self, sampling: SamplingConfig, device):
        self.sampling = sampling
        self.generator = None
        if sampling.temperature > 0:
            self.generator = torch.Generator(device=device)
            if sampling.seed is not None:
                self.generator.manual_seed(sampling.seed)
            else:
                self.generator.seed()

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        s = self.sampling
        return sampling_probs(logits, s.temperature if s.temperature > 0 else 1.0, s.top_p, s.top_k)

    def first(self, logits: torch.Tensor) -> int:
        """The prefill's token from the last position's logits [1, V]."""
        if self.generator is None:
            return int(logits[-1].argmax())
        return int(sample(self.probs(logits[-1:]), self.generator)[0])

    def proposals(self, argmax: list[int], draft_logits: torch.Tensor) -> tuple[list[int], torch.Tensor | None]:
        """The drafts to verify and the distribution q they were drawn from (None: one-hot)."""
        if self.generator is None or self.sampling.proposal == "argmax":
            return argmax, None
        q = self.probs(draft_logits)
        return draw(q, self.generator), q

    def verify(self, drafts: list[int], q: torch.Tensor | None, logits: torch.Tensor) -> tuple[int, list[int]]:
        """(accepted, the target's token at each position): the accepted drafts, then the
        correction or bonus; past it (never emitted) the target's argmax, for the teaching view."""
        if self.generator is None:
            chosen = logits.argmax(dim=-1).tolist()
            return leading_matches(drafts, chosen), chosen
        accepted, token = speculative_accept(drafts, q, self.probs(logits), self.generator)
        rest = logits[accepted + 1:].argmax(dim=-1).tolist()
        return accepted, drafts[:accepted] + [token] + rest


def cut_at_stop(tokens: list[int], stop_ids: set[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[: i + 1]
    return tokens


def clock(device) -> float:
    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def describe_slots(drafts, draft_logits, target_logits, chosen, accepted, sampling, tokenizer) -> tuple[DraftSlot, ...]:
    """Per draft slot: the draft's top-3, the target's probability of the drafted token, the verdict."""
    temperature = sampling.temperature if sampling.temperature > 0 else 1.0
    draft_probs = torch.softmax(draft_logits.float() / temperature, dim=-1)
    top_p, top_i = draft_probs.topk(3, dim=-1)
    target_probs = torch.softmax(target_logits[: len(drafts)].float() / temperature, dim=-1)
    drafted_p = target_probs.gather(-1, torch.tensor(drafts, device=target_probs.device)[:, None])[:, 0].tolist()
    text = (lambda t: tokenizer.decode([t])) if tokenizer is not None else str
    slots = []
    for j, token in enumerate(drafts):
        verdict = "accepted" if j < accepted else ("rejected" if j == accepted else "unverified")
        top = tuple((int(i), text(int(i)), round(float(p), 4)) for i, p in zip(top_i[j].tolist(), top_p[j].tolist()))
        slots.append(DraftSlot(token, text(token), top, round(drafted_p[j], 4), chosen[j], verdict))
    return tuple(slots)


def per_position_acceptance(cycles: list[Cycle], max_block: int) -> tuple[float, ...]:
    """P(slot j accepted | slot j was drafted), j = 1..max_block-1 (``engine.acceptance``)."""
    counts = AcceptanceCounts.of((min(c.block_size, max_block), c.accepted, c.tau) for c in cycles)
    return tuple(counts.per_position_acceptance)

