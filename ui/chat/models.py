"""Which model answers, as the page says it: the pair a session uses, the model menu, the header
above the settings, the notice in the chat where a session's model changed, and the prompt each
model is sent.

A session keeps the name of its model (``settings["model"]``, stored with the session and each
of its messages); an older name (a stored session from before a pair was renamed) resolves to
the pair it meant (``EngineHost.resolve``). The page's menu shows the session's model, and Send
runs that model: the engine worker loads it first when another one is loaded.

Each model answers from its own turns of a session: a turn answered by another model (the user
message and that model's reply) is left out of its prompt. A reply is the model's own text in its
next prompt; another model's replies read as if it had written them, and a small model imitates
them (the speed-demo pair's off-topic code made the answering pair drift off the request).
The chat says where the model changed and how many earlier turns the new one does not see.
"""

from __future__ import annotations

import gradio as gr

from storage.records import stored_model

from ..context import UIContext
from .render import esc


def session_model(ctx: UIContext, session: dict | None) -> str:
    """The menu key of the pair that answers in ``session``: its stored model when this Studio
    has that pair, else (a new page, a pair not offered here) the loaded one."""
    return ctx.engines.resolve(stored_model(session)) or ctx.engines.current_key


def model_menu(ctx: UIContext, key: str):
    return gr.Dropdown(choices=ctx.engines.choices(), value=key)


def model_view(ctx: UIContext, session: dict | None) -> dict:
    """The menu and the header for a page showing ``session`` (None: a new page)."""
    key = session_model(ctx, session)
    return {"model": model_menu(ctx, key), "model_status": model_status_html(ctx, key)}


def reply_model(ctx: UIContext, message: dict) -> str:
    """The pair a stored reply came from, by its menu key when this Studio has it."""
    name = stored_model(message)
    return ctx.engines.resolve(name) or name


def chat_turns(messages: list[dict]) -> list[tuple[list[dict], dict | None]]:
    """Chat messages as turns: (the user message(s), the reply or None), in order."""
    turns: list[tuple[list[dict], dict | None]] = []
    asked: list[dict] = []
    for m in messages:
        if m["kind"] != "chat":
            continue
        if m["role"] == "assistant":
            turns.append((asked, m))
            asked = []
        elif m["role"] == "user":
            asked.append(m)
    if asked:
        turns.append((asked, None))
    return turns


def prompt_for_model(ctx: UIContext, messages: list[dict], key: str) -> list[dict]:
    """The chat prompt for ``key``: the session's chat messages, less the turns another model
    answered (see the module's docstring)."""
    kept = []
    for asked, reply in chat_turns(messages):
        if reply is not None and reply_model(ctx, reply) != key:
            continue
        kept.extend(m for m in [*asked, reply] if m is not None)
    return [{"role": m["role"], "content": m["content"]} for m in kept
            if m["role"] in ("user", "assistant") and m["content"]]


def change_notice(before: str, now: str, left_out: int) -> str:
    """The line at the top of the first reply after the session's model changed."""
    unseen = (f" It does not see the {left_out} earlier turn{'s' * (left_out != 1)} another model answered."
              if left_out else "")
    return (f'<span class="model-change" data-model="{esc(now)}">⇄ Model changed: {esc(before)} → '
            f'<b>{esc(now)}</b>.{unseen}</span>\n\n')


def reply_notices(ctx: UIContext, messages: list[dict], next_model: str | None = None) -> dict:
    """``{message id: notice}`` for each stored reply whose model differs from the reply before
    it; with ``next_model``, also ``{None: notice}`` for a reply about to come from that model."""
    notices: dict = {}
    previous = None
    answered: dict[str, int] = {}  # turns answered per model so far
    for _asked, reply in chat_turns(messages) + [([], None)]:
        model = reply_model(ctx, reply) if reply is not None else next_model
        if model is None:
            continue
        if previous is not None and model != previous:
            left_out = sum(n for name, n in answered.items() if name != model)
            notices[reply["id"] if reply is not None else None] = change_notice(previous, model, left_out)
        if reply is not None:
            answered[model] = answered.get(model, 0) + 1
        previous = model
    return notices


def model_status_html(ctx: UIContext, page_key: str | None = None) -> str:
    """The header above the settings: the model that answers on this page (``page_key``, the
    menu's value), by name and what it is for, and whether it is loaded, loading or loads on Send."""
    status = ctx.engines.status()
    engine = ctx.engines.engine
    loaded = ctx.engines.current_key
    shown = ctx.engines.resolve(page_key) or loaded
    if status.state == "loading":
        pct = max(0.0, min(1.0, status.fraction))
        return (f'<div class="model-status loading" data-state="loading" data-model="{esc(status.model_key)}">'
                f'Loading <b>{esc(status.model_key)}</b>: {esc(status.message)}'
                f'<div class="bar"><div style="width:{pct * 100:.0f}%"></div></div></div>')
    hint = _hint(ctx, shown)
    sep = "· " if hint else ""  # the hint and how the pair runs read as one line, not run together
    parts = []
    state = "ready" if engine is not None else "failed"
    if engine is not None and shown != loaded:
        state = "on-send"
        parts.append(f'<span class="idle">○</span> <b>{esc(shown)}</b>{hint} <span class="detail">{sep}loads when '
                     f'you send ({esc(loaded)} is loaded now)</span>')
    elif engine is not None:
        info = {}
        try:
            info = engine.info()
        except Exception:  # noqa: BLE001 - a description is optional
            pass
        detail = " · ".join(str(x) for x in (info.get("device"), info.get("dtype"),
                                              f"block {engine.block_size}" if engine.speculative else "no draft",
                                              info.get("path")) if x)
        parts.append(f'<span class="ok">●</span> <b>{esc(loaded)}</b>{hint} <span class="detail">{sep}{esc(detail)}</span>')
    if status.error:
        parts.append(f'<span class="model-error">⚠ {esc(status.error)}</span>')
    if not parts:
        parts.append('<span class="model-error">no model loaded</span>')
    return f'<div class="model-status {state}" data-state="{state}" data-model="{esc(shown)}">{" ".join(parts)}</div>'


def _hint(ctx: UIContext, key: str) -> str:
    """'— answers simple requests · τ …, …× plain decoding (bench)': what the pair is for and its
    measured speed (``ShippedPair.speed()``), when the model list knows them."""
    choice = getattr(ctx.engines, "catalog", {}).get(key)
    words = [getattr(choice, "hint", "")]
    if getattr(choice, "speed", ""):
        words.append(f"{choice.speed} (bench)")
    words = [w for w in words if w]
    return f' <span class="detail">— {esc(" · ".join(words))}</span>' if words else ""
