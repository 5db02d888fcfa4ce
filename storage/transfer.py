"""The JSON export format, and the checks an import document must pass before anything is written.

A document is ``{"format": "dflash-studio-sessions", "version": 2, "exported_at": ...,
"sessions": [...]}``; each session carries its messages in order and each message its cycles (the
engine's cycle dicts) and, where Compare ran on it, its ``comparison`` (version 2; version 1
documents have none). Local row ids are left out: a session is identified by its ``uuid``, which
is what makes importing the same file twice a no-op.
"""

from __future__ import annotations

import json
from typing import Any

from .cycles import encode_cycle
from .errors import ImportFormatError
from .fields import (
    MESSAGE_EDITABLE_FIELDS,
    check_role,
    check_status,
    message_columns,
)

EXPORT_FORMAT = "dflash-studio-sessions"
EXPORT_VERSION = 2

SESSION_KEYS = ("uuid", "title", "created_at", "updated_at", "model", "settings", "messages")
MESSAGE_KEYS = ("seq", "role", "created_at", "updated_at") + MESSAGE_EDITABLE_FIELDS + ("cycles", "comparison")


def parse_export(data: bytes | str) -> Any:
    """The JSON in an export file, as the page's upload and ``sessions import`` both read it:
    UTF-8 (a byte-order mark allowed, as Windows editors write it) or UTF-16 with its mark (what
    PowerShell 5's ``>`` writes). Raises ImportFormatError with the reason, worded to follow the
    file's name ('notes.txt is not JSON (...)')."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-16") if data.startswith((b"\xff\xfe", b"\xfe\xff")) else data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ImportFormatError("is not UTF-8 (or UTF-16 with a byte-order mark) text") from None
    try:
        return json.loads(data.removeprefix("\ufeff"))
    except json.JSONDecodeError as exc:
        raise ImportFormatError(f"is not JSON ({exc})") from None
    except RecursionError:  # JSON nested thousands deep: no export looks like that
        raise ImportFormatError("is not an export file (JSON nested too deeply)") from None


class _Invalid(Exception):
    """A problem at a place in the document (internal: becomes ImportFormatError)."""

    def __init__(self, where: str, problem: str):
        super().__init__(f"{where}: {problem}" if where else problem)


def _require(mapping: dict, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in mapping:
        raise _Invalid(where, f"missing {key!r}")
    value = mapping[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _Invalid(f"{where}.{key}" if where else key, f"expected {names}, got {type(value).__name__}")
    return value


def _check_keys(mapping: dict, allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise _Invalid(where, f"unknown key(s) {', '.join(map(repr, unknown))}")


def check_document(data: Any) -> list[dict]:
    """Validate a whole export document and return its sessions; ``ImportFormatError`` names the first problem."""
    try:
        return _check_document(data)
    except _Invalid as exc:
        raise ImportFormatError(f"not a valid dflash-studio sessions export: {exc}") from None


def _check_document(data: Any) -> list[dict]:
    if not isinstance(data, dict):
        raise _Invalid("", f"expected a JSON object, got {type(data).__name__}")
    if data.get("format") != EXPORT_FORMAT:
        raise _Invalid("format", f"expected {EXPORT_FORMAT!r}, got {data.get('format')!r}")
    version = _require(data, "version", int, "")
    if version > EXPORT_VERSION:
        raise _Invalid("version", f"{version} is newer than this dflash-studio reads ({EXPORT_VERSION})")
    if version < 1:
        raise _Invalid("version", f"expected 1..{EXPORT_VERSION}, got {version}")
    sessions = _require(data, "sessions", list, "")
    seen_uuids: set[str] = set()
    for s_index, session in enumerate(sessions):
        _check_session(session, f"sessions[{s_index}]", seen_uuids)
    return sessions


def _check_session(session: Any, where: str, seen_uuids: set[str]) -> None:
    if not isinstance(session, dict):
        raise _Invalid(where, f"expected an object, got {type(session).__name__}")
    _check_keys(session, SESSION_KEYS, where)
    uuid = _require(session, "uuid", str, where)
    if not uuid.strip():
        raise _Invalid(f"{where}.uuid", "must not be empty")
    if uuid in seen_uuids:
        raise _Invalid(f"{where}.uuid", f"{uuid!r} appears twice in this document")
    seen_uuids.add(uuid)
    _require(session, "title", str, where)
    for key in ("created_at", "updated_at", "model"):
        if key in session:
            _require(session, key, str, where)
    if "settings" in session:
        _require(session, "settings", dict, where)
    messages = _require(session, "messages", list, where)
    seen_seqs: set[int] = set()
    for m_index, message in enumerate(messages):
        _check_message(message, f"{where}.messages[{m_index}]", seen_seqs)


def _check_message(message: Any, where: str, seen_seqs: set[int]) -> None:
    if not isinstance(message, dict):
        raise _Invalid(where, f"expected an object, got {type(message).__name__}")
    _check_keys(message, MESSAGE_KEYS, where)
    seq = _require(message, "seq", int, where)
    if seq < 1 or seq in seen_seqs:
        raise _Invalid(f"{where}.seq", f"{seq} is not a new positive sequence number in its session")
    seen_seqs.add(seq)
    _require(message, "content", str, where)
    for key in ("created_at", "updated_at"):
        if key in message:
            _require(message, key, str, where)
    try:
        check_role(message.get("role"))
        if "status" in message:
            check_status(message["status"])
        message_columns({key: value for key, value in message.items() if key in MESSAGE_EDITABLE_FIELDS})
    except ValueError as exc:
        raise _Invalid(where, str(exc)) from None
    if "comparison" in message:
        _require(message, "comparison", dict, where)
    cycles = message.get("cycles", [])
    if not isinstance(cycles, list):
        raise _Invalid(f"{where}.cycles", f"expected list, got {type(cycles).__name__}")
    seen_indexes: set[int] = set()
    for c_index, cycle in enumerate(cycles):
        try:
            encode_cycle(cycle, message_id=0)
        except ValueError as exc:
            raise _Invalid(f"{where}.cycles[{c_index}]", str(exc)) from None
        if cycle["index"] in seen_indexes:
            raise _Invalid(f"{where}.cycles[{c_index}].index", f"{cycle['index']} appears twice")
        seen_indexes.add(cycle["index"])
