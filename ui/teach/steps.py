"""The Teach tab's data: one ``TeachStep`` per stored cycle of a reply, built by pure functions
from the store's cycle dicts (``SessionStore.get_cycles``) and the reply's text.

A step says what the draft saw (``[anchor, MASK, …]``), what it proposed per slot (its top-3
with probabilities), the target's verdict per slot, the bonus token, the text before and after,
the cache bookkeeping and a plain-language caption. No gradio, no torch: the renderer
(``ui.teach.render``) and the tests read only these values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from engine.prompts import heal_code_prompt
from storage.records import stored_model

Verdict = Literal["anchor", "accepted", "rejected", "unverified", "bonus"]
VERDICTS = ("anchor", "accepted", "rejected", "unverified", "bonus")
MASK = "MASK"


@dataclass(frozen=True)
class SlotView:
    """One element of ``#teach-slots``: the anchor (slot 0), a draft slot (1..B-1) or the bonus."""

    slot: int  # block position: 0 anchor, 1..B-1 drafts; the bonus sits at accepted + 1
    verdict: Verdict
    text: str  # the token shown (the draft's proposal; the anchor; the target's bonus token)
    token: int | None = None
    draft_top: tuple[tuple[int | None, str, float], ...] = ()  # the draft's top-3 (token, text, p)
    target_prob: float | None = None  # the target's probability of the drafted token
    target_token: int | None = None  # what the target chose at this position (verified slots)
    target_text: str | None = None  # its text, where we know it (accepted: the draft; rejected: the bonus)


@dataclass(frozen=True)
class TeachStep:
    index: int  # 1-based cycle number
    total: int  # cycles in the reply
    block_size: int
    accepted: int
    tau: int  # tokens this cycle produced (accepted + bonus, cut at a stop token/length)
    anchor_text: str
    anchor_position: int | None
    slots: tuple[SlotView, ...]  # anchor, the B-1 draft slots, then the bonus (when there is one)
    emitted_pieces: tuple[str, ...]
    rejected_pieces: tuple[str, ...]
    bonus_text: str | None
    text_before: str  # the reply's text up to and including the anchor
    draft_ms: float
    verify_ms: float
    cache_before: int | None  # target cache length before the verify pass
    cache_after: int | None  # after the commit (anchor + accepted drafts kept)
    new_context_features: int | None
    fallback_state: str
    fallback_changed: bool
    fallback_reason: str
    next_block_size: int | None
    engine_note: str = ""  # what the engine that made the reply cannot report (vLLM: rejected drafts)

    @property
    def verdicts(self) -> list[str]:
        return [slot.verdict for slot in self.slots]

    @property
    def draft_slots(self) -> tuple[SlotView, ...]:
        return tuple(s for s in self.slots if s.verdict in ("accepted", "rejected", "unverified"))

    @property
    def bonus(self) -> SlotView | None:
        return next((s for s in self.slots if s.verdict == "bonus"), None)

    @property
    def emitted_text(self) -> str:
        return "".join(self.emitted_pieces)

    @property
    def text_after(self) -> str:
        return self.text_before + self.emitted_text

    @property
    def draft_view(self) -> list[str]:
        """The block as the draft sees it: the anchor, then a mask in every other slot."""
        return [self.anchor_text] + [MASK] * (self.block_size - 1)

    @property
    def cut(self) -> bool:
        """The reply ended inside this block (a stop token or the length limit): no bonus."""
        return self.bonus is None and self.block_size > 0

    @property
    def cache_line(self) -> str:
        parts = []
        if self.cache_before is not None and self.cache_after is not None:
            kept = self.cache_after - self.cache_before
            parts.append(f"target cache {self.cache_before} → {self.cache_after} tokens "
                         f"(verified {self.block_size}, kept {kept})")
        if self.new_context_features is not None:
            noun = "feature" if self.new_context_features == 1 else "features"
            parts.append(f"{self.new_context_features} new context {noun} for the draft")
        return "; ".join(parts)


# ---------------------------------------------------------------------------- building


def first_text(content: str, cycles: list[dict]) -> str:
    """The prefill token's text: the reply's text before the first cycle's pieces (a stored
    reply's content is the prefill token, then every cycle's pieces, then a final flush)."""
    emitted = "".join("".join(c.get("emitted_pieces") or []) for c in cycles)
    if not emitted:
        return content
    guess = len(content) - len(emitted)
    if guess >= 0 and content[guess:] == emitted:
        return content[:guess]
    found = content.find(emitted)
    return content[:found] if found >= 0 else ""


def _top(slot: dict) -> tuple[tuple[int | None, str, float], ...]:
    out = []
    for entry in slot.get("draft_top") or ():
        if isinstance(entry, (list, tuple)) and len(entry) >= 3:
            out.append((entry[0], str(entry[1]), float(entry[2])))
    return tuple(out)


def draft_slot_views(cycle: dict) -> list[SlotView]:
    """The B-1 draft slots of a cycle with their stored verdicts (or, when the reply was stored
    without slot details, verdicts derived from the accepted count)."""
    block, accepted = int(cycle["block_size"]), int(cycle["accepted"])
    stored = list(cycle.get("slots") or [])
    drafts = list(cycle.get("draft_tokens") or [])
    rejected_pieces = list(cycle.get("rejected_pieces") or [])
    emitted_pieces = list(cycle.get("emitted_pieces") or [])
    views = []
    for j in range(max(block - 1, 0)):
        slot = stored[j] if j < len(stored) and isinstance(stored[j], dict) else {}
        if slot.get("verdict") in ("accepted", "rejected", "unverified"):
            verdict = slot["verdict"]
        else:
            verdict = "accepted" if j < accepted else ("rejected" if j == accepted else "unverified")
        text = slot.get("text")
        if text is None:  # no slot details: the pieces the cycle kept
            if j < accepted and j < len(emitted_pieces):
                text = emitted_pieces[j]
            elif j >= accepted and j - accepted < len(rejected_pieces):
                text = rejected_pieces[j - accepted]
            else:
                text = ""
        target_text = None
        if verdict == "accepted":
            target_text = text
        elif verdict == "rejected" and accepted < len(emitted_pieces):
            target_text = emitted_pieces[accepted]  # the target's correction is the bonus
        views.append(SlotView(
            slot=j + 1, verdict=verdict, text=str(text), token=slot.get("token", drafts[j] if j < len(drafts) else None),
            draft_top=_top(slot), target_prob=slot.get("target_prob"), target_token=slot.get("target_token"),
            target_text=target_text,
        ))
    return views


def build_steps(content: str, cycles: list[dict], engine_note: str = "") -> list[TeachStep]:
    """One step per cycle, in order; ``engine_note`` says what the engine did not report."""
    text = first_text(content, cycles)
    anchor_text = text  # the first anchor is the prefill token (the text before cycle 1)
    steps = []
    for cycle in cycles:
        block, accepted = int(cycle["block_size"]), int(cycle["accepted"])
        pieces = tuple(str(p) for p in cycle.get("emitted_pieces") or ())
        tau = int(cycle.get("tau") or len(pieces))
        bonus_id = cycle.get("bonus")
        has_bonus = bonus_id is not None and len(pieces) == accepted + 1
        slots = [SlotView(0, "anchor", anchor_text, cycle.get("anchor"))]
        slots += draft_slot_views(cycle)
        bonus_text = pieces[accepted] if has_bonus else None
        if has_bonus:
            slots.append(SlotView(accepted + 1, "bonus", bonus_text, bonus_id, target_token=bonus_id,
                                  target_text=bonus_text))
        position = cycle.get("anchor_position")
        after = cycle.get("context_length")
        fallback = cycle.get("fallback") or {}
        steps.append(TeachStep(
            index=int(cycle["index"]), total=len(cycles), block_size=block, accepted=accepted, tau=tau,
            anchor_text=anchor_text, anchor_position=position, slots=tuple(slots), emitted_pieces=pieces,
            rejected_pieces=tuple(str(p) for p in cycle.get("rejected_pieces") or ()), bonus_text=bonus_text,
            text_before=text, draft_ms=float(cycle.get("draft_ms") or 0.0),
            verify_ms=float(cycle.get("verify_ms") or 0.0),
            cache_before=position, cache_after=after,
            new_context_features=cycle.get("new_context_features"),
            fallback_state=str(fallback.get("state") or "fixed"), fallback_changed=bool(fallback.get("changed")),
            fallback_reason=str(fallback.get("reason") or ""), next_block_size=fallback.get("next_block_size"),
            engine_note=engine_note,
        ))
        text += "".join(pieces)
        if pieces:
            anchor_text = pieces[-1]
    return steps


# ---------------------------------------------------------------------------- words


def show_token(text: str | None) -> str:
    """A token made visible: spaces, newlines and tabs as symbols; empty as ∅ (not escaped)."""
    if text is None:
        return "–"
    if text == "":
        return "∅"
    return text.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥")


def quoted(text: str | None) -> str:
    return f"“{show_token(text)}”"


def caption(step: TeachStep) -> str:
    """What just happened, in plain words (plain text; the renderer escapes it)."""
    b, a = step.block_size, step.accepted
    if b <= 1:
        words = (f"Speculation was off for this cycle (block size 1): one plain target step after "
                 f"{quoted(step.anchor_text)} produced one token, {quoted(step.bonus_text)}.")
    else:
        drafts = b - 1
        words = (f"The draft filled all {drafts} mask slots after the anchor {quoted(step.anchor_text)} in ONE forward "
                 f"pass. The target then checked the whole block of {b} positions in ONE forward pass")
        rejected = next((s for s in step.draft_slots if s.verdict == "rejected"), None)
        if a >= drafts:
            words += " and agreed with every draft token."
        elif a == 0:
            wanted = f" (the target wanted {quoted(step.bonus_text)})" if step.bonus_text is not None else ""
            words += (f" and disagreed with the very first draft token {quoted(rejected.text if rejected else '')}"
                      f"{wanted}, so all {drafts} drafts were discarded.")
        else:
            target = f", target {quoted(step.bonus_text)}" if step.bonus_text is not None else ""
            words += (f": it agreed with the first {a} draft token{'s' if a != 1 else ''}, then disagreed at slot {a + 1} "
                      f"(draft {quoted(rejected.text if rejected else '')}{target}).")
            unverified = drafts - a - 1
            if unverified > 0:
                words += (f" The {unverified} draft token{'s' if unverified != 1 else ''} after it "
                          f"{'were' if unverified != 1 else 'was'} thrown away unverified: "
                          f"{'they were' if unverified != 1 else 'it was'} built on a wrong guess.")
        if step.bonus_text is not None:
            words += (f" The target's own token at the first open position, {quoted(step.bonus_text)}, comes free "
                      f"with the verify pass (the bonus): {step.tau} token{'s' if step.tau != 1 else ''} from one "
                      f"target pass, where plain decoding needs {step.tau}.")
        if step.bonus_text == "":
            words += (" “∅” marks a token with no text of its own" +
                      (": on the last cycle, the token that ends the reply." if step.index == step.total else "."))
    if step.cut:
        words += (f" The reply ended inside this block (a stop token or the length limit), so only {step.tau} "
                  f"token{'s' if step.tau != 1 else ''} {'were' if step.tau != 1 else 'was'} kept and there is no bonus.")
    if step.fallback_changed and step.fallback_reason:
        words += f" Dynamic fallback changed the next block size to {step.next_block_size}: {step.fallback_reason}."
    return words


@dataclass(frozen=True)
class ReplyNumbers:
    """This reply's numbers for the explainer."""

    cycles: int
    tokens: int  # tokens the cycles produced (the prefill token not included)
    new_tokens: int  # the whole reply, prefill token included
    verify_passes: int  # one per cycle
    draft_passes: int  # DFlash: one per cycle with a block > 1
    autoregressive_draft_passes: int  # an EAGLE-style drafter: B-1 sequential passes per cycle
    plain_passes: int  # plain decoding: one target pass per token after the prefill
    mean_tau: float | None
    max_block_size: int


def reply_numbers(steps: list[TeachStep]) -> ReplyNumbers:
    tokens = sum(s.tau for s in steps)
    speculative = [s for s in steps if s.block_size > 1]
    return ReplyNumbers(
        cycles=len(steps), tokens=tokens, new_tokens=tokens + 1, verify_passes=len(steps),
        draft_passes=len(speculative), autoregressive_draft_passes=sum(s.block_size - 1 for s in speculative),
        plain_passes=tokens, mean_tau=tokens / len(steps) if steps else None,
        max_block_size=max((s.block_size for s in steps), default=1),
    )


# ---------------------------------------------------------------------------- prompts


def reply_prompt(messages: list[dict], reply: dict,
                 model_key: Callable[[str], str] = lambda name: name) -> tuple[object, bool]:
    """The prompt a stored reply answered, as the app sent it: (prompt, raw). A "complete" reply
    continues the user's code as raw text; a chat reply sees the chat history before it, less the
    turns another model answered (the app sends each model only its own turns). ``model_key`` maps
    a stored model name to its pair, so an older name of the same pair counts as the same model."""
    before = [m for m in messages if m["seq"] < reply["seq"]]
    users = [m for m in before if m["role"] == "user"]
    if not users:
        raise ValueError("this reply has no user message before it")
    if reply.get("kind") == "complete" or users[-1].get("kind") == "complete":
        return heal_code_prompt(users[-1]["content"]), True
    own = model_key(stored_model(reply))
    kept: list[dict] = []
    asked: list[dict] = []
    for m in before:
        if m.get("kind", "chat") != "chat":
            continue
        if m["role"] == "user":
            asked.append(m)
        elif m["role"] == "assistant":
            if model_key(stored_model(m)) == own:
                kept.extend([*asked, m])
            asked = []
    kept.extend(asked)
    history = [{"role": m["role"], "content": m["content"]} for m in kept if m["content"]]
    return history, False
