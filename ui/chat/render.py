"""HTML for the token view, the stats strip, the reply footers and chat text.

Every piece of model or user text goes through ``html.escape`` before it becomes HTML (attribute
values with ``quote=True``); the only markup here is our own. Syntax colours come from pygments
(text colour, classes such as ``k``/``nf``/``s2``); the token's origin is its background and
underline, so both stay visible.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer, get_lexer_by_name
from pygments.token import STANDARD_TYPES
from pygments.util import ClassNotFound

from engine.errors import CONTEXT_FULL

from .reasoning_view import chat_reasoning_block, split_line, token_view_reasoning
from .trace import ReplyTrace, Token

PYGMENTS_STYLE = "default"
ORIGIN_LABELS = {
    "accepted": "accepted draft token (the target confirmed it)",
    "bonus": "the target's own token (correction or bonus)",
    "rejected": "rejected draft token (the target refused it)",
}
FENCE = re.compile(r"^([ \t]*)(```|~~~)[ \t]*([\w+#.-]*)[^\n]*$", re.M)


@dataclass(frozen=True)
class FencedBlock:
    """One fenced code block: ``text[start:end]`` with its fence lines, ``text[body_start:body_end]``
    between them (``body_start`` is the end of the opening fence line, before its newline)."""

    start: int
    body_start: int
    body_end: int
    end: int
    marker: str  # ``` or ~~~
    language: str  # as written after the opening marker ("" when none)
    closed: bool  # False for a block still streaming: it runs to the end of the text


def fenced_blocks(text: str) -> Iterator[FencedBlock]:
    """The fenced code blocks of ``text`` in order: a fence line opens a block and the next fence
    line with the same marker closes it. The one walker every reader of fences uses."""
    fences = list(FENCE.finditer(text))
    i = 0
    while i < len(fences):
        opening = fences[i]
        closing = next((f for f in fences[i + 1:] if f.group(2) == opening.group(2)), None)
        yield FencedBlock(opening.start(), opening.end(), closing.start() if closing else len(text),
                          closing.end() if closing else len(text), opening.group(2), opening.group(3),
                          closing is not None)
        i = fences.index(closing) + 1 if closing else len(fences)


CODE_LINE = re.compile(
    r"""^\s*(?:def|class|import|from|return|if|elif|else|for|while|try|except|finally|with|raise|yield|lambda|
    async|await|print|assert|pass|break|continue|const|let|var|function|public|private|static|\#include|fn|pub|
    use|package|func)\b
    |^(?:\ {2,}|\t)\S            # indented
    |[;{}]\s*$|:\s*$|\)\s*$      # ends like code
    |^\s*[\w.\[\]]+\s*[+\-*/%]?=\s*\S   # an assignment
    |^\s*(?:\#|//)               # a comment
    |^\s*@\w+                    # a decorator
    """, re.X)
PROSE_END = re.compile(r"[.!?…]\s*$")


def looks_like_code_line(line: str) -> bool:
    """A line outside fences that reads like code, not a sentence that happens to end in ':'."""
    return bool(line.strip() and CODE_LINE.search(line)) and not (PROSE_END.search(line) and len(line.split()) > 6)


def code_share(text: str) -> float:
    """Fraction of the reply's non-blank text that is code: characters inside fenced blocks,
    plus, outside fences, lines that look like code (keywords, indentation, brackets, ``=``)."""
    total = len("".join(text.split()))
    if not total:
        return 0.0
    fenced, outside, pos = 0, [], 0
    for block in fenced_blocks(text):
        outside.append(text[pos:block.start])
        fenced += len("".join(text[block.body_start:block.body_end].split()))
        pos = block.end
    outside.append(text[pos:])
    loose = 0
    in_string = False  # inside a triple-quoted string (a docstring) opened on a code line
    for line in "\n".join(outside).splitlines():
        if in_string or looks_like_code_line(line):
            loose += len("".join(line.split()))
            in_string ^= (line.count('"""') + line.count("'''")) % 2 == 1
    return min(1.0, (fenced + loose) / total)


DEFINITION_START = re.compile(r"^\s*(?:(?:async\s+)?def\s+\w+\s*\(|class\s+\w+|@\w|import\s+\w|from\s+[\w.]+\s+import\b)")


def bare_code(text: str) -> bool:
    """A chat reply that is code without fences (what a small code model often writes): it
    opens with a def/class/decorator/import line, or most of it reads like code."""
    if not text.strip() or FENCE.search(text):
        return False
    first = next(line for line in text.splitlines() if line.strip())
    return bool(DEFINITION_START.match(first)) or code_share(text) >= 0.5


def esc(text: object) -> str:
    """Text for HTML; a NUL (which an HTML parser drops from text) shows as U+FFFD."""
    return html.escape(str(text), quote=True).replace("\x00", "\ufffd")


# ---------------------------------------------------------------------------- syntax colours


@lru_cache(maxsize=16)
def _lexer(language: str):
    try:
        return get_lexer_by_name(language or "python", stripnl=False, ensurenl=False)
    except ClassNotFound:
        return PythonLexer(stripnl=False, ensurenl=False)


def _short_class(ttype) -> str:
    while ttype is not None and ttype not in STANDARD_TYPES:
        ttype = ttype.parent
    return STANDARD_TYPES.get(ttype, "") if ttype is not None else ""


def lex_into(code: str, language: str, offset: int, out: list, classify=lambda ttype, value: _short_class(ttype)) -> None:
    """Lex ``code`` (which starts at ``offset`` of the text) and write ``classify(token type,
    token text)`` for each of its characters into ``out``."""
    pos = offset
    for ttype, value in _lexer(language).get_tokens(code):
        label = classify(ttype, value)
        for i in range(pos, min(pos + len(value), len(out))):
            out[i] = label
        pos += len(value)


def syntax_classes(text: str, mode: str = "chat") -> list[str]:
    """One pygments short class per character ("" = no colour). In "complete" mode, and for a
    bare-code chat reply, the whole text is code; otherwise only fenced code blocks are (prose
    stays uncoloured)."""
    classes = [""] * len(text)
    if mode == "complete" or bare_code(text):  # a bare-code reply is one block of code
        lex_into(text, "python", 0, classes)
        return classes
    for block in fenced_blocks(text):
        start = block.body_start + 1  # after the opening fence line's newline
        if start < block.body_end:
            lex_into(text[start:block.body_end], block.language, start, classes)
    return classes


def _syntax_html(text: str, classes: list[str]) -> str:
    """``text`` escaped, with runs of one syntax class wrapped in ``<span class="…">``."""
    out, run, run_class = [], [], None
    for ch, css in zip(text, classes):
        if css != run_class and run:
            out.append(_run(run, run_class))
            run = []
        run_class = css
        run.append(ch)
    if run:
        out.append(_run(run, run_class))
    return "".join(out)


def _run(chars: list[str], css: str | None) -> str:
    body = esc("".join(chars))
    return f'<span class="{esc(css)}">{body}</span>' if css else body


@lru_cache(maxsize=1)
def syntax_css() -> str:
    """The pygments colours, scoped to the token view."""
    return HtmlFormatter(style=PYGMENTS_STYLE).get_style_defs(".tv-body")


# ---------------------------------------------------------------------------- token view


def token_title(token: Token) -> str:
    if token.origin == "prefill":
        return "prefill · the target's first token"
    where = f"cycle {token.cycle} · slot {token.slot}/{token.block_size - 1 if token.block_size > 1 else 1}"
    if token.origin == "bonus":
        kind = "bonus · the target's own token" if token.block_size > 1 else "plain step · the target's token"
        return f"{where} · {kind}"
    parts = [where, token.origin]
    if token.draft_prob is not None:
        parts.append(f"draft p {token.draft_prob:.2f}")
    if token.target_prob is not None:
        parts.append(f"target p {token.target_prob:.2f}")
    return " · ".join(parts)


def legend_html() -> str:
    items = "".join(
        f'<span class="tv-legend-item"><span class="tv-swatch" data-origin="{origin}">{sample}</span>{esc(label)}</span>'
        for origin, sample, label in (
            ("accepted", "abc", ORIGIN_LABELS["accepted"]),
            ("bonus", "abc", ORIGIN_LABELS["bonus"]),
            ("rejected", "abc", ORIGIN_LABELS["rejected"]),
        )
    )
    marker = '<span class="tv-legend-item"><span class="tv-fallback">⟨…⟩</span>fallback change (block size, reason)</span>'
    hint = '<span class="tv-legend-item tv-hint">hover a token: cycle, slot, probability · hover a block: its boundary</span>'
    return f'<div class="tv-legend">{items}{marker}{hint}</div>'


def render_token_view(trace: ReplyTrace | None, mode: str = "chat", placeholder: str = "") -> str:
    """The whole #token-view content: legend, then one ``<span class="tv-block">`` per cycle
    holding one span per token (``data-origin``, ``data-cycle``, ``data-slot``, ``title``)."""
    if trace is None or not trace.tokens:
        note = esc(placeholder or "Send a prompt: every generated token appears here, coloured by what DFlash did to it.")
        return f'<div class="tv">{legend_html()}<div class="tv-body tv-empty">{note}</div></div>'
    marks = {m.after_cycle: m for m in trace.marks}
    reasoning = [t for t in trace.tokens if t.part == "reasoning"]
    answer = [t for t in trace.tokens if t.part != "reasoning"]
    out: list[str] = []
    if reasoning:  # its own block, above the answer; never lexed as code
        inner = _tokens_html(reasoning, [""] * len(trace.reasoning), marks)
        out.append(token_view_reasoning(inner, trace.reasoning_tokens))
    out.append(_tokens_html(answer, syntax_classes(trace.text, mode), marks))
    tail = ""
    if trace.error:
        tail = f'<div class="tv-error">⚠ generation failed: {esc(trace.error)}</div>'
    elif trace.cancelled:
        tail = '<div class="tv-note">⏹ stopped; the partial reply is kept</div>'
    if trace.engine_note:
        tail += f'<div class="tv-note tv-engine-note">ℹ {esc(trace.engine_note)}</div>'
    return f'<div class="tv">{legend_html()}<div class="tv-body">{"".join(out)}</div>{tail}</div>'


def _tokens_html(tokens: list[Token], classes: list[str], marks: dict) -> str:
    """One ``tv-block`` span per cycle holding one span per token; ``classes`` are the syntax
    classes of the shown (not rejected) tokens' text, in order."""
    out: list[str] = []
    pos, current = 0, None
    for token in tokens:
        if token.cycle != current:
            if current is not None:
                out.append("</span>")
                out.append(_mark_html(marks.get(current)))
            current = token.cycle
            out.append(f'<span class="tv-block" data-block="{token.cycle}" data-block-size="{token.block_size}">')
        if token.origin == "rejected":  # a marker above the line: its line breaks must not break the code's
            inner = esc(token.text.replace("\n", "⏎"))
        else:
            inner = _syntax_html(token.text, classes[pos:pos + len(token.text)])
            pos += len(token.text)
        origin = "bonus" if token.origin == "prefill" else token.origin
        part = ' data-part="reasoning"' if token.part == "reasoning" else ""
        out.append(
            f'<span class="tok" data-origin="{origin}" data-cycle="{token.cycle}" data-slot="{token.slot}" '
            f'title="{esc(token_title(token))}"{part}>{inner}</span>'
        )
    if current is not None:
        out.append("</span>")
        out.append(_mark_html(marks.get(current)))
    return "".join(out)


def _mark_html(mark) -> str:
    if mark is None:
        return ""
    # A small raised marker, its reason on hover: inline in the code, the reason broke its reading.
    label = f"⟨{mark.state} → {mark.next_block_size}⟩"
    return (f'<span class="tv-fallback" data-block="{mark.next_block_size}" '
            f'title="{esc(f"fallback: {mark.state}, block → {mark.next_block_size}: {mark.reason}")}">{esc(label)}</span>')


# ---------------------------------------------------------------------------- stats and footers


def fmt(value: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{unit}"


FALLBACK_STATES = {
    "full": "full: drafting whole blocks of the chosen size",
    "reduced": "reduced: smaller blocks, because drafts were being rejected",
    "off": "off: plain decoding, one token per step, because drafting was not paying",
}
STAT_HELP = {
    "tokens/s": "generated tokens per second of this reply",
    "mean τ": "tokens gained per draft+verify cycle (accepted drafts + the target's own token)",
    "block size": "tokens per draft+verify block in the latest cycle",
    "fallback": "dynamic fallback's state: " + "; ".join(FALLBACK_STATES.values())
                + " (– when fallback is switched off)",
    "est. speedup": "an estimate: mean τ divided by a cycle's cost in plain decoding steps, measured when the model "
                    "loaded (±15 %; Teach → Compare measures the real ratio now)",
    "tokens": "generated tokens, the prefill token included",
    "cycles": "draft+verify cycles",
}


def stats_html(trace: ReplyTrace | None, model_line: str = "") -> str:
    """The stats strip: tokens/s, mean τ, block size now, fallback state, estimated speedup, and
    one line saying why (τ ÷ cycle cost in plain steps = speedup) when the costs were measured."""
    t = trace or ReplyTrace()
    cells = [
        ("tokens/s", fmt(t.tokens_per_s(), ".1f")),
        ("mean τ", fmt(t.mean_tau)),
        ("block size", fmt(t.current_block_size, "d") if t.current_block_size else "–"),
        ("fallback", esc(t.fallback_state or "–")),
        ("est. speedup", fmt(t.estimated_speedup(), ".2f", "×")),
        ("tokens", str(t.new_tokens)),
        ("cycles", str(t.cycles)),
    ]
    body = "".join(
        f'<div class="stat" data-stat="{esc(label)}" title="{esc(STAT_HELP.get(label, ""))}">'
        f'<span class="stat-value">{value}</span><span class="stat-label">{esc(label)}</span></div>'
        for label, value in cells
    )
    why = t.speed_explanation()
    why_html = f'<div class="stat-why" data-stat="why">{esc(why)}</div>' if why else ""
    if t.finished and not t.new_tokens:  # every figure is "–": say why
        reason = t.finished.get("reason") or t.finished.get("finish_reason")
        why = ("Stopped before the first token." if reason == "cancelled" else
               "No tokens: the model ended the reply before writing one (its first token was the end of text; "
               "at a high temperature that is a random draw: send again or lower it).")
        why_html = f'<div class="stat-why" data-stat="why">{esc(why)}</div>'
    split = split_line(t)  # τ and acceptance of the reasoning and of the answer, apart
    why_html += f'<div class="stat-why" data-stat="reasoning-split">{esc(split)}</div>' if split else ""
    blocks = t.fallback_summary()  # a reply whose block size fallback changed says so (τ depends on it)
    why_html += f'<div class="stat-why" data-stat="fallback-summary">{esc(blocks)}</div>' if blocks else ""
    model = f'<div class="stat-model">{esc(model_line)}</div>' if model_line else ""
    return f'<div class="stats-strip">{body}{why_html}{model}</div>'


def reply_footer(trace: ReplyTrace, tokens: int | None = None) -> str:
    """One line of figures under a reply (our own markup; numbers only)."""
    parts = [f"{tokens if tokens is not None else trace.new_tokens} tokens"]
    tps = trace.tokens_per_s()
    if tps:
        parts.append(f"{tps:.1f} tok/s")
    if trace.mean_tau is not None:
        parts.append(f"mean τ {trace.mean_tau:.2f}")
    speedup = trace.estimated_speedup()
    if speedup:
        parts.append(f"~{speedup:.2f}× est. speedup")
    return f'<span class="reply-footer">{" · ".join(parts)}</span>'


# ---------------------------------------------------------------------------- chat text


INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)


def chat_markdown(text: str) -> str:
    """Markdown for the chat bubble with every HTML special character outside code escaped, so
    that ``<img src=x onerror=…>`` shows as text. Code (fenced or inline) is left alone: the
    markdown renderer already shows it literally."""
    out, pos = [], 0
    for block in fenced_blocks(text):
        out.append(_escape_prose(text[pos:block.start]))
        code = text[block.start:block.end]
        out.append(code if block.closed else code + "\n" + block.marker)  # close a fence still streaming
        pos = block.end
    out.append(_escape_prose(text[pos:]))
    return "".join(out)


def _escape_prose(text: str) -> str:
    out, pos = [], 0
    for match in INLINE_CODE.finditer(text):
        out.append(_inert(text[pos:match.start()]))
        out.append(match.group(0))
        pos = match.end()
    out.append(_inert(text[pos:]))
    return "".join(out)


def _inert(prose: str) -> str:
    """HTML escaped, and markdown images (``![alt](http://…)``, ``![alt][ref]``) kept as text:
    an image makes the browser fetch its address, the classic way for a reply to leak the
    conversation to a third party (the address can carry the data). Links stay: they need a click."""
    return html.escape(prose, quote=False).replace("![", "!\\[")


def assistant_markdown(content: str, status: str, trace: ReplyTrace | None = None, error: str | None = None,
                       kind: str = "chat", tokens: int | None = None, reasoning: str | None = None) -> str:
    """A reply as chat markdown: a reasoning model's reasoning in its own block (``reasoning``,
    else the trace's), the text, a footer with its figures, and its end state."""
    fenced = content and (kind == "complete" or bare_code(content))  # shown as code, not as prose
    body = chat_markdown(f"```python\n{content}\n```" if fenced else content)
    if not content and status == "streaming":
        body = "…"
    thought = reasoning if reasoning is not None else (trace.reasoning if trace is not None else "")
    if thought and thought.strip("\n"):
        body = chat_reasoning_block(esc(thought.strip("\n")), streaming=status == "streaming" and not content) + body
    extras = []
    if trace is not None and (tokens or trace.new_tokens) and status != "streaming":  # figures once it ended
        extras.append(reply_footer(trace, tokens or None))
    if status == "interrupted" and error:  # the engine went away mid-reply (a vLLM server died)
        extras.append(f'<span class="reply-error">⚠ interrupted: {esc(error)} (the reply so far is kept)</span>')
    elif status == "interrupted":
        extras.append('<span class="reply-note">⏹ stopped</span>')
    if context_full(trace):
        extras.append(f'<span class="reply-note context-full">⚠ {CONTEXT_FULL}: the reply stops here. '
                      'Start a new session to go on (each message sends the whole conversation).</span>')
    if status == "error":
        extras.append(f'<span class="reply-error">⚠ error: {esc(error or "generation failed")}</span>')
    return body + ("\n\n" + " ".join(extras) if extras else "")


def context_full(trace: ReplyTrace | None) -> bool:
    """A reply the context window cut: live (the engine's Finished) or stored (its finish reason)."""
    finished = (trace.finished if trace is not None else None) or {}
    return bool(finished.get("context_full")) or finished.get("finish_reason") == "context_full"


def user_markdown(content: str, kind: str = "chat") -> str:
    if kind == "complete":
        return chat_markdown(f"Complete this code:\n```python\n{content}\n```")
    return chat_markdown(content)
