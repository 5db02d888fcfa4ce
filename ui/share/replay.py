"""Share a reply's decoding: what a self-contained replay page (``ui.share.page``) and an
animated GIF (``ui.share.gif``) play, read from the store and built with Teach's own steps and captions.

``load_share(store, session_id, reply=None)`` reads one reply (default: the session's last one)
with its cycles, the prompt it answered and, when Compare ran on it, the stored comparison;
``replay_document(share)`` turns it into plain values: one frame per cycle (the block as the
draft saw it, the draft's proposals and the target's verdicts, the tokens the cycle added, a
caption for students, the running speed against plain decoding) and, with a comparison, a race
of plain decoding against DFlash on one clock. No gradio: the CLI and the Teach tab call it.

The final frame's kept tokens (accepted + bonus) read exactly as the stored reply: a reply a
stop string cut keeps only the part of its last tokens the user got.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine.fallback import VERIFY_STEPS_PRIOR
from storage.records import number_replies

from ..chat.trace import ReplyTrace, engine_note
from ..context import STORE_ERRORS
from ..teach.compare import Comparison, comparison_from_record, stored_run, why_different
from ..teach.steps import TeachStep, build_steps, caption, first_text

PROMPT_CHARS = 4000  # the prompt is context for the viewer; a long one is cut (the reply never is)


class ShareError(ValueError):
    """A reply that cannot be shared, said in words for the user."""


@dataclass(frozen=True)
class ShareReply:
    """One stored reply and what the page needs around it."""

    session_title: str
    session_model: str
    message: dict
    prompt: str  # the user message it answered (as text)
    cycles: list[dict]
    comparison: Comparison | None = None  # Compare's stored result, when it ran on this reply
    reply_number: int = 1  # 1, 2, … among the session's replies (storage.records.number_replies)


# ============================================================================ reading the store


def load_share(store, session_id: int, reply: int | None = None, message_id: int | None = None) -> ShareReply:
    """The session's reply number ``reply`` (1, 2, …; or the message ``message_id``; default: the last reply)."""
    try:
        session = store.get_session(session_id)
        messages = store.get_messages(session_id)
    except STORE_ERRORS:
        raise ShareError(f"session {session_id} does not exist") from None
    numbers = number_replies(messages)
    message = _pick_reply(messages, numbers, session_id, reply, message_id)
    if message["status"] == "streaming":
        raise ShareError(f"reply {numbers[message['id']]} of session {session_id} is still being generated")
    cycles = store.get_cycles(message["id"])
    users = [m for m in messages if m["seq"] < message["seq"] and m["role"] == "user"]
    prompt = users[-1]["content"] if users else ""
    comparison = None
    record = _stored_comparison(store, message["id"])
    if record is not None:
        comparison = comparison_from_record(record, stored_run(message, cycles))
    return ShareReply(session["title"], session["model"] or "", dict(message), prompt, cycles, comparison,
                      numbers[message["id"]])


def _pick_reply(messages: list[dict], numbers: dict[int, int], session_id: int, reply: int | None,
                message_id: int | None) -> dict:
    if message_id is not None:
        chosen = [m for m in messages if m["id"] == message_id]
        what = f"message id {message_id}"
    elif reply is not None:
        chosen = [m for m in messages if numbers.get(m["id"]) == reply]
        what = f"reply {reply}"
    else:
        chosen = [m for m in messages if m["role"] == "assistant"][-1:]
        if not chosen:
            raise ShareError(f"session {session_id} has no reply to share")
        what = ""
    if not chosen:
        raise ShareError(f"session {session_id} has no {what} (see `dflash-studio sessions show {session_id}`)")
    if chosen[0]["role"] != "assistant":
        raise ShareError(f"{what} of session {session_id} is the {chosen[0]['role']}'s; only a reply can be shared")
    return chosen[0]


def _stored_comparison(store, message_id: int) -> dict | None:
    try:
        return store.get_comparison(message_id)
    except STORE_ERRORS:
        return None


# ============================================================================ the reply's tokens


@dataclass(frozen=True)
class ShownToken:
    text: str
    origin: str  # accepted | bonus | rejected (the prefill token is the target's own: bonus)
    slot: int = 0  # position in the block (0: the prefill token, or text beyond the cycles)
    extra: bool = False  # text the stored reply has beyond its cycles' pieces


def frame_tokens(content: str, cycles: list[dict]) -> list[list[ShownToken]]:
    """The tokens each frame adds: frame 0 the target's first token (from prefill), frame k the
    k-th cycle's accepted drafts, rejected drafts and bonus token. The kept tokens (accepted +
    bonus) of all frames read exactly ``content``: tokens past a stop string are cut where the
    stored text ends, and text the cycles do not account for is added to the last frame."""
    prefill = _prefill_text(content, cycles)
    frames: list[list[ShownToken]] = [[]]
    position = 0  # how much of ``content`` the kept tokens have read so far

    def keep(text: str, origin: str, slot: int) -> ShownToken | None:
        nonlocal position
        same = _common_prefix(text, content[position:position + len(text)])
        if same == 0:
            return None
        position += same
        return ShownToken(text[:same], origin, slot)

    if prefill and (first := keep(prefill, "bonus", 0)) is not None:
        frames[0].append(first)
    for cycle in cycles:
        accepted = int(cycle.get("accepted") or 0)
        pieces = [str(p) for p in cycle.get("emitted_pieces") or ()]
        shown: list[ShownToken] = []
        for j, piece in enumerate(pieces[:accepted]):
            if (token := keep(piece, "accepted", j + 1)) is not None:
                shown.append(token)
        for k, piece in enumerate(cycle.get("rejected_pieces") or ()):
            if piece:
                shown.append(ShownToken(str(piece), "rejected", accepted + k + 1))
        for j, piece in enumerate(pieces[accepted:], start=accepted):
            if (token := keep(piece, "bonus", j + 1)) is not None:
                shown.append(token)
        frames.append(shown)
    if position < len(content):
        frames[-1].append(ShownToken(content[position:], "bonus", 0, extra=True))
    return frames


def _common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix((a, b)))


def _prefill_text(content: str, cycles: list[dict]) -> str:
    """The target's first token: Teach's rule, or (for a reply a stop string cut) the text before
    the first cycle's pieces."""
    if not cycles:
        return content
    emitted = "".join("".join(str(p) for p in c.get("emitted_pieces") or ()) for c in cycles)
    if emitted and emitted in content:
        return first_text(content, cycles)
    first_cycle = "".join(str(p) for p in cycles[0].get("emitted_pieces") or ())
    found = content.find(first_cycle) if first_cycle else -1
    return content[:found] if found > 0 else ""


# ============================================================================ speed


@dataclass(frozen=True)
class Speed:
    """Each cycle's cost in plain decoding steps, and where that figure comes from."""

    costs: list[float | None]
    source: str

    def running(self, taus: list[int]) -> list[float | None]:
        """The speedup over plain decoding after each cycle: tokens so far ÷ their cost in plain steps."""
        out, tokens, cost = [], 0, 0.0
        for tau, c in zip(taus, self.costs):
            if c is None:
                out.append(None)
                continue
            tokens, cost = tokens + tau, cost + c
            out.append(tokens / cost if cost > 0 else None)
        return out


def cycle_costs(trace: ReplyTrace, comparison: Comparison | None) -> Speed:
    """What each cycle cost in plain steps: the engine's measured cost when stored; else its time
    over a plain step's (measured by Compare's plain run, or by this reply's block-1 cycles, or
    estimated as the largest block's verify ÷ the fallback policy's prior)."""
    if trace.cycles and all(s is not None for s in trace.cycle_steps):
        return Speed(list(trace.cycle_steps), "the engine's measured cost of each cycle in plain steps")
    if not trace.cycles or not trace.measured_timings or sum(trace.cycle_ms) <= 0:
        return Speed([None] * trace.cycles, "")
    plain_ms, source = None, ""
    if comparison is not None and comparison.plain.timeline and not comparison.plain.error:
        (start, first), (end, last) = comparison.plain.timeline[0], comparison.plain.timeline[-1]
        if last > first and end > start:
            plain_ms, source = (end - start) / (last - first), "a plain step's time measured by Compare's plain run"
    if plain_ms is not None:
        rerun = _rerun_cycle_ms(comparison, trace.cycles)
        if rerun is not None:  # the DFlash re-run made the same cycles right after the plain run: same moment
            return Speed([ms / plain_ms for ms in rerun], "Compare's back-to-back runs (plain decoding's step "
                                                          "time against the DFlash re-run's cycle times)")
    if plain_ms is None:
        plain = [ms for ms, b in zip(trace.cycle_ms, trace.block_sizes) if b == 1]
        if plain:
            plain_ms, source = sum(plain) / len(plain), "this reply's own block-1 cycles (a plain step's time)"
        else:
            biggest = max(trace.block_sizes)
            verify = [ms for ms, b in zip(trace.cycle_ms, trace.block_sizes) if b == biggest]
            plain_ms = sum(verify) / len(verify) / VERIFY_STEPS_PRIOR
            source = f"an estimate: a plain step ≈ a block-{biggest} cycle ÷ {VERIFY_STEPS_PRIOR:g} (not measured)"
    return Speed([ms / plain_ms if plain_ms > 0 else None for ms in trace.cycle_ms], source)


def _rerun_cycle_ms(comparison: Comparison, cycles: int) -> list[float] | None:
    """Each cycle's time in Compare's DFlash re-run, when it made as many cycles as the reply."""
    rerun = comparison.dflash
    if rerun is None or rerun.error or len(rerun.timeline) != cycles + 1 or rerun.text != comparison.stored.text:
        return None
    times = [ms for ms, _ in rerun.timeline]
    return [b - a for a, b in zip(times, times[1:])]


# ============================================================================ the document


def _slot_values(step: TeachStep, keep_top: bool) -> list[list]:
    """The draft slots of a step: [text, verdict, draft p, target p, top-3 [[text, p], ...]]."""
    out = []
    for slot in step.draft_slots:
        draft_p = slot.draft_top[0][2] if slot.draft_top else None
        top = [[text, round(p, 4)] for _, text, p in slot.draft_top] if keep_top else []
        out.append([slot.text, slot.verdict, None if draft_p is None else round(draft_p, 4),
                    None if slot.target_prob is None else round(float(slot.target_prob), 4), top])
    return out


def _frame(step: TeachStep, tokens: list[ShownToken], speed: float | None, produced: int, keep_top: bool) -> dict:
    return {
        "i": step.index, "b": step.block_size, "a": step.accepted, "tau": step.tau,
        "anchor": step.anchor_text, "slots": _slot_values(step, keep_top), "bonus": step.bonus_text,
        "tok": [[t.text, t.origin, t.slot] + ([1] if t.extra else []) for t in tokens],
        "cap": caption(step), "draft_ms": round(step.draft_ms, 2), "verify_ms": round(step.verify_ms, 2),
        "cache": step.cache_line, "fb": step.fallback_reason if step.fallback_changed else "",
        "speed": None if speed is None else round(speed, 3), "n": produced,
    }


def prefill_caption(share: ShareReply, first: str) -> str:
    ms = share.message.get("prefill_ms")
    took = f" in {float(ms):.0f} ms" if ms else ""
    shown = f" “{first}”" if first else ""
    return (f"Prefill: the target model read the whole prompt in one forward pass{took} and wrote the first token "
            f"of the reply{shown} on its own. That token is the first anchor: every cycle after it starts from "
            "the last token kept.")


def replay_document(share: ShareReply, keep_top: bool = True) -> dict:
    """Everything the replay page and the GIF show, as JSON-ready values (``keep_top=False``
    leaves out the draft's top-3 per slot, to keep a very long reply's page small)."""
    message = share.message
    content = message.get("content") or ""
    note = engine_note((message.get("settings") or {}).get("engine"))
    steps = build_steps(content, share.cycles, note)
    tokens = frame_tokens(content, share.cycles)
    trace = ReplyTrace.from_stored(content, share.cycles, message)
    speed = cycle_costs(trace, share.comparison)
    running = speed.running([s.tau for s in steps])
    first = "".join(t.text for t in tokens[0])
    produced = 1 if content or share.cycles else 0  # the prefill writes the reply's first token
    frames = [{"i": 0, "b": 0, "a": 0, "tau": 0, "anchor": "", "slots": [], "bonus": None,
               "tok": [[t.text, t.origin, t.slot] for t in tokens[0]], "cap": prefill_caption(share, first),
               "draft_ms": 0, "verify_ms": 0, "cache": "", "fb": "", "speed": None, "n": produced}]
    for step, shown, running_speed in zip(steps, tokens[1:], running):
        produced += step.tau  # model tokens, as Teach and the stats count them (an end token has no text)
        frames.append(_frame(step, shown, running_speed, produced, keep_top))
    return {
        "title": share.session_title, "reply_number": share.reply_number, "prompt": _cut(share.prompt, PROMPT_CHARS),
        "text": content, "kind": message.get("kind") or "chat", "status": message.get("status") or "",
        "model": message.get("model") or share.session_model, "settings": settings_lines(message),
        "figures": figures(trace, speed, share), "engine_note": note, "speed_source": speed.source,
        "max_block": max([f["b"] for f in frames] + [1]), "frames": frames,
        "race": race_document(share),
    }


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars] + f"… ({len(text) - chars} more characters)"


def settings_lines(message: dict) -> list[list[str]]:
    """The settings the reply was made with, as (name, value) pairs."""
    s = message.get("settings") or {}
    block = s.get("block_size")
    rows = [["block size", str(block) if block else "the draft's own"],
            ["temperature", f"{float(s.get('temperature') or 0.0):g}" + (" (greedy)" if not s.get("temperature") else "")],
            ["max new tokens", str(s.get("max_new_tokens") or "–")],
            ["dynamic fallback", "on" if s.get("fallback") else "off"]]
    if s.get("top_p") not in (None, 1, 1.0):
        rows.insert(2, ["top-p", f"{float(s['top_p']):g}"])
    if s.get("model"):
        rows.insert(0, ["model choice", str(s["model"])])
    rows.append(["engine", str(s.get("engine") or "local")])
    if message.get("kind") == "complete":
        rows.append(["mode", "Complete (the prompt continued as raw code)"])
    return rows


def figures(trace: ReplyTrace, speed: Speed, share: ShareReply) -> list[list[str]]:
    """The reply's measured figures, as (name, value) pairs."""
    message = share.message
    rows = [["tokens", str(trace.new_tokens)], ["cycles (target passes)", str(trace.cycles)]]
    if trace.mean_tau is not None:
        rows.append(["mean τ (tokens per cycle)", f"{trace.mean_tau:.2f}"])
    drafted = sum(b - 1 for b in trace.block_sizes)
    if drafted:
        rows.append(["drafts accepted", f"{sum(trace.accepted) / drafted:.0%}"])
    if message.get("tokens_per_s"):
        rows.append(["speed", f"{float(message['tokens_per_s']):.1f} tokens/s"])
    if message.get("total_ms"):
        rows.append(["time", f"{float(message['total_ms']) / 1000:.2f} s"])
    total = speed.running([int(t) for t in trace.taus])
    if total and total[-1] is not None:
        rows.append(["speedup over plain decoding", f"{total[-1]:.2f}× (from {speed.source})"])
    c = share.comparison
    if c is not None and c.speedup:
        rows.append(["measured by Compare", f"{c.speedup:.2f}× ({'identical' if c.identical else 'different'} output)"])
    return rows


# ============================================================================ the race


def _lane(label: str, timeline: list[tuple[float, int]], pieces: list[str]) -> dict:
    return {"label": label, "steps": [[round(ms, 2), n, text] for (ms, n), text in zip(timeline, pieces)]}


def race_document(share: ShareReply) -> dict | None:
    """Plain decoding against DFlash on one clock, from Compare's stored runs: each lane's text
    grows at the moments its run produced it (ms since the request started). DFlash is the
    re-run made right after the plain one (same machine, same moment) when there is one, else
    the stored reply."""
    c = share.comparison
    if c is None or c.plain.error or not c.plain.timeline:
        return None
    fast = c.dflash if c.dflash is not None and not c.dflash.error and c.dflash.timeline else c.stored
    dflash_label = "DFlash (re-run right after plain)" if fast is c.dflash else "DFlash (the stored reply)"
    fast_text = fast.text or "".join(fast.pieces)
    speedup = c.speedup
    return {
        "plain": _lane("plain decoding", c.plain.timeline, c.plain.pieces),
        "dflash": _lane(dflash_label, fast.timeline, fast.pieces),
        "identical": c.identical, "same_as_plain": fast_text == c.plain.text,
        "speedup": None if speedup is None else round(speedup, 3), "method": c.method, "note": c.model_note,
        "why": why_different(c), "temperature": c.temperature,
    }
