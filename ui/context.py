"""What the UI is handed by ``app``: a store, an engine host and defaults. The UI never builds
these itself (DESIGN §1: ``ui`` imports only the engine's event types and configs)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


@dataclass(frozen=True)
class LoadStatus:
    state: str  # "loading" | "ready" | "failed"
    fraction: float = 0.0
    message: str = ""
    model_key: str = ""  # the model being loaded, or the one that is loaded
    error: str = ""  # why the last load failed (the previous model, if any, stays in use)


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
    fallback: bool = False  # dynamic fallback starts off; the toggle turns it on
    show_rejected: bool = True
    max_block_size: int = 16


@dataclass
class UIContext:
    store: Any  # storage.SessionStore
    engines: EngineHost
    defaults: Defaults = field(default_factory=Defaults)
    flush_interval_s: float = 1.0
    yield_interval_s: float = 0.05  # at most ~20 UI updates a second (cycles in between are coalesced)
    chart_interval_s: float = 0.5
    _cancels: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def new_cancel(self, session_id: int) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._cancels[session_id] = event
        return event

    def cancel(self, session_id: int | None) -> bool:
        """Ask the generation running for this session to stop after its current cycle."""
        with self._lock:
            event = self._cancels.get(session_id)
        if event is None:
            return False
        event.set()
        return True

    def forget_cancel(self, session_id: int, event: threading.Event) -> None:
        with self._lock:
            if self._cancels.get(session_id) is event:
                del self._cancels[session_id]
