"""What the UI is handed by ``app``: a store, an engine host and defaults. The UI never builds
these itself (DESIGN §1: ``ui`` imports only the engine's event types and configs, and the
store's named errors so that it can turn them into messages)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from engine.config import MAX_BLOCK_SIZE
from engine.events import LoadStatus
from storage.errors import StoreError

# What a store call may raise that the UI turns into a message (a bad id, a bad value).
STORE_ERRORS: tuple[type[Exception], ...] = (StoreError, ValueError)


class EngineHost(Protocol):
    """Owns the engine and the ONE worker thread every engine call runs on."""

    def status(self) -> LoadStatus: ...

    @property
    def engine(self) -> Any | None: ...

    @property
    def current_key(self) -> str: ...

    def choices(self) -> list[tuple[str, str]]: ...  # (label, key) for the model picker

    def submit(self, fn: Callable[[Any], Any]) -> Future: ...  # fn(engine) on the worker, after pending loads

    def switch(self, key: str) -> Future: ...  # load another model; the old one stays on failure


@dataclass
class Defaults:
    max_new_tokens: int = 256
    block_size: int | None = None  # None: the draft's own block size
    temperature: float = 0.0
    top_p: float = 1.0
    fallback: bool = True  # dynamic fallback starts on; the toggle turns it off
    show_rejected: bool = True
    max_block_size: int = MAX_BLOCK_SIZE  # the block-size slider's end


@dataclass
class UIContext:
    store: Any  # storage.SessionStore
    engines: EngineHost
    defaults: Defaults = field(default_factory=Defaults)
    flush_interval_s: float = 1.0
    yield_interval_s: float = 0.05  # at most ~20 UI updates a second (cycles in between are coalesced)
    chart_interval_s: float = 0.5
    _cancels: dict = field(default_factory=dict)
    _requested: dict = field(default_factory=dict)  # session -> when its last reply was asked for
    _stopped: dict = field(default_factory=dict)  # session -> when Stop was last pressed
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def mark_request(self, session_id: int) -> None:
        """A reply was asked for (send, regenerate, edit): a Stop from now on applies to it, even
        while it still waits in the queue for the engine."""
        with self._lock:
            self._requested[session_id] = time.monotonic()

    def new_cancel(self, session_id: int) -> threading.Event:
        """The cancel flag of the reply about to run; already set when Stop was pressed while the
        request waited in the queue."""
        event = threading.Event()
        with self._lock:
            self._cancels[session_id] = event
            requested, stopped = self._requested.get(session_id), self._stopped.get(session_id)
        if requested is not None and stopped is not None and stopped >= requested:
            event.set()
        return event

    def cancel(self, session_id: int | None) -> bool:
        """Ask the generation for this session to stop after its current cycle, or not to start
        when it is still queued. Returns whether a running generation was told."""
        with self._lock:
            self._stopped[session_id] = time.monotonic()
            event = self._cancels.get(session_id)
        if event is None:
            return False
        event.set()
        return True

    def forget_cancel(self, session_id: int, event: threading.Event) -> None:
        with self._lock:
            if self._cancels.get(session_id) is event:
                del self._cancels[session_id]
