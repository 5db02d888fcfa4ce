"""One API request on the engine: stored (or not), handed to the reply service, which queues it
on the ONE engine worker behind what the page and other clients asked for; its items are handed
to the event loop as they come.

The page runs its replies through the same service, so an API reply is recorded exactly like a
chat reply (text, every cycle, stats; flushed at least once a second) and a reply cut short is
kept as 'interrupted'. Cancelling (client gone, or Stop pressed in the page on that session) ends
the generation at its next cycle boundary.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

import anyio

from service.items import Done, ReplyItem
from service.replies import GenerationRequest, ReplyRun, ReplyService

from .api_requests import ApiRequest
from .api_sessions import reply_settings, store_request

DISCONNECT_POLL_S = 0.25


class LoopOut:
    """The reply service's output queue, delivered to an asyncio queue on the server's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item: ReplyItem) -> None:
        try:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            pass  # the server's loop has closed (shutdown): no client is left to tell


@dataclass
class Run:
    out: LoopOut
    reply: ReplyRun
    _last_poll: float = field(default_factory=time.monotonic)

    @property
    def cancel(self):
        return self.reply.cancel

    async def next(self, http_request=None) -> ReplyItem | None:
        """The next item from the worker; None when the client went away (the run is cancelled).
        Whether the client is still there is asked every DISCONNECT_POLL_S, busy or not."""
        while True:
            now = time.monotonic()
            if http_request is not None and now - self._last_poll >= DISCONNECT_POLL_S:
                self._last_poll = now
                if await http_request.is_disconnected():
                    self.cancel.set()
                    return None
            try:
                return await asyncio.wait_for(self.out.queue.get(), DISCONNECT_POLL_S)
            except (asyncio.TimeoutError, TimeoutError):
                continue

    async def items(self, http_request=None) -> AsyncIterator[ReplyItem]:
        """Items until the worker is done (or the client has gone)."""
        while True:
            item = await self.next(http_request)
            if item is None or isinstance(item, Done):
                return
            yield item


def with_seed(request: ApiRequest) -> ApiRequest:
    """A sampled reply gets a seed when the client gave none, stored so that it can be replayed."""
    if request.sampling.temperature > 0 and request.sampling.seed is None:
        return replace(request, sampling=replace(request.sampling, seed=secrets.randbelow(2**31)))
    return request


async def start_run(replies: ReplyService, request: ApiRequest, endpoint: str, store: bool,
                    model: str | None = None) -> Run:
    """Store the request (unless ``store`` is off) and queue its generation on ``model`` (a menu
    key; None: the loaded one), which the worker loads first when another one is loaded."""
    model = model or replies.engines.current_key
    engine = replies.engines.engine  # (another model's draft may have another block size: the page's slider only)
    block = request.sampling.block_size or (engine.block_size if engine is not None else 1)
    request = with_seed(request)
    settings = reply_settings(request, model, block, endpoint)
    session_id = None
    if store:
        session_id = await anyio.to_thread.run_sync(store_request, replies.store, request, settings)
        replies.mark_request(session_id)
    generation = GenerationRequest(session_id, request.prompt, request.raw, request.kind, request.sampling,
                                   request.fallback, settings, request.stop)
    out = LoopOut(asyncio.get_running_loop())
    return Run(out, replies.start(generation, out))


def finish_run(replies: ReplyService, run: Run) -> None:
    """The client is done with the run: stop it if it still runs, forget its cancel flag."""
    replies.release(run.reply)
