"""One reply: run a request on the engine and record every event in the store as it comes.

The page (``ui.generation``) and the OpenAI-compatible API (``app.api_runs``) both run their
replies through ``record_reply``, on the ONE engine worker, so a reply is recorded the same way
whoever asked for it: text, every cycle and the final stats, flushed at least once a second, and a
reply cut short kept as 'interrupted'. The page renders the events; the API serialises them.

The recording happens on the worker thread, not in whoever reads ``out``: a client that goes
away mid-reply leaves the reply to finish and be saved.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from engine.config import FallbackConfig, SamplingConfig
from engine.errors import DFlashError
from engine.events import Cycle, Failed, Finished, Started, event_to_dict
from engine.interface import capabilities_of
from engine.reasoning import chat_options, encode_chat, reasoning_events
from engine.stops import with_stops

DONE = object()  # the last item ``record_reply`` puts on ``out``


@dataclass
class GenerationRequest:
    session_id: int | None  # None: a reply that is not stored (the API with --no-store-api)
    prompt: object  # chat messages (list of dicts) or raw text
    raw: bool
    kind: str  # "chat" | "complete"
    sampling: SamplingConfig
    fallback: FallbackConfig
    settings: dict
    stop: tuple[str, ...] = ()  # stop strings (the API's ``stop``): the reply ends before the first one


class Recorder(Protocol):
    """What ``record_reply`` needs from its caller's context (``ui.context.UIContext`` is one)."""

    store: Any  # storage.SessionStore
    flush_interval_s: float

    def forget_cancel(self, session_id: int | None, event: threading.Event) -> None: ...


class Out(Protocol):
    """Where the events go: a ``queue.Queue``, or anything with ``put``."""

    def put(self, item: object) -> None: ...


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


def record_reply(ctx: Recorder, request: GenerationRequest, engine, cancel: threading.Event, out: Out) -> None:
    """Runs on the engine worker: encode, check, generate, save; every event also goes to ``out``
    as ``("event", event)``, after ``("message", id)``; a refusal before the start is
    ``("refused", why)``, a failure while saving ``("error", why)``, and ``DONE`` comes last.
    Errors never vanish: they are saved on the reply (when there is one) and sent to ``out``.
    The cancel flag is forgotten before ``DONE`` is sent, so the caller's next request finds no
    reply pending."""
    try:
        events = _start_events(engine, request, cancel, out)
        if events is not None:
            _save_events(ctx, request, engine, events, out)
    finally:
        ctx.forget_cancel(request.session_id, cancel)
        out.put(DONE)


def _start_events(engine, request: GenerationRequest, cancel: threading.Event, out: Out):
    """The engine's event iterator for this request, or None after telling ``out`` why not."""
    if engine is None:
        out.put(("refused", "no model is loaded (see the model status above the settings)"))
    elif cancel.is_set():
        out.put(("refused", "stopped before generation started (your message is kept: Regenerate answers it)"))
    else:
        try:
            ids = encode_chat(engine, request.prompt, request.raw, chat_options(request.settings))
            events = engine.generate(ids, request.sampling, request.fallback, cancel)  # checks the request now
            events = with_stops(events, request.stop, cancel) if request.stop else events
            return reasoning_events(engine, ids, request.raw, events)  # the answer apart from any reasoning
        except (DFlashError, ValueError) as exc:
            out.put(("refused", str(exc)))
        except Exception as exc:  # noqa: BLE001 - shown to the user, not swallowed
            out.put(("refused", f"{type(exc).__name__}: {exc}"))
    return None


def _open_writer(ctx: Recorder, request: GenerationRequest, engine):
    if request.session_id is None:
        return UnsavedReply()
    caps = capabilities_of(engine)
    settings = dict(request.settings, engine=caps.kind)  # which engine made the reply
    if not caps.fallback:
        settings["fallback"] = False  # the engine has no per-request fallback: say what really ran
    message_id = ctx.store.start_reply(request.session_id, model=getattr(engine, "name", ""),
                                       settings=settings, kind=request.kind)
    return ctx.store.reply_writer(message_id, flush_interval_s=ctx.flush_interval_s)


def _save_events(ctx: Recorder, request: GenerationRequest, engine, events, out: Out) -> None:
    try:
        with _open_writer(ctx, request, engine) as writer:
            out.put(("message", writer.message_id))
            text = ""
            for event in events:
                if isinstance(event, Started):
                    text = event.first_answer_text
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
                out.put(("event", event))
            if not writer.finished:  # the stream ended without Finished/Failed
                writer.finish("interrupted")
    except Exception as exc:  # noqa: BLE001 - the writer saved the reply as 'error'; tell the caller
        out.put(("error", f"{type(exc).__name__}: {exc}"))
