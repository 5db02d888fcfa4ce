"""One reply as the page draws it: ``service.replies.record_reply`` runs it on the engine worker
and records it in the store (the API runs its replies through the same function); here
``stream_reply`` only reads its queue and yields ``ReplyTrace`` snapshots, coalescing cycles that
arrive faster than the page can draw them.

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
from service.replies import DONE, GenerationRequest, record_reply

from .context import UIContext
from .trace import ReplyTrace

__all__ = ["GenerationRequest", "ReplyUpdate", "stream_reply"]  # GenerationRequest: what handlers build


@dataclass
class ReplyUpdate:
    """A snapshot for the page: the trace so far and where the reply stands."""

    trace: ReplyTrace
    status: str  # "waiting" | "streaming" | "complete" | "interrupted" | "error"
    message_id: int | None = None
    note: str = ""  # waiting: the model's load progress; error: the message
    cycles_added: int = 0
    final: bool = False


def stream_reply(ctx: UIContext, request: GenerationRequest) -> Iterator[ReplyUpdate]:
    """Submit the request to the engine worker and yield snapshots until the reply ends. A page
    that stops reading (another session shown, the tab closed) leaves the reply running: it is
    saved, and Stop still reaches it until the worker is done with it."""
    cancel = ctx.new_cancel(request.session_id)
    out: queue.Queue = queue.Queue()
    try:
        job = ctx.engines.submit(lambda engine: record_reply(ctx, request, engine, cancel, out),
                                 model=request.settings.get("model"))  # the session's model, loaded first if need be
    except BaseException:
        ctx.forget_cancel(request.session_id, cancel)
        raise
    job.add_done_callback(lambda finished: _after_job(ctx, request, cancel, out, finished))
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


def _after_job(ctx: UIContext, request: GenerationRequest, cancel, out: queue.Queue, job) -> None:
    """Forget the cancel flag, also when the job never ran; a job that failed or was cancelled
    before ``record_reply`` ran (an unknown model, the worker shut down) never sent DONE, so the
    stream gets its reason and DONE here (extra items after a DONE already sent are never read)."""
    ctx.forget_cancel(request.session_id, cancel)
    failure = "the engine worker stopped before it ran this request" if job.cancelled() else job.exception()
    if failure is not None:
        out.put(("error", failure if isinstance(failure, str) else f"{type(failure).__name__}: {failure}"))
        out.put(DONE)


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
        trace.start(value.first_text, value.block_size, value.prefill_ms, value.first_part)
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
