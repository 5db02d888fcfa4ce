"""One reply as the page draws it: the reply service (``service.replies``) runs it on the engine
worker and records it in the store (the API runs its replies through the same service); here
``stream_reply`` only reads the service's typed items and yields ``ReplyTrace`` snapshots,
coalescing cycles that arrive faster than the page can draw them.

If the browser goes away mid-reply, the reply still finishes and is saved: the recording happens
on the worker thread, not in the Gradio handler.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass

from engine.events import Cycle, Failed, Finished, Started, event_to_dict
from engine.interface import capabilities_of
from service.items import Done, EventItem, Refused, ReplyError, ReplyItem, Saved
from service.replies import GenerationRequest

from ..context import UIContext
from .trace import ReplyTrace

__all__ = ["GenerationRequest", "PageReply", "ReplyUpdate", "stream_reply"]  # GenerationRequest: what handlers build


@dataclass(frozen=True)
class PageReply:
    """What a send (or Regenerate, or an edit) hands ``handlers.respond`` in a State: the checked
    request, and the chat as it stood once the message was stored, which the reply is drawn under."""

    request: GenerationRequest
    rows: list  # the Chatbot rows before the reply
    ids: list  # their message ids
    notice: str = ""  # the line atop the reply when the session's model changed


@dataclass
class ReplyUpdate:
    """A snapshot for the page: the trace so far and where the reply stands."""

    trace: ReplyTrace
    status: str  # "waiting" | "streaming" | "complete" | "interrupted" | "error" | "refused"
    message_id: int | None = None
    note: str = ""  # waiting: the model's load progress; error: the message
    cycles_added: int = 0
    final: bool = False


def stream_reply(ctx: UIContext, request: GenerationRequest) -> Iterator[ReplyUpdate]:
    """Hand the request to the reply service and yield snapshots until the reply ends. A page
    that stops reading (another session shown, the tab closed) leaves the reply running: it is
    saved, and Stop still reaches it until the worker is done with it."""
    out: queue.Queue = queue.Queue()
    ctx.replies.start(request, out)
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
                update.note = _waiting_note(ctx)
                yield update
            elif withheld:  # the engine stalls (a slow step, a server that hangs): show what came
                last_yield, withheld = time.monotonic(), False
                yield update
                update.cycles_added = 0
            continue
        if _apply_all(update, _drain(out, item)):
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


def _waiting_note(ctx: UIContext) -> str:
    status = ctx.engines.status()
    return (f"loading {status.model_key}: {status.message} ({status.fraction:.0%})"
            if status.state == "loading" else "waiting for the engine…")


def _drain(out: queue.Queue, first: ReplyItem) -> list[ReplyItem]:
    """``first`` and what is already queued after it: one page update for all of it."""
    items = [first]
    while not isinstance(items[-1], Done):
        try:
            items.append(out.get_nowait())
        except queue.Empty:
            break
    return items


def _apply_all(update: ReplyUpdate, items: list[ReplyItem]) -> bool:
    """Apply the items to the update; whether the reply is done."""
    for item in items:
        if isinstance(item, Done):
            return True
        _apply(update, item)
    return False


def _apply(update: ReplyUpdate, item: ReplyItem) -> None:
    trace = update.trace
    match item:
        case Saved(message_id):
            update.message_id = message_id
            update.status = "streaming"
        case Refused(reason):
            update.status, update.note = "refused", reason
        case ReplyError(error):
            update.status, update.note = "error", error
            trace.error = error
        case EventItem(Started() as event):
            trace.start(event.first_text, event.block_size, event.prefill_ms, event.first_part)
        case EventItem(Cycle() as event):
            trace.add_cycle(event)
            update.cycles_added += 1
        case EventItem(Finished() as event):
            trace.finished = event_to_dict(event)
            trace.cancelled = event.reason == "cancelled"
            update.status = "interrupted" if trace.cancelled else "complete"
        case EventItem(Failed() as event):
            trace.error = event.message
            update.status, update.note = ("interrupted" if event.interrupted else "error"), event.message
