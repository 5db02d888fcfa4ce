"""``ReplyWriter``: keeps a streaming reply durable without a transaction per token.

The app feeds it every cycle and the growing text; ``maybe_flush()`` saves the text and the
pending cycles in one short transaction at most once per ``flush_interval_s``, and ``finish()``
saves the final text, the last cycles, the status and the stats in ONE transaction. A crash
between flushes loses at most one interval; startup recovery then marks the reply 'interrupted'.
A writer belongs to the one thread that runs the generation; the store it writes to is shared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .cycles import encode_cycle
from .fields import check_status, stats_to_message_fields


class ReplySink(Protocol):
    """Where a writer saves: ``SessionStore`` is one (named here so the writer needs no store import)."""

    def save_reply(
        self, message_id: int, *, content: str | None = None, cycles: Iterable[dict] = (), **fields: Any
    ) -> None: ...


class ReplyWriter:
    """Buffers one assistant reply (text + cycles) and saves it periodically, then finally."""

    def __init__(
        self,
        store: ReplySink,
        message_id: int,
        flush_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if flush_interval_s < 0:
            raise ValueError(f"flush_interval_s must be >= 0, got {flush_interval_s}")
        self._store = store
        self.message_id = message_id
        self.flush_interval_s = flush_interval_s
        self._clock = clock
        self._content = ""
        self._content_dirty = False
        self._pending_cycles: list[dict] = []
        self._last_flush = clock()
        self.flushes = 0  # successful saves so far, the final one included
        self.finished = False

    def _check_not_finished(self) -> None:
        if self.finished:
            raise ValueError(f"reply {self.message_id} is already finished")

    def add_cycle(self, cycle: dict) -> None:
        """Queue one cycle dict (checked now, so a bad dict fails where it was made)."""
        self._check_not_finished()
        encode_cycle(cycle, self.message_id)
        self._pending_cycles.append(cycle)

    def set_content(self, text: str) -> None:
        """The reply's whole text so far."""
        self._check_not_finished()
        if not isinstance(text, str):
            raise ValueError(f"content must be a string, got {type(text).__name__}")
        if text != self._content:
            self._content = text
            self._content_dirty = True

    @property
    def has_unsaved_changes(self) -> bool:
        return self._content_dirty or bool(self._pending_cycles)

    def maybe_flush(self) -> bool:
        """Save if there is something new and ``flush_interval_s`` has passed since the last save."""
        self._check_not_finished()
        if not self.has_unsaved_changes or self._clock() - self._last_flush < self.flush_interval_s:
            return False
        self.flush()
        return True

    def flush(self) -> None:
        """Save the text and the pending cycles now; on failure they stay pending for the next try."""
        self._check_not_finished()
        self._save()

    def finish(self, status: str = "complete", stats: dict[str, Any] | None = None, error: str | None = None) -> None:
        """Save the final text, the remaining cycles, the status and the stats in one transaction.

        ``stats`` holds message stat fields or is the engine's ``event_to_dict(Finished)``.
        """
        self._check_not_finished()
        if check_status(status) == "streaming":
            raise ValueError("finish() needs a final status: complete, interrupted or error")
        fields = stats_to_message_fields(stats)
        fields["status"] = status
        if error is not None:
            fields["error"] = error
        self._save(**fields)
        self.finished = True

    def _save(self, **fields: Any) -> None:
        content = self._content if self._content_dirty else None  # else the database has it
        self._store.save_reply(self.message_id, content=content, cycles=self._pending_cycles, **fields)
        self._pending_cycles = []
        self._content_dirty = False
        self._last_flush = self._clock()
        self.flushes += 1

    def __enter__(self) -> ReplyWriter:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        """A reply left unfinished is saved as 'interrupted' (stopped) or 'error' (an exception)."""
        if self.finished:
            return
        if exc is None or not isinstance(exc, Exception):  # normal exit, GeneratorExit, Ctrl-C
            self.finish("interrupted")
        else:
            self.finish("error", error=f"{type(exc).__name__}: {exc}")
