"""What a session or message may hold: the allowed values and the type of each editable field.

One place for the checks that ``SessionStore`` applies to its callers' arguments and that the
importer applies to a document, so both reject the same things with the same words.
"""

from __future__ import annotations

import json
from typing import Any

from .cycles import to_json

ROLES = ("user", "assistant", "system")
STATUSES = ("streaming", "complete", "interrupted", "error")
KINDS_HINT = ("chat", "complete")  # free text in the schema; these are the ones the app uses

MESSAGE_TEXT_FIELDS = ("content", "kind", "model", "reasoning")  # never NULL
MESSAGE_OPTIONAL_TEXT_FIELDS = ("error", "finish_reason")
MESSAGE_INT_FIELDS = ("prompt_tokens", "new_tokens", "reasoning_tokens")
MESSAGE_REAL_FIELDS = ("tokens_per_s", "mean_tau", "prefill_ms", "decode_ms", "total_ms")
MESSAGE_STAT_FIELDS = MESSAGE_INT_FIELDS + MESSAGE_REAL_FIELDS + ("finish_reason", "reasoning")
MESSAGE_EDITABLE_FIELDS = (
    ("status", "settings") + MESSAGE_TEXT_FIELDS + MESSAGE_OPTIONAL_TEXT_FIELDS
    + MESSAGE_INT_FIELDS + MESSAGE_REAL_FIELDS
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_role(role: Any) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
    return role


def check_status(status: Any) -> str:
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}; got {status!r}")
    return status


def settings_to_json(settings: Any) -> str:
    """JSON text for a settings dict (``None`` means no settings)."""
    if settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise ValueError(f"settings must be a dict, got {type(settings).__name__}")
    try:
        return to_json(settings)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"settings must be JSON-serialisable: {exc}") from None


def settings_from_json(text: str | None) -> dict:
    return json.loads(text) if text else {}


def message_columns(fields: dict[str, Any]) -> dict[str, Any]:
    """Check editable message fields and return them as column values (settings as JSON)."""
    unknown = sorted(set(fields) - set(MESSAGE_EDITABLE_FIELDS))
    if unknown:
        raise ValueError(
            f"unknown message field(s) {', '.join(unknown)}; "
            f"editable fields are {', '.join(MESSAGE_EDITABLE_FIELDS)}"
        )
    columns: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "status":
            check_status(value)
        elif name == "settings":
            value = settings_to_json(value)
        elif name in MESSAGE_TEXT_FIELDS:
            if not isinstance(value, str):
                raise ValueError(f"{name} must be a string, got {type(value).__name__}")
        elif name in MESSAGE_OPTIONAL_TEXT_FIELDS:
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a string or None, got {type(value).__name__}")
        elif name in MESSAGE_INT_FIELDS:
            if value is not None and not _is_int(value):
                raise ValueError(f"{name} must be an integer or None, got {value!r}")
        elif name in MESSAGE_REAL_FIELDS:
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{name} must be a number or None, got {value!r}")
            value = None if value is None else float(value)
        columns[name] = value
    return columns


CONTEXT_FULL_REASON = "context_full"  # finish_reason of a reply the context window cut ("length" otherwise)
# event_to_dict(Finished) key -> message column, so a reply can be finished with the engine's dict
FINISHED_EVENT_ALIASES = {"reason": "finish_reason", "mean_acceptance_length": "mean_tau"}
# the rest of a Finished dict: stored elsewhere (content, cycles) or recomputed from the cycles
FINISHED_EVENT_IGNORED = frozenset(
    {"type", "text", "token_ids", "acceptance_lengths", "cycles", "per_position_acceptance"}
)


def stats_to_message_fields(stats: dict[str, Any] | None) -> dict[str, Any]:
    """Message stat fields from a stats dict: column names, or the engine's ``Finished`` dict.

    The Finished event's token ids, text, per-cycle lists and type are skipped: the text is the
    message content and the rest is recomputed from the cycles. Any other key is an error.
    """
    if not stats:
        return {}
    if not isinstance(stats, dict):
        raise ValueError(f"stats must be a dict, got {type(stats).__name__}")
    fields = {}
    for key, value in stats.items():
        if key == "context_full":  # stored as its own finish reason, so a reloaded reply can say why
            continue
        if key in FINISHED_EVENT_IGNORED:
            continue
        column = FINISHED_EVENT_ALIASES.get(key, key)
        if column not in MESSAGE_STAT_FIELDS:
            raise ValueError(
                f"unknown stat {key!r}; stats are {', '.join(MESSAGE_STAT_FIELDS)} "
                "or the keys of the engine's Finished event"
            )
        fields[column] = value
    if stats.get("context_full") and fields.get("finish_reason") == "length":
        fields["finish_reason"] = CONTEXT_FULL_REASON
    if "new_tokens" not in fields and isinstance(stats.get("token_ids"), (list, tuple)):
        fields["new_tokens"] = len(stats["token_ids"])
    return message_columns(fields)
