"""The reply service (``service.replies``) on a FakeEngine: the typed items its worker puts on the
queue, in order, for a reply that is stored, one that is refused and one the worker never runs."""

from __future__ import annotations

import queue

import pytest

from engine.config import FallbackConfig, SamplingConfig
from engine.events import Cycle, Finished, Started
from service.items import Done, EventItem, Refused, ReplyError, Saved
from service.replies import GenerationRequest
from tests.fake_engine import FakeReply


def items_of(replies, request, timeout: float = 10.0) -> list:
    out: queue.Queue = queue.Queue()
    replies.start(request, out)
    items = [out.get(timeout=timeout)]
    while not isinstance(items[-1], Done):
        items.append(out.get(timeout=timeout))
    return items


def chat_request(session_id, model=None, max_new_tokens=256) -> GenerationRequest:
    return GenerationRequest(session_id, [{"role": "user", "content": "write add()"}], False, "chat",
                             SamplingConfig(max_new_tokens=max_new_tokens, block_size=8), FallbackConfig(),
                             {"model": model} if model else {})


def test_a_stored_reply_is_saved_then_each_event_then_done(ctx, engine):
    engine.enqueue(FakeReply("def add(a, b):\n    return a + b\n", accept=(2, 5)))
    session_id = ctx.store.create_session("t")
    ctx.store.add_message(session_id, "user", "write add()")
    items = items_of(ctx.replies, chat_request(session_id))
    assert isinstance(items[0], Saved) and isinstance(items[-1], Done)
    events = [item.event for item in items[1:-1]]
    assert all(isinstance(item, EventItem) for item in items[1:-1])
    assert isinstance(events[0], Started) and isinstance(events[-1], Finished)
    assert any(isinstance(event, Cycle) for event in events)
    stored = ctx.store.get_messages(session_id)[-1]
    assert stored["id"] == items[0].message_id and stored["content"] == events[-1].text
    assert not ctx.replies.reply_pending(session_id)  # forgotten before Done was sent


def test_a_reply_that_is_not_stored_has_no_message_id(ctx, engine):
    items = items_of(ctx.replies, chat_request(None))
    assert items[0] == Saved(None) and isinstance(items[-2].event, Finished)
    assert ctx.store.list_sessions() == []


def test_a_refused_request_says_why_and_stores_no_reply(ctx, engine):
    session_id = ctx.store.create_session("t")
    ctx.store.add_message(session_id, "user", "write add()")
    items = items_of(ctx.replies, chat_request(session_id, max_new_tokens=0))  # the engine refuses it
    assert [type(item) for item in items] == [Refused, Done] and "max_new_tokens" in items[0].reason
    assert [m["role"] for m in ctx.store.get_messages(session_id)] == ["user"]


def test_a_request_the_worker_never_runs_ends_with_the_reason(ctx):
    items = items_of(ctx.replies, chat_request(None, model="no-such-pair"))
    assert [type(item) for item in items] == [ReplyError, Done] and "no-such-pair" in items[0].error


def test_stop_reaches_a_queued_reply_of_its_session_only(ctx, engine):
    ctx.replies.mark_request(7)
    assert ctx.replies.stop(7) is False  # nothing runs yet; the Stop still applies to what is queued
    items = items_of(ctx.replies, chat_request(7))
    assert isinstance(items[0], Refused) and "stopped before generation started" in items[0].reason
    assert isinstance(items_of(ctx.replies, chat_request(None))[-2].event, Finished)  # another reply runs


@pytest.mark.parametrize("field, value", [("temperature", "hot"), ("top_p", float("nan")), ("block_size", None)])
def test_settings_from_the_controls_refuse_what_is_not_a_number(field, value):
    from service.settings import InvalidSettings, Settings

    controls = dict(block_size=8, temperature=0.0, top_p=1.0, max_new_tokens=256, fallback=True, show_rejected=False)
    assert Settings.from_controls(**controls).as_dict() == controls
    with pytest.raises(InvalidSettings, match=field.replace("_", "[ -]")):
        Settings.from_controls(**{**controls, field: value})
