"""The reply service: one request run on the engine and recorded in the store, for the page and
the API alike.

``ReplyService`` holds the engine host, the store and the registry of running replies (their
cancel flags). ``start`` queues a request on the ONE engine worker, where ``record_reply``
encodes, checks, generates and saves it, and puts typed items (``service.items``) on the
caller's queue as it goes: the page (``ui.chat.generation``) draws them, the API (``app.api_runs``)
serialises them. A reply is recorded the same way whoever asked for it: text, every cycle and
the final stats, flushed at least once a second, and a reply cut short kept as 'interrupted'.

The recording happens on the worker thread, not in whoever reads the queue: a client that goes
away mid-reply leaves the reply to finish and be saved.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from engine.config import FallbackConfig, SamplingConfig
from engine.errors import DFlashError
from engine.events import Cycle, Failed, Finished, Started, event_to_dict
from engine.interface import capabilities_of
from engine.reasoning import chat_options, encode_chat, reasoning_events
from engine.stops import with_stops

from .host import EngineHost
from .items import Done, EventItem, Refused, ReplyError, ReplyItem, Saved
from .registry import CancelRegistry

if TYPE_CHECKING:
    from storage import SessionStore

T = TypeVar("T")


@dataclass(frozen=True)
class GenerationRequest:
    """A request, checked at the edge that took it (the page or the API)."""

    session_id: int | None  # None: a reply that is not stored (the API with --no-store-api)
    prompt: object  # chat messages (list of dicts) or raw text
    raw: bool
    kind: str  # "chat" | "complete"
    sampling: SamplingConfig
    fallback: FallbackConfig
    settings: dict  # stored with the reply; "model" names the pair that answers
    stop: tuple[str, ...] = ()  # stop strings (the API's ``stop``): the reply ends before the first one

    @property
    def model(self) -> str | None:
        return self.settings.get("model")


class Out(Protocol):
    """Where the items go: a ``queue.Queue``, or anything with ``put``."""

    def put(self, item: ReplyItem) -> None: ...


@dataclass(frozen=True)
class ReplyRun:
    """A request handed to the engine worker: its cancel flag and its job."""

    request: GenerationRequest
    cancel: threading.Event
    job: Future


@dataclass
class ReplyService:
    store: "SessionStore"
    engines: EngineHost
    flush_interval_s: float = 1.0  # a streaming reply is saved at least this often
    _registry: CancelRegistry = field(default_factory=CancelRegistry)

    # ------------------------------------------------------------------ replies
    def start(self, request: GenerationRequest, out: Out) -> ReplyRun:
        """Queue the request on the engine worker (on its session's model, loaded first if need
        be); items go to ``out``, ``Done`` last, also when the worker never runs it. Its cancel
        flag stays registered until the job ends: Stop reaches it whoever still reads ``out``."""
        cancel = self._new_cancel(request.session_id)
        try:
            job = self.engines.submit(lambda engine: record_reply(self, request, engine, cancel, out),
                                      model=request.model)
        except BaseException:
            self._forget(request.session_id, cancel)
            raise
        job.add_done_callback(lambda finished: self._after_job(request.session_id, cancel, out, finished))
        return ReplyRun(request, cancel, job)

    def release(self, run: ReplyRun) -> None:
        """Whoever asked is done with the run: stop it if it still runs, forget its cancel flag."""
        run.cancel.set()
        self._forget(run.request.session_id, run.cancel)

    def run_job(self, session_id: int, work: Callable[[Any, threading.Event], T],
                model: str | None = None) -> tuple[threading.Event, "Future[T]"]:
        """Other engine work for a session (Teach's comparison): ``work(engine, cancel)`` on the
        worker, stopped by the session's Stop like a reply, and refused-while-pending alike."""
        self.mark_request(session_id)  # a Stop pressed before this request was for something else
        cancel = self._registry.new_cancel(session_id)

        def job_work(engine):
            try:
                return work(engine, cancel)
            finally:  # forgotten before the caller hears the result: its next request finds none pending
                self._forget(session_id, cancel)

        try:
            job = self.engines.submit(job_work, model=model)
        except BaseException:
            self._forget(session_id, cancel)
            raise
        job.add_done_callback(lambda finished: self._forget(session_id, cancel))  # also a job that never ran
        return cancel, job

    # ------------------------------------------------------------------ Stop and what waits
    def mark_request(self, session_id: int) -> None:
        """A reply was asked for: a Stop from now on applies to it, even while it waits in the queue."""
        self._registry.mark_request(session_id)

    def stop(self, session_id: int | None) -> bool:
        """Stop every reply of the session within a cycle (or before it starts); whether one ran."""
        return self._registry.cancel(session_id)

    def reply_pending(self, session_id: int | None) -> bool:
        """Whether a reply (or a comparison) for this session waits for the engine or runs."""
        return self._registry.pending(session_id)

    def _new_cancel(self, session_id: int | None) -> threading.Event:
        # a reply that is not stored belongs to no session: only its own client stops it
        return self._registry.new_cancel(session_id) if session_id is not None else threading.Event()

    def _forget(self, session_id: int | None, cancel: threading.Event) -> None:
        if session_id is not None:
            self._registry.forget(session_id, cancel)

    def _after_job(self, session_id: int | None, cancel: threading.Event, out: Out, job: Future) -> None:
        """Forget the cancel flag, also when the job never ran; a job that failed or was cancelled
        before ``record_reply`` ran (an unknown model, the worker shut down) never sent ``Done``,
        so the reader gets its reason and ``Done`` here (items after a ``Done`` are never read)."""
        self._forget(session_id, cancel)
        failure = "the engine worker stopped before it ran this request" if job.cancelled() else job.exception()
        if failure is not None:
            out.put(ReplyError(failure if isinstance(failure, str) else f"{type(failure).__name__}: {failure}"))
            out.put(Done())


class UnsavedReply:
    """Stands in for the store's ``ReplyWriter`` when a reply is not to be stored."""

    message_id = None

    def __init__(self):
        self.finished = False

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        return None

    def add_cycle(self, cycle: dict) -> None:
        return None

    def set_content(self, text: str) -> None:
        return None

    def flush(self) -> None:
        return None

    def maybe_flush(self) -> None:
        return None

    def finish(self, status: str, **fields) -> None:
        self.finished = True


def record_reply(service: ReplyService, request: GenerationRequest, engine, cancel: threading.Event, out: Out) -> None:
    """Runs on the engine worker: encode, check, generate, save; ``Saved`` first, then every
    event as an ``EventItem``; a refusal before the start is ``Refused``, a failure while saving
    ``ReplyError``, and ``Done`` comes last. Errors never vanish: they are saved on the reply
    (when there is one) and sent to ``out``. The cancel flag is forgotten before ``Done`` is
    sent, so the caller's next request finds no reply pending."""
    try:
        events = _start_events(engine, request, cancel, out)
        if events is not None:
            _save_events(service, request, engine, events, out)
    finally:
        service._forget(request.session_id, cancel)
        out.put(Done())


def _start_events(engine, request: GenerationRequest, cancel: threading.Event, out: Out):
    """The engine's event iterator for this request, or None after telling ``out`` why not."""
    if engine is None:
        out.put(Refused("no model is loaded (see the model status above the settings)"))
    elif cancel.is_set():
        out.put(Refused("stopped before generation started (your message is kept: Regenerate answers it)"))
    else:
        try:
            ids = encode_chat(engine, request.prompt, request.raw, chat_options(request.settings))
            events = engine.generate(ids, request.sampling, request.fallback, cancel)  # checks the request now
            events = with_stops(events, request.stop, cancel) if request.stop else events
            return reasoning_events(engine, ids, request.raw, events)  # the answer apart from any reasoning
        except (DFlashError, ValueError) as exc:
            out.put(Refused(str(exc)))
        except Exception as exc:  # noqa: BLE001 - shown to the user, not swallowed
            out.put(Refused(f"{type(exc).__name__}: {exc}"))
    return None


def _open_writer(service: ReplyService, request: GenerationRequest, engine):
    if request.session_id is None:
        return UnsavedReply()
    caps = capabilities_of(engine)
    settings = dict(request.settings, engine=caps.kind)  # which engine made the reply
    if not caps.fallback:
        settings["fallback"] = False  # the engine has no per-request fallback: say what really ran
    message_id = service.store.start_reply(request.session_id, model=getattr(engine, "name", ""),
                                           settings=settings, kind=request.kind)
    return service.store.reply_writer(message_id, flush_interval_s=service.flush_interval_s)


def _record_event(writer, event, text: str) -> str:
    """Save one engine event on the reply; returns the reply's text so far."""
    if isinstance(event, Started):
        text = event.first_answer_text  # the answer's text: any reasoning is stored apart
        writer.set_content(text)
        writer.flush()
    elif isinstance(event, Cycle):
        text += event.answer_text
        writer.add_cycle(event_to_dict(event))
        writer.set_content(text)
        writer.maybe_flush()
    elif isinstance(event, Finished):
        writer.set_content(event.text)  # what the client got: a stop string may cut it to ""
        status = "interrupted" if event.reason == "cancelled" else "complete"
        writer.finish(status, stats=event_to_dict(event))
    elif isinstance(event, Failed):  # an engine that went away mid-reply leaves it interrupted
        writer.finish("interrupted" if event.interrupted else "error", error=event.message)
    return text


def _save_events(service: ReplyService, request: GenerationRequest, engine, events, out: Out) -> None:
    try:
        with _open_writer(service, request, engine) as writer:
            out.put(Saved(writer.message_id))
            text = ""
            for event in events:
                text = _record_event(writer, event, text)
                out.put(EventItem(event))
            if not writer.finished:  # the stream ended without Finished/Failed
                writer.finish("interrupted")
    except Exception as exc:  # noqa: BLE001 - the writer saved the reply as 'error'; tell the caller
        out.put(ReplyError(f"{type(exc).__name__}: {exc}"))
