"""One reply: run the engine on the engine worker, record every event in the store as it comes,
and hand the events to the page that asked for them.

The recording happens on the worker thread, not in the Gradio handler: if the browser goes away
mid-reply, the reply still finishes and is saved. The handler side (``stream_reply``) only reads
a queue and yields ``ReplyTrace`` snapshots, coalescing cycles that arrive faster than the page
can draw them.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from engine.config import FallbackConfig, SamplingConfig
from engine.errors import DFlashError
from engine.events import Cycle, Failed, Finished, Started, event_to_dict
from engine.stops import with_stops
from engine.interface import capabilities_of

from .context import UIContext
from .trace import ReplyTrace

DONE = object()


@dataclass
class ReplyUpdate:
    """A snapshot for the page: the trace so far and where the reply stands."""

    trace: ReplyTrace
    status: str  # "waiting" | "streaming" | "complete" | "interrupted" | "error"
    message_id: int | None = None
    note: str = ""  # waiting: the model's load progress; error: the message
    cycles_added: int = 0
    final: bool = False


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


def _start_events(engine, request: GenerationRequest, cancel: threading.Event, out: queue.Queue):
    """The engine's event iterator for this request, or None after telling ``out`` why not."""
    if engine is None:
        out.put(("refused", "no model is loaded (see the model status above the settings)"))
    elif cancel.is_set():
        out.put(("refused", "stopped before generation started (your message is kept: Regenerate answers it)"))
    else:
        try:
            ids = engine.encode(request.prompt, raw=request.raw)
            events = engine.generate(ids, request.sampling, request.fallback, cancel)  # checks the request now
            return with_stops(events, request.stop, cancel) if request.stop else events
        except (DFlashError, ValueError) as exc:
            out.put(("refused", str(exc)))
        except Exception as exc:  # noqa: BLE001 - shown to the user, not swallowed
            out.put(("refused", f"{type(exc).__name__}: {exc}"))
    return None


def _open_writer(ctx: UIContext, request: GenerationRequest, engine):
    if request.session_id is None:
        return UnsavedReply()
    caps = capabilities_of(engine)
    settings = dict(request.settings, engine=caps.kind)  # which engine made the reply
    if not caps.fallback:
        settings["fallback"] = False  # the engine has no per-request fallback: say what really ran
    message_id = ctx.store.start_reply(request.session_id, model=getattr(engine, "name", ""),
                                       settings=settings, kind=request.kind)
    return ctx.store.reply_writer(message_id, flush_interval_s=ctx.flush_interval_s)


def record_reply(ctx: UIContext, request: GenerationRequest, engine, cancel: threading.Event, out: queue.Queue) -> None:
    """Runs on the engine worker: encode, check, generate, save; every event also goes to ``out``.
    Errors never vanish: they are saved on the reply (when there is one) and sent to ``out``.
    The cancel flag is forgotten before the end is sent, so the page's next request finds no
    reply pending."""
    try:
        events = _start_events(engine, request, cancel, out)
        if events is not None:
            _save_events(ctx, request, engine, events, out)
    finally:
        ctx.forget_cancel(request.session_id, cancel)
        out.put(DONE)


def _save_events(ctx: UIContext, request: GenerationRequest, engine, events, out: queue.Queue) -> None:
    try:
        with _open_writer(ctx, request, engine) as writer:
            out.put(("message", writer.message_id))
            text = ""
            for event in events:
                if isinstance(event, Started):
                    text = event.first_text
                    writer.set_content(text)
                    writer.flush()
                elif isinstance(event, Cycle):
                    text += event.emitted_text
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
    except Exception as exc:  # noqa: BLE001 - the writer saved the reply as 'error'; tell the page
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def stream_reply(ctx: UIContext, request: GenerationRequest) -> Iterator[ReplyUpdate]:
    """Submit the request to the engine worker and yield snapshots until the reply ends. A page
    that stops reading (another session shown, the tab closed) leaves the reply running: it is
    saved, and Stop still reaches it until the worker is done with it."""
    cancel = ctx.new_cancel(request.session_id)
    out: queue.Queue = queue.Queue()
    try:
        job = ctx.engines.submit(lambda engine: record_reply(ctx, request, engine, cancel, out))
    except BaseException:
        ctx.forget_cancel(request.session_id, cancel)
        raise
    job.add_done_callback(lambda _: ctx.forget_cancel(request.session_id, cancel))  # also if it never ran
    engine = ctx.engines.engine
    trace = ReplyTrace.for_engine(capabilities_of(engine).kind if engine is not None else None)
    update = ReplyUpdate(trace, "waiting")
    last_yield = 0.0
    withheld = False  # tokens applied but not yet shown (they arrived within the yield interval)
    while True:
        try:
            item = out.get(timeout=0.25)
        except queue.Empty:
            if update.status == "waiting":
                status = ctx.engines.status()
                update.note = (f"loading {status.model_key}: {status.message} ({status.fraction:.0%})"
                               if status.state == "loading" else "waiting for the engine…")
                yield update
            elif withheld:  # the engine stalls (a slow step, a server that hangs): show what came
                last_yield, withheld = time.monotonic(), False
                yield update
                update.cycles_added = 0
            continue
        pending = [item]
        while item is not DONE:  # drain what is already there: one page update for all of it
            try:
                item = out.get_nowait()
            except queue.Empty:
                break
            pending.append(item)
        done = False
        for item in pending:
            if item is DONE:
                done = True
            else:
                _apply(update, item)
        if done:
            update.final = True
            if update.status in ("waiting", "streaming"):
                update.status = "interrupted"
            yield update
            return
        now = time.monotonic()
        if now - last_yield >= ctx.yield_interval_s or update.status not in ("waiting", "streaming"):
            last_yield, withheld = now, False
            yield update
            update.cycles_added = 0
        else:
            withheld = True


def _apply(update: ReplyUpdate, item: tuple) -> None:
    kind, value = item
    trace = update.trace
    if kind == "message":
        update.message_id = value
        update.status = "streaming"
    elif kind == "refused":
        update.status, update.note = "refused", value
    elif kind == "error":
        update.status, update.note = "error", value
        trace.error = value
    elif isinstance(value, Started):
        trace.start(value.first_text, value.block_size, value.prefill_ms)
    elif isinstance(value, Cycle):
        trace.add_cycle(value)
        update.cycles_added += 1
    elif isinstance(value, Finished):
        trace.finished = event_to_dict(value)
        trace.cancelled = value.reason == "cancelled"
        update.status = "interrupted" if trace.cancelled else "complete"
    elif isinstance(value, Failed):
        trace.error = value.message
        update.status, update.note = ("interrupted" if value.interrupted else "error"), value.message
