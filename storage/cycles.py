"""Cycle dicts (the engine's ``event_to_dict(Cycle)``) to ``cycles`` rows and back.

Storage does not import the engine: it relies only on the dict's keys. Scalars become columns so
that statistics can be computed in SQL; lists and nested dicts become JSON text. Keys this module
does not know (a field the engine adds later) are kept in the ``extra`` JSON column and come back
unchanged, so ``decode_cycle(encode_cycle(d))`` equals ``d`` after a JSON round trip (tuples come
back as lists, as in any JSON).
"""

from __future__ import annotations

import json
from typing import Any

# cycle dict key -> cycles column (the only renamed key is ``index``, a reserved word in SQL)
SCALAR_COLUMNS = {
    "index": "idx",
    "block_size": "block_size",
    "accepted": "accepted",
    "tau": "tau",
    "bonus": "bonus",
    "anchor": "anchor",
    "anchor_position": "anchor_position",
    "draft_ms": "draft_ms",
    "verify_ms": "verify_ms",
    "context_length": "context_length",
    "new_context_features": "new_context_features",
}
JSON_COLUMNS = ("draft_tokens", "emitted", "emitted_pieces", "rejected", "rejected_pieces", "slots")
# fallback dict key -> cycles column
FALLBACK_COLUMNS = {
    "next_block_size": "next_block_size",
    "state": "fallback_state",
    "changed": "fallback_changed",
    "reason": "fallback_reason",
}
REQUIRED_KEYS = ("index", "block_size", "accepted")
INTEGER_KEYS = ("index", "block_size", "accepted", "tau", "bonus", "anchor", "anchor_position",
                "context_length", "new_context_features")
NUMBER_KEYS = ("draft_ms", "verify_ms")
KNOWN_KEYS = frozenset(SCALAR_COLUMNS) | frozenset(JSON_COLUMNS) | {"fallback", "type"}
EVENT_TYPE = "Cycle"


def to_json(value: Any) -> str:
    """Compact JSON text that keeps non-ASCII characters readable in the database."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def encode_cycle(cycle: dict, message_id: int) -> dict:
    """The ``cycles`` row for one cycle dict; raises ``ValueError`` naming the offending key."""
    if not isinstance(cycle, dict):
        raise ValueError(f"a cycle must be a dict, got {type(cycle).__name__}")
    missing = [key for key in REQUIRED_KEYS if key not in cycle]
    if missing:
        raise ValueError(f"cycle is missing {', '.join(missing)}")
    for key in INTEGER_KEYS:
        if cycle.get(key) is not None and not _is_int(cycle[key]):
            raise ValueError(f"cycle {key} must be an integer, got {cycle[key]!r}")
    for key in NUMBER_KEYS:
        if cycle.get(key) is not None and not _is_number(cycle[key]):
            raise ValueError(f"cycle {key} must be a number, got {cycle[key]!r}")
    if cycle["block_size"] < 1 or cycle["accepted"] < 0:
        raise ValueError(f"cycle has block_size {cycle['block_size']} and accepted {cycle['accepted']}")
    if cycle.get("type", EVENT_TYPE) != EVENT_TYPE:
        raise ValueError(f"cycle type must be {EVENT_TYPE!r}, got {cycle['type']!r}")
    for key in JSON_COLUMNS:
        if not isinstance(cycle.get(key, []), (list, tuple)):
            raise ValueError(f"cycle {key} must be a list, got {type(cycle[key]).__name__}")

    row: dict[str, Any] = {"message_id": message_id}
    for key, column in SCALAR_COLUMNS.items():
        row[column] = cycle.get(key)
    if row["tau"] is None:  # the engine always sends tau; a hand-made dict may not
        row["tau"] = len(cycle["emitted"]) if "emitted" in cycle else cycle["accepted"] + 1
    fallback = cycle.get("fallback")
    if fallback is not None and not isinstance(fallback, dict):
        raise ValueError(f"cycle fallback must be a dict or None, got {type(fallback).__name__}")
    for key, column in FALLBACK_COLUMNS.items():
        row[column] = (fallback or {}).get(key)
    if row["fallback_changed"] is not None:
        row["fallback_changed"] = int(bool(row["fallback_changed"]))
    extra = {key: value for key, value in cycle.items() if key not in KNOWN_KEYS}
    extra_fallback = {key: value for key, value in (fallback or {}).items() if key not in FALLBACK_COLUMNS}
    if extra_fallback:
        extra["fallback"] = extra_fallback
    try:
        for key in JSON_COLUMNS:
            row[key] = to_json(list(cycle.get(key, [])))
        row["extra"] = to_json(extra) if extra else None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cycle {cycle['index']} has a value that is not JSON-serialisable: {exc}") from None
    return row


def decode_cycle(row: dict) -> dict:
    """The cycle dict for one ``cycles`` row: the engine's keys, ``fallback`` nested again."""
    extra = json.loads(row["extra"]) if row.get("extra") else {}
    extra_fallback = extra.pop("fallback", {})
    cycle: dict[str, Any] = {key: row[column] for key, column in SCALAR_COLUMNS.items()}
    for key in JSON_COLUMNS:
        cycle[key] = json.loads(row[key])
    if row["fallback_state"] is None and row["next_block_size"] is None and not extra_fallback:
        cycle["fallback"] = None
    else:
        cycle["fallback"] = {key: row[column] for key, column in FALLBACK_COLUMNS.items()}
        if cycle["fallback"]["changed"] is not None:
            cycle["fallback"]["changed"] = bool(cycle["fallback"]["changed"])
        cycle["fallback"].update(extra_fallback)
    cycle["type"] = EVENT_TYPE
    cycle.update(extra)
    return cycle
