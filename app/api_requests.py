"""The OpenAI-compatible request bodies: pydantic models (they also make the /v1 OpenAPI schema)
and their conversion to one ``ApiRequest`` with engine configs.

Anything the engine cannot honour is refused by name with a 400 (``UnsupportedParameter``),
never silently ignored: ``n > 1``, tools, logprobs, penalties, ``logit_bias``, ``suffix``,
``echo``, ``best_of``, images. Fields that do not change the output (``user``, ``metadata``,
``store``...) are accepted and kept with the session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.config import FallbackConfig, SamplingConfig
from engine.errors import check_prompt_text

MAX_STOPS = 16  # OpenAI allows 4; editors' autocompletion sends more (llama.cpp and vLLM take them)
MAX_TOKENS = 32768
SEED_MODULUS = 2**63


class UnsupportedParameter(ValueError):
    """A request asks for something this server does not do; ``param`` names it."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


# Other fields are read (so that unsupported ones are refused by name, harmless ones kept), but
# the published schema lists only the supported ones.
_STRICT = ConfigDict(extra="allow", allow_inf_nan=False, json_schema_extra={"additionalProperties": False})


class TextPart(BaseModel):
    model_config = _STRICT
    type: str = Field(description="only 'text' parts are supported")
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[TextPart], None] = None
    name: str | None = None


class ChatTemplateKwargs(BaseModel):
    model_config = _STRICT
    enable_thinking: bool | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class _Common(BaseModel):
    """Parameters shared by chat and text completions."""

    model_config = _STRICT
    model: str | None = Field(None, description="an id from GET /v1/models (optional: the loaded model)")
    max_tokens: int | None = Field(None, ge=1, description="new tokens at most (shortened to the context window)")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, description="extension (as in vLLM): 0 = off")
    stop: Union[str, list[str], None] = None
    seed: int | None = Field(None, description="makes sampling reproducible (taken modulo 2^63)")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1)
    user: str | None = None
    block_size: int | None = Field(None, ge=1, le=16, description="extension: DFlash block size (1 = no drafting)")
    fallback: bool | None = Field(None, description="extension: dynamic fallback on/off (default: the app's)")


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    reasoning_effort: Literal["low", "medium", "high"] | None = Field(
        None, description="harmony models (gpt-oss): the system message's 'Reasoning: <level>'; refused for others")
    chat_template_kwargs: ChatTemplateKwargs | None = Field(
        None, description="extension (as in vLLM): enable_thinking turns a Qwen3-style model's thinking on or off")


class CompletionRequest(_Common):
    prompt: Union[str, list[str]]
    suffix: str | None = None
    echo: bool | None = None
    best_of: int | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _text_prompt(cls, value):
        """OpenAI's API also takes token ids ([1, 2] or [[1, 2]]); they are another tokenizer's ids
        as often as this model's, so this server takes text only, and says so."""
        if isinstance(value, list) and value and all(isinstance(v, (int, list)) for v in value):
            raise ValueError("token-id prompts are not supported by this server: send the prompt as text")
        return value


# fields that do not change the output: accepted, kept with the session
IGNORED = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
                     "parallel_tool_calls", "stream_options"})
UNSUPPORTED = {
    "tools": "tools / function calling is not supported by this server",
    "tool_choice": "tools / function calling is not supported by this server",
    "functions": "function calling is not supported by this server",
    "function_call": "function calling is not supported by this server",
    "logprobs": "logprobs are not supported by this server",
    "top_logprobs": "logprobs are not supported by this server",
    "logit_bias": "logit_bias is not supported by this server",
    "frequency_penalty": "frequency_penalty is not supported by this server (only 0)",
    "presence_penalty": "presence_penalty is not supported by this server (only 0)",
    "response_format": "response_format is not supported by this server (only {'type': 'text'})",
    "prediction": "predicted outputs are not supported: the DFlash draft predicts by itself",
    "audio": "audio output is not supported by this server",
    "modalities": "only text output is supported by this server",
    "reasoning_effort": "reasoning_effort applies to chat completions (/v1/chat/completions) of harmony models",
    "web_search_options": "web search is not supported by this server",
    "suffix": "suffix (fill-in-the-middle) is not supported by this server's models",
    "echo": "echo is not supported by this server",
    "best_of": "best_of is not supported by this server (only 1)",
}


HONOURED = {"ChatCompletionRequest": ("reasoning_effort",)}  # of UNSUPPORTED: what one endpoint does take
HARMLESS_VALUES = {"response_format": ({"type": "text"},), "modalities": (["text"],), "tool_choice": ("none",)}


def _asks_for_nothing(name: str, value: Any) -> bool:
    """Values of unsupported parameters that ask for nothing (many clients send them)."""
    if name == "best_of":
        return value in (None, 1)
    if value is None or value is False or value in ({}, []):
        return True
    if isinstance(value, (int, float)) and value == 0:
        return True
    return value in HARMLESS_VALUES.get(name, ())


@dataclass(frozen=True)
class Defaults:
    """What the app uses where a request says nothing."""

    max_tokens: int = 256
    block_size: int | None = None
    fallback: bool = True


@dataclass(frozen=True)
class ApiRequest:
    kind: str  # "chat" | "complete"
    prompt: Any  # chat: [{"role", "content"}]; complete: the text
    sampling: SamplingConfig
    fallback: FallbackConfig
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    params: dict = field(default_factory=dict)  # the client's parameters as sent (no messages/prompt)

    @property
    def raw(self) -> bool:
        return self.kind == "complete"


def check_supported(body: _Common) -> None:
    """Refuse, by name, every parameter the server does not honour."""
    given = {**body.model_dump(exclude_unset=True), **(body.model_extra or {})}
    for name, value in given.items():
        if name in UNSUPPORTED and name not in HONOURED.get(type(body).__name__, ()) and not _asks_for_nothing(name, value):
            raise UnsupportedParameter(name, f"{name}: {UNSUPPORTED[name]}")
        if name not in UNSUPPORTED and name not in IGNORED and name not in type(body).model_fields:
            raise UnsupportedParameter(name, f"Unrecognized request argument supplied: {name}")
    if (body.n or 1) > 1:
        raise UnsupportedParameter("n", "n: only one choice per request (n = 1) is supported by this server")


def _message_text(index: int, message: ChatMessage) -> str:
    where = f"messages[{index}]"
    if message.role in ("tool", "function"):
        raise UnsupportedParameter(f"{where}.role", f"{where}.role: '{message.role}' messages (tool results) "
                                                    "are not supported by this server")
    for name, value in (message.model_extra or {}).items():
        if name in ("tool_calls", "function_call", "audio") and not _asks_for_nothing(name, value):
            raise UnsupportedParameter(f"{where}.{name}", f"{where}.{name}: not supported by this server")
    if message.content is None:
        raise UnsupportedParameter(f"{where}.content", f"{where}.content: a text content is required")
    if isinstance(message.content, str):
        return message.content
    texts = []
    for j, part in enumerate(message.content):
        if part.type != "text" or part.text is None:
            raise UnsupportedParameter(f"{where}.content[{j}]", f"{where}.content[{j}]: only text parts are "
                                       f"supported by this server (got type {part.type!r})")
        texts.append(part.text)
    return "".join(texts)


def chat_messages(body: ChatCompletionRequest) -> list[dict]:
    """Plain {"role", "content"} messages ('developer' is the newer name of 'system')."""
    return [{"role": "system" if m.role == "developer" else m.role, "content": _message_text(i, m)}
            for i, m in enumerate(body.messages)]


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOPS:
        raise UnsupportedParameter("stop", f"stop: at most {MAX_STOPS} stop sequences (got {len(stops)})")
    return tuple(s for s in stops if s)


def check_not_empty(kind: str, prompt) -> None:
    """The app's one empty-prompt rule (``EmptyPromptError``): the text to answer is not blank,
    i.e. the last user message of a chat, or a completion's prompt."""
    if kind == "chat":
        users = [m["content"] for m in prompt if m["role"] == "user"]
        check_prompt_text(users[-1] if users else "")
    else:
        check_prompt_text(prompt if isinstance(prompt, str) else "x")  # token-id prompts: checked as ids


def to_api_request(body: _Common, defaults: Defaults) -> ApiRequest:
    """Check a parsed body and turn it into engine configs; raises ``UnsupportedParameter``."""
    check_supported(body)
    if isinstance(body, ChatCompletionRequest):
        kind, prompt = "chat", chat_messages(body)
        max_tokens = body.max_completion_tokens or body.max_tokens
    else:
        kind, prompt = "complete", body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise UnsupportedParameter("prompt", f"prompt: exactly one prompt per request (got {len(prompt)})")
            prompt = prompt[0]
        max_tokens = body.max_tokens
    check_not_empty(kind, prompt)
    if max_tokens is not None and max_tokens > MAX_TOKENS:
        raise UnsupportedParameter("max_tokens", f"max_tokens: at most {MAX_TOKENS} (got {max_tokens})")
    sampling = SamplingConfig(
        max_new_tokens=max_tokens or defaults.max_tokens,
        block_size=body.block_size if body.block_size is not None else defaults.block_size,
        temperature=body.temperature if body.temperature is not None else 0.0,
        top_p=body.top_p if body.top_p is not None else 1.0, top_k=body.top_k or 0,
        seed=None if body.seed is None else body.seed % SEED_MODULUS,
    )
    fallback = FallbackConfig(enabled=defaults.fallback if body.fallback is None else body.fallback)
    params = body.model_dump(exclude_unset=True, exclude={"messages", "prompt"})
    params.update({k: v for k, v in (body.model_extra or {}).items() if k in IGNORED})
    return ApiRequest(kind, prompt, sampling, fallback, _stops(body.stop), body.stream,
                      bool(body.stream_options and body.stream_options.include_usage), body.model, params)
