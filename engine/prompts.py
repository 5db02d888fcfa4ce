"""Prompt encoding and the context-window check, shared by every engine (no torch here)."""

from __future__ import annotations

from dataclasses import replace

from .chat_formats import ChatOptions, chat_format
from .config import MAX_BLOCK_SIZE, SamplingConfig
from .errors import EmptyPromptError, InvalidRequestError, PromptTooLongError

Message = dict  # {"role": "user"|"assistant"|"system", "content": str}


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer, prompt: str | list[Message], raw: bool = False,
                  chat: ChatOptions | None = None) -> list[int]:
    """Chat messages (or a single user prompt) through the chat template when there is one;
    raw text otherwise or when ``raw``. ``chat``: thinking on/off and the reasoning effort, as
    the template takes them (``engine.chat_formats``; the family's defaults when None)."""
    has_template = has_chat_template(tokenizer)
    if isinstance(prompt, str) and (raw or not has_template):
        return list(tokenizer(prompt, add_special_tokens=not has_template)["input_ids"])
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if not has_template:
        text = "\n\n".join(m["content"] for m in messages)
        return list(tokenizer(text)["input_ids"])
    from jinja2 import TemplateError  # the chat template's own refusals ("roles must alternate")

    options = (chat or ChatOptions()).template_kwargs(chat_format(tokenizer))
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **options)
    except TemplateError as exc:
        raise InvalidRequestError(f"the messages do not fit this model's chat template: {exc}") from None
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


BLOCK_ENDS = (":", '"""', "'''")  # a line after which the code goes on in a new, indented line


def heal_code_prompt(code: str) -> str:
    """Code to continue, with the line break (and indentation) after a line that opens a block
    or a docstring left for the model to write ("token healing"). A BPE tokenizer for code
    merges a line break with the next line's indentation ("\\n   " is one token), so a prompt
    that ends in a bare "\\n" asks for what training text almost never holds, and the model
    starts a new top-level line instead of the body. Only after such lines: elsewhere the
    model could continue the last token of the line itself ("x = 1" -> "x = 10")."""
    body = code.rstrip(" \t\n")
    tail = code[len(body):]
    return body if body and "\n" in tail and body.endswith(BLOCK_ENDS) else code


def fit_request(prompt_ids: list[int], sampling: SamplingConfig, window: int) -> SamplingConfig:
    """Validate settings and the prompt against the context window; returns the settings to
    use (max_new_tokens shortened to what the window still holds)."""
    sampling.validate(max_block_size=MAX_BLOCK_SIZE)
    if not prompt_ids:
        raise EmptyPromptError()
    room = window - len(prompt_ids) - 1
    if room < 1:
        raise PromptTooLongError(len(prompt_ids), window)  # each edge adds the advice that fits there
    if sampling.max_new_tokens > room:
        sampling = replace(sampling, max_new_tokens=room)
    return sampling
