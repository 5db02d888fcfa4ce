"""What a chat request asks of a reasoning model, as the settings its reply is stored with:
``chat_template_kwargs.enable_thinking`` (vLLM's form) becomes ``thinking``, and
``reasoning_effort`` is kept as sent. ``engine.reasoning.chat_options`` reads them back when the
prompt is rendered, where a model without a reasoning effort refuses one in a single line."""

from __future__ import annotations


def chat_settings(params: dict) -> dict:
    """``{"thinking": bool, "reasoning_effort": str}``, each only when the request set it."""
    settings = {}
    thinking = (params.get("chat_template_kwargs") or {}).get("enable_thinking")
    if thinking is not None:
        settings["thinking"] = bool(thinking)
    if params.get("reasoning_effort") is not None:
        settings["reasoning_effort"] = params["reasoning_effort"]
    return settings
