"""What the engine worker tells whoever asked for a reply, in order, on one queue:

    Saved(message_id)  the reply's row exists (None: a reply that is not stored); then
    EventItem(event)   each engine event (engine.events), as it was recorded;
    Refused(reason)    instead of the above: the reply did not start (no model, a bad request);
    ReplyError(error)  the reply could not be recorded, or the worker never ran it;
    Done()             always last.

Frozen and typed like the engine's own events, so a reader matches on the class and a new kind
of item cannot slip past unnoticed.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.events import Event


@dataclass(frozen=True)
class Saved:
    message_id: int | None


@dataclass(frozen=True)
class EventItem:
    event: Event


@dataclass(frozen=True)
class Refused:
    reason: str


@dataclass(frozen=True)
class ReplyError:
    """Named apart from ``engine.events.Failed`` (the engine's own failure, an ``EventItem``)."""

    error: str


@dataclass(frozen=True)
class Done:
    pass


ReplyItem = Saved | EventItem | Refused | ReplyError | Done
