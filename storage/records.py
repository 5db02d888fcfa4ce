"""What the store hands out: small frozen records (like the value types of simonw's ``llm``),
not rows to edit. Change a session or a message through ``SessionStore``'s methods.

Each record also reads like a read-only mapping (``message["role"]``, ``dict(message)``,
``{**session}``), so that code written against rows keeps working; prefer the attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any


API_SOURCE = "api"  # settings["source"] of the sessions and messages that came through the HTTP API


def stored_model(row: Mapping[str, Any] | None) -> str:
    """The model name a stored session or message was made with: its settings' (where a model
    switch records it), else its column; "" when none was stored."""
    if not row:
        return ""
    return str((row.get("settings") or {}).get("model") or row.get("model") or "")


def number_replies(messages) -> dict[int, int]:
    """Message id -> the reply's number in its session: 1, 2, … over the assistant's messages in
    order. What every view calls a reply ("reply 2"), whatever the user messages between them."""
    replies = [m for m in messages if m["role"] == "assistant"]
    return {m["id"]: number for number, m in enumerate(replies, 1)}


class _ReadOnlyMapping(Mapping):
    """Mapping access to a dataclass's fields (equal to a dict with the same items)."""

    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_row(cls, row: Mapping[str, Any], **overrides: Any):
        return cls(**{name: overrides[name] if name in overrides else row[name] for name in cls._names()})


class _Stored(_ReadOnlyMapping):
    """What sessions and messages both tell from their settings."""

    @property
    def from_api(self) -> bool:
        """Whether it came through the HTTP API (an editor, a script), not the page."""
        return (self["settings"] or {}).get("source") == API_SOURCE


@dataclass(frozen=True, eq=False)
class Session(_Stored):
    id: int
    uuid: str
    title: str
    created_at: str
    updated_at: str
    model: str
    settings: dict  # the settings last used (block size, temperature, ...; see ui.chat.handlers.SETTING_KEYS)
    message_count: int


@dataclass(frozen=True, eq=False)
class Message(_Stored):
    id: int
    session_id: int
    seq: int  # 1, 2, ... within the session
    role: str  # user | assistant | system
    content: str
    status: str  # streaming | complete | interrupted | error
    error: str | None
    kind: str  # chat | complete
    model: str | None
    settings: dict
    created_at: str
    updated_at: str
    prompt_tokens: int | None
    new_tokens: int | None
    tokens_per_s: float | None
    mean_tau: float | None
    prefill_ms: float | None
    decode_ms: float | None
    total_ms: float | None
    finish_reason: str | None
    reasoning: str = ""  # a reasoning model's reasoning; ``content`` is the answer alone
    reasoning_tokens: int | None = None


@dataclass(frozen=True)
class SessionMatch:
    """A session a search found: where its best match is (``field``: title | message) and that
    match in context (``snippet``), the matched words between the marks the search was given."""

    session: Session
    field: str
    snippet: str
