"""The page's thinking control: on or off per session for models whose template takes
``enable_thinking`` (Qwen3, Qwen3.5/3.6, MiMo), at the family's default; shown fixed, with the
reason, for models that always reason (gpt-oss: its effort is an API setting) or never do (the
tiny coders, Llama 3.1, Gemma 3, Qwen3-Coder)."""

from __future__ import annotations

import gradio as gr

from ..context import STORE_ERRORS, UIContext


def _format(ctx: UIContext):
    engine = ctx.engines.engine
    return getattr(engine, "chat_format", None) if engine is not None else None


def thinking_control(ctx: UIContext, session_id: int | None = None) -> gr.Checkbox:
    """The checkbox for the loaded model and the session shown (its stored choice, else the default)."""
    return gr.Checkbox(**thinking_args(ctx, session_id))


def thinking_args(ctx: UIContext, session_id: int | None = None) -> dict:
    """The checkbox's value, whether it can change, and its note, as keyword arguments: the layout
    builds the checkbox from them (building a checkbox inside the page's layout would add one)."""
    fmt = _format(ctx)
    if fmt is None or not fmt.reasons:
        note = fmt.thinking_note() if fmt is not None else "this model has no thinking mode"
        return {"value": False, "interactive": False, "info": note}
    stored = None
    if session_id is not None and fmt.thinking_switch:
        try:
            stored = (ctx.store.get_session(session_id)["settings"] or {}).get("thinking")
        except STORE_ERRORS:
            stored = None
    value = fmt.thinking_default if stored is None else bool(stored)
    return {"value": value, "interactive": fmt.thinking_switch, "info": fmt.thinking_note()}


def thinking_setting(ctx: UIContext, thinking) -> dict:
    """``{"thinking": bool}`` for a reply's settings when the loaded model can switch it, else {};
    None (a session that never chose) is the family's default, as its control shows it."""
    fmt = _format(ctx)
    if fmt is None or not fmt.thinking_switch:
        return {}
    return {"thinking": fmt.thinking_default if thinking is None else bool(thinking)}


def save_thinking(ctx: UIContext, session_id: int | None, thinking) -> None:
    """Keep the choice with the session (its other settings stay as they are)."""
    setting = thinking_setting(ctx, thinking) if thinking is not None else {}
    if session_id is None or not setting:
        return
    try:
        settings = dict(ctx.store.get_session(session_id)["settings"] or {})
        ctx.store.update_session_settings(session_id, {**settings, **setting})
    except STORE_ERRORS:
        return
