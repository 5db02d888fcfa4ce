"""Which replies are waiting for the engine or running, per session, and their cancel flags.

The reply service owns one; the page and the API reach it only through ``ReplyService``
(``stop``, ``reply_pending``, ``mark_request``), never directly.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class CancelRegistry:
    _cancels: dict[int, list[threading.Event]] = field(default_factory=dict)  # session -> its running replies' flags
    _requested: dict[int, float] = field(default_factory=dict)  # session -> when its last reply was asked for
    _stopped: dict[int, float] = field(default_factory=dict)  # session -> when Stop was last pressed
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def mark_request(self, session_id: int) -> None:
        """A reply was asked for (send, regenerate, edit, compare): a Stop from now on applies to
        it, even while it still waits in the queue for the engine."""
        with self._lock:
            self._requested[session_id] = time.monotonic()

    def new_cancel(self, session_id: int) -> threading.Event:
        """The cancel flag of the reply about to run; already set when Stop was pressed while the
        request waited in the queue. It stays registered until ``forget``, which the reply's
        engine job calls when it ends: a page that stopped watching can still stop it later."""
        event = threading.Event()
        with self._lock:
            self._cancels.setdefault(session_id, []).append(event)
            requested, stopped = self._requested.get(session_id), self._stopped.get(session_id)
        if requested is not None and stopped is not None and stopped >= requested:
            event.set()
        return event

    def cancel(self, session_id: int | None) -> bool:
        """Ask every generation for this session to stop after its current cycle, or not to start
        when it is still queued. Returns whether a running generation was told."""
        with self._lock:
            self._stopped[session_id] = time.monotonic()
            events = list(self._cancels.get(session_id, ()))
        for event in events:
            event.set()
        return bool(events)

    def pending(self, session_id: int | None) -> bool:
        """Whether a reply (or a comparison) for this session is queued on the engine or running."""
        with self._lock:
            return bool(self._cancels.get(session_id))

    def forget(self, session_id: int | None, event: threading.Event) -> None:
        with self._lock:
            events = [e for e in self._cancels.get(session_id, ()) if e is not event]
            if events:
                self._cancels[session_id] = events
            else:
                self._cancels.pop(session_id, None)
