"""A reasoning model's reply as the page and the session analytics read it: recorded through the
service like any reply, its reasoning stored apart from the content, rebuilt from the store the
same as it streamed, drawn in its own block above the answer with no code colours, and τ and
acceptance split between reasoning and answer (checked against the cycles, counted here)."""

from __future__ import annotations

import html as html_module
import queue
import re
import threading

import pytest

from engine.config import FallbackConfig, SamplingConfig
from engine.events import Cycle, Started
from service.items import Done, EventItem
from service.replies import GenerationRequest, ReplyService, record_reply
from service.settings import Settings
from storage import SessionStore
from tests.chat_twins import ScriptedChatEngine
from ui.chat import handlers as h
from ui.chat.reasoning_view import split_line
from ui.chat.render import assistant_markdown, render_token_view
from ui.chat.trace import ReplyTrace
from ui.teach.analytics import session_analytics, summary_csv

REPLY = ("<think>\nThe user wants a function. Let me plan it: add two numbers.\n</think>\n\n```python\n"
         "def add(a, b):\n    return a + b\n```\n<|im_end|>")


def recorded(thinking=None, reply=REPLY):
    store = SessionStore()
    engine = ScriptedChatEngine("qwen3", accept=(3, 0, 2, 1))
    engine.enqueue(reply)
    session = store.create_session("t", model=engine.name, settings={})
    store.add_message(session, "user", "Write add in Python.")
    settings = {} if thinking is None else {"thinking": thinking}
    request = GenerationRequest(session, [{"role": "user", "content": "Write add in Python."}], False, "chat",
                                SamplingConfig(max_new_tokens=200, block_size=4), FallbackConfig(enabled=False), settings)
    out: queue.Queue = queue.Queue()
    # the worker's own function, run on this thread: the service's engine host is not needed
    record_reply(ReplyService(store, engines=None, flush_interval_s=0.0), request, engine, threading.Event(), out)
    events = []
    while not isinstance(item := out.get(), Done):
        if isinstance(item, EventItem):
            events.append(item.event)
    return store, session, events, engine


def live_trace(events) -> ReplyTrace:
    trace = ReplyTrace()
    for event in events:
        if isinstance(event, Started):
            trace.start(event.first_text, event.block_size, event.prefill_ms, event.first_part)
        elif isinstance(event, Cycle):
            trace.add_cycle(event)
    return trace


def test_the_stored_reply_keeps_the_reasoning_apart_and_rebuilds_as_it_streamed():
    store, session, events, _ = recorded()
    message = store.get_messages(session)[-1]
    assert message["content"] == "```python\ndef add(a, b):\n    return a + b\n```\n"
    assert message["reasoning"].strip() == "The user wants a function. Let me plan it: add two numbers."
    assert message["reasoning_tokens"] == events[-1].reasoning_tokens > 0
    live = live_trace(events)
    stored = ReplyTrace.from_stored(message["content"], store.get_cycles(message["id"]), message)
    assert [(t.text, t.origin, t.part) for t in stored.tokens] == [(t.text, t.origin, t.part) for t in live.tokens]
    assert (stored.text, stored.reasoning) == (message["content"], message["reasoning"])


def test_the_token_view_draws_the_reasoning_in_its_own_block_without_code_colours():
    _, _, events, _ = recorded()
    html = render_token_view(live_trace(events))
    block = re.search(r'<details class="tv-reasoning".*?</details>', html, re.S).group(0)
    answer = html[html.index("</details>"):]
    shown = lambda h: html_module.unescape(re.sub(r"<[^>]+>", "", h.split("</summary>")[-1]))  # noqa: E731
    assert "Let me plan it" in shown(block) and "def" not in shown(block)
    assert 'data-origin="accepted"' in block and 'data-origin="rejected"' in block  # origins kept
    assert 'class="k"' not in block and 'class="k"' in answer  # only the answer's code is coloured
    chat = assistant_markdown(live_trace(events).text, "complete", live_trace(events))
    assert chat.index("chat-reasoning") < chat.index("```python") and "plan it" not in chat[chat.index("```"):]


def test_tau_and_acceptance_split_by_reasoning_and_answer():
    store, session, events, _ = recorded()
    cycles = [e for e in events if isinstance(e, Cycle)]
    by_part = {"reasoning": [], "answer": []}
    for c in cycles:
        by_part[c.parts()[0]].append(c)
    assert by_part["reasoning"] and by_part["answer"]
    expected = {part: (sum(c.tau for c in cs) / len(cs), sum(c.accepted for c in cs) / sum(c.block_size - 1 for c in cs))
                for part, cs in by_part.items()}
    line = split_line(live_trace(events))
    for part, (tau, rate) in expected.items():
        assert f"{part} {tau:.2f}" in line and f"{part} {rate:.0%}" in line
    analytics = session_analytics(store, session)
    for part, (tau, rate) in expected.items():
        figures = analytics.by_part[part]
        assert (round(figures.mean_tau, 6), round(figures.acceptance_rate, 6)) == (round(tau, 6), round(rate, 6))
    assert "cycles in reasoning" in summary_csv(analytics)


def test_thinking_off_leaves_no_reasoning_in_the_store_or_the_page():
    store, session, events, engine = recorded(thinking=False, reply="Here it is.<|im_end|>")
    assert engine.prompts[-1].endswith("<think>\n\n</think>\n\n")  # the template's "off"
    message = store.get_messages(session)[-1]
    assert message["settings"]["thinking"] is False
    assert (message["content"], message["reasoning"], message["reasoning_tokens"]) == ("Here it is.", "", 0)
    assert "tv-reasoning" not in render_token_view(live_trace(events)) and split_line(live_trace(events)) == ""


# ---------------------------------------------------------------------------- the page's thinking setting

PAGE_SETTINGS = Settings(block_size=4, temperature=0.0, top_p=1.0, max_new_tokens=200, fallback=False,
                         show_rejected=False)


@pytest.fixture
def qwen_page():
    """The page's context on a Qwen3-family engine with its published template (thinking switchable)."""
    from tests.fake_engine import fake_studio

    engine = ScriptedChatEngine("qwen3")
    ctx = fake_studio(engine, ui=False)
    ctx.engines.start().result(timeout=10)
    yield ctx, engine
    ctx.engines.shutdown()
    ctx.store.close()


def sent_and_answered(ctx, text, settings, session_id=None) -> int:
    view = h.submit_prompt(ctx, session_id, text, settings)
    list(h.respond(ctx, view["reply_request"]))
    return view["session"]


def test_a_session_that_never_chose_thinks_by_the_family_default_and_says_so_on_the_reply(qwen_page):
    ctx, engine = qwen_page
    assert PAGE_SETTINGS.thinking is None and "thinking" not in PAGE_SETTINGS.as_dict()
    engine.enqueue(REPLY)
    session = sent_and_answered(ctx, "Write add in Python.", PAGE_SETTINGS)
    assert engine.prompts[-1].endswith("<|im_start|>assistant\n")  # Qwen3's default: thinking on
    reply = ctx.store.get_messages(session)[-1]
    assert reply["settings"]["thinking"] is True and reply["reasoning"]
    assert "thinking" not in ctx.store.get_session(session)["settings"]  # the session chose nothing


def test_thinking_switched_off_goes_into_the_settings_state_the_session_and_the_next_reply(qwen_page):
    ctx, engine = qwen_page
    engine.enqueue(REPLY)
    session = sent_and_answered(ctx, "Write add in Python.", PAGE_SETTINGS)
    state = h.change_thinking(ctx, session, False, PAGE_SETTINGS)["settings"]
    assert state.thinking is False and state.keys() == PAGE_SETTINGS.keys()
    assert ctx.store.get_session(session)["settings"]["thinking"] is False
    # a later change of another control keeps the choice, in the State and with the session
    state = h.change_settings(ctx, session, 4, 0.0, 1.0, 150, False, False, state)["settings"]
    assert (state.thinking, state.max_new_tokens) == (False, 150)
    assert ctx.store.get_session(session)["settings"]["thinking"] is False
    assert h.select_session(ctx, session)["settings"].thinking is False  # shown again with the session
    engine.enqueue("Here it is.<|im_end|>")
    sent_and_answered(ctx, "Again, without thinking.", state, session)
    assert engine.prompts[-1].endswith("<think>\n\n</think>\n\n")  # the template's "off"
    reply = ctx.store.get_messages(session)[-1]
    assert (reply["settings"]["thinking"], reply["reasoning"]) == (False, "")


def test_saved_defaults_never_carry_a_sessions_thinking(qwen_page):
    ctx, _ = qwen_page
    h.save_defaults(ctx, PAGE_SETTINGS.with_thinking(False))
    assert h.default_settings(ctx).thinking is None
    assert h.default_settings(ctx).as_dict() == PAGE_SETTINGS.as_dict()
