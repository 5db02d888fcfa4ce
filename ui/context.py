"""What the UI is handed by ``app``: a store, an engine host and defaults. The UI never builds
these itself (the layering rule in docs/architecture.md: ``ui`` imports only the engine's event types and configs, and the
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

    def resolve(self, name: str | None) -> str | None: ...  # the key a (stored, older) model name means

    def submit(self, fn: Callable[[Any], Any], model: str | None = None) -> Future: ...  # fn(engine) on the worker,
    # after pending loads; with ``model``, on that model (loaded first when another one is loaded)

    def switch(self, key: str) -> Future: ...  # load another model; the old one stays on failure


@dataclass
class Defaults:
    max_new_tokens: int = 256
    block_size: int | None = None  # None: the draft's own block size
    temperature: float = 0.0
    top_p: float = 1.0
    fallback: bool = True  # dynamic fallback starts on; the toggle turns it off
    show_rejected: bool = False  # rejected drafts on demand: shown inline they break the code's reading
    max_block_size: int = MAX_BLOCK_SIZE  # the block-size slider's end


@dataclass(frozen=True)
class PageStream:
    """A reply stream one browser page draws: ``left`` when the page moved on, ``ended`` once the
    stream has sent its last update."""

    left: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)


@dataclass
class UIContext:
    store: Any  # storage.SessionStore
    engines: EngineHost
    defaults: Defaults = field(default_factory=Defaults)
    flush_interval_s: float = 1.0
    yield_interval_s: float = 0.05  # at most ~20 UI updates a second (cycles in between are coalesced)
    chart_interval_s: float = 0.5
    _cancels: dict = field(default_factory=dict)  # session -> the cancel flags of its running replies
    _requested: dict = field(default_factory=dict)  # session -> when its last reply was asked for
    _stopped: dict = field(default_factory=dict)  # session -> when Stop was last pressed
    _page_streams: dict = field(default_factory=dict)  # page -> the PageStream it draws
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def watch_stream(self, page: str) -> "PageStream":
        """A page starts drawing a reply stream (one at a time: a stream it drew before stops)."""
        stream = PageStream()
        with self._lock:
            before = self._page_streams.get(page)
            self._page_streams[page] = stream
        if before is not None:
            before.left.set()
        return stream

    def leave_stream(self, page: str | None, wait_s: float = 1.0) -> None:
        """The page shows another session: its reply stream stops drawing (the reply goes on
        generating on the engine worker, and is saved). Waits until the stream has sent its
        last update, so that the caller's view reaches the page after it."""
        with self._lock:
            stream = self._page_streams.pop(page, None)
        if stream is not None:
            stream.left.set()
            stream.ended.wait(wait_s)  # a stalled engine sends nothing meanwhile, so nothing can overtake

    def end_stream(self, page: str, stream: "PageStream") -> None:
        stream.ended.set()
        with self._lock:
            if self._page_streams.get(page) is stream:
                del self._page_streams[page]

    def mark_request(self, session_id: int) -> None:
        """A reply was asked for (send, regenerate, edit, compare): a Stop from now on applies to
        it, even while it still waits in the queue for the engine."""
        with self._lock:
            self._requested[session_id] = time.monotonic()

    def new_cancel(self, session_id: int) -> threading.Event:
        """The cancel flag of the reply about to run; already set when Stop was pressed while the
        request waited in the queue. It stays registered until ``forget_cancel``, which the reply's
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

    def reply_pending(self, session_id: int | None) -> bool:
        """Whether a reply (or a comparison) for this session is queued on the engine or running."""
        with self._lock:
            return bool(self._cancels.get(session_id))

    def forget_cancel(self, session_id: int, event: threading.Event) -> None:
        with self._lock:
            events = [e for e in self._cancels.get(session_id, ()) if e is not event]
            self._cancels[session_id] = events
            if not events:
                self._cancels.pop(session_id, None)
