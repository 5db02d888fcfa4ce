"""What the UI is handed by ``app``: the reply service (which holds the store, the engine host
and the registry of running replies) and defaults. The UI never builds these itself (the
layering rule in docs/architecture.md: ``ui`` imports the engine's event types and configs, the
reply service, and the store's named errors so that it can turn them into messages)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from engine.config import MAX_BLOCK_SIZE
from service.host import EngineHost
from service.replies import ReplyService
from storage.errors import StoreError

# Pages kept in UIContext's per-page records: a closed page is never announced, so the oldest go.
MAX_PAGES_REMEMBERED = 1024

# What a store call may raise that the UI turns into a message (a bad id, a bad value).
STORE_ERRORS: tuple[type[Exception], ...] = (StoreError, ValueError)


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
    replies: ReplyService  # runs and records replies; holds the store and the engine host
    defaults: Defaults = field(default_factory=Defaults)
    yield_interval_s: float = 0.05  # at most ~20 UI updates a second (cycles in between are coalesced)
    chart_interval_s: float = 0.5
    _page_streams: dict = field(default_factory=dict)  # page -> the PageStream it draws
    _sent_sessions: dict = field(default_factory=dict)  # page -> the session its send created (see shown_session)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def store(self):  # storage.SessionStore: the page reads sessions and messages from it
        return self.replies.store

    @property
    def engines(self) -> EngineHost:
        return self.replies.engines

    def watch_stream(self, page: str) -> "PageStream":
        """A page starts drawing a reply stream (one at a time: a stream it drew before stops)."""
        stream = PageStream()
        with self._lock:
            before = self._page_streams.get(page)
            self._page_streams[page] = stream
        if before is not None:
            before.left.set()
        return stream

    def sent_to_new_session(self, page: str | None, session_id: int) -> None:
        """A send from ``page`` created ``session_id`` (its first message)."""
        if page is None:
            return
        with self._lock:
            self._sent_sessions.pop(page, None)
            self._sent_sessions[page] = session_id
            while len(self._sent_sessions) > MAX_PAGES_REMEMBERED:  # closed pages never say so
                del self._sent_sessions[next(iter(self._sent_sessions))]

    def shown_session(self, page: str | None, session_id: int | None) -> int | None:
        """The session ``page`` shows, given the one an event read from the page when it fired.
        An event that fired on a new, empty page (``None``) but ran after that page's send
        created its session would otherwise act for a page that no longer exists: the send
        has already told the page its session, which the server knows here."""
        if session_id is not None or page is None:
            return session_id
        with self._lock:
            return self._sent_sessions.get(page)

    def leave_stream(self, page: str | None, wait_s: float = 1.0) -> None:
        """The page shows another session: its reply stream stops drawing (the reply goes on
        generating on the engine worker, and is saved), and the session its send created is
        forgotten (``shown_session``). Waits until the stream has sent its last update, so
        that the caller's view reaches the page after it."""
        with self._lock:
            stream = self._page_streams.pop(page, None)
            self._sent_sessions.pop(page, None)
        if stream is not None:
            stream.left.set()
            stream.ended.wait(wait_s)  # a stalled engine sends nothing meanwhile, so nothing can overtake

    def end_stream(self, page: str, stream: "PageStream") -> None:
        stream.ended.set()
        with self._lock:
            if self._page_streams.get(page) is stream:
                del self._page_streams[page]
