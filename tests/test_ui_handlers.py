"""UI handlers driven directly (no server, no browser) with the scriptable FakeEngine and an
in-memory store: what the page shows, and what the database holds at each step."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from types import SimpleNamespace

import gradio as gr
import pytest

from service.settings import Settings
from tests.fake_engine import FakeEngine, FakeReply, fake_studio
from ui.chat import handlers as h
from ui.context import MAX_PAGES_REMEMBERED

SETTINGS = Settings(block_size=8, temperature=0.0, top_p=1.0, max_new_tokens=256, fallback=True, show_rejected=True)


def send(ctx, text, session_id=None, settings=SETTINGS):
    out = h.submit_prompt(ctx, session_id, text, settings)
    return out["session"], out


def run(ctx, handed, **options):
    """``respond``'s updates for the reply a send, Regenerate or edit handed over (its view)."""
    return list(h.respond(ctx, handed["reply_request"], **options))


def reply_cycles(updates) -> int:
    """Cycles drawn in the last acceptance chart."""
    figures = [u["acceptance_chart"] for u in updates if "acceptance_chart" in u]
    return len(json.loads(figures[-1].plot)["data"][0]["x"])


def messages(ctx, session_id):
    return [(m["role"], m["status"], m["content"]) for m in ctx.store.get_messages(session_id)]


def test_the_user_message_is_committed_before_generation_and_the_reply_streams_into_the_store(ctx, engine):
    engine.enqueue(FakeReply("def add(a, b):\n    return a + b\n", accept=(2, 5, 0, 3)))
    session_id, sent = send(ctx, "write add()")
    assert messages(ctx, session_id) == [("user", "complete", "write add()")]  # stored, no reply yet
    assert sent["chat_input"] == "" and sent["chat"][-1] == {"role": "assistant", "content": "…"}  # pending bubble
    updates = run(ctx, sent)
    chat, ids, token_view = updates[-1]["chat"], updates[-1]["msg_ids"], updates[-1]["token_view"]
    assert messages(ctx, session_id)[-1] == ("assistant", "complete", "def add(a, b):\n    return a + b\n")
    reply = ctx.store.get_messages(session_id)[-1]
    assert reply["finish_reason"] == "stop" and reply["new_tokens"] > 0 and reply["mean_tau"] > 1
    assert len(ctx.store.get_cycles(reply["id"])) == reply_cycles(updates) > 0
    assert 'data-origin="accepted"' in token_view and 'data-origin="bonus"' in token_view
    assert "reply-footer" in chat[-1]["content"] and "mean τ" in chat[-1]["content"]
    assert ids == [m["id"] for m in ctx.store.get_messages(session_id)]
    assert engine.calls[0]["fallback"].enabled is True and engine.calls[0]["sampling"].block_size == 8


def test_replies_stream_once_per_cycle_when_cycles_are_slow(ctx, engine):
    engine.delay_s = 0.06
    engine.enqueue(FakeReply("a b c d e f g h i j", accept=(1,)))
    session_id, sent = send(ctx, "go")
    views = [u["token_view"] for u in run(ctx, sent) if "token_view" in u]
    counts = [v.count('class="tok"') for v in views]
    assert len(set(counts)) >= 4 and counts == sorted(counts)  # the view grows block by block


def test_tokens_that_arrive_just_before_the_engine_stalls_are_shown_during_the_stall(ctx, engine):
    """Cycles that arrive within one yield interval are coalesced; if the engine then stalls
    (a slow step, a vLLM server that hangs), they must still reach the page, not wait for the
    next event."""
    stall = threading.Event()
    generate = engine.generate

    def stalling(*args, **kwargs):
        for n, event in enumerate(generate(*args, **kwargs)):
            yield event
            if n == 2:  # Started and two cycles, then the engine hangs
                stall.wait(10)

    engine.generate = stalling
    engine.enqueue(FakeReply("a b c d e f g h", accept=(0,)))
    session_id, sent = send(ctx, "go")
    counts, shown_while_stalled = [], None
    for update in h.respond(ctx, sent["reply_request"]):
        if "token_view" in update:
            counts.append(update["token_view"].count('class="tok"'))
            if not stall.is_set() and counts[-1] >= 1 + 2 * 8:  # the first token and both cycles are on screen
                shown_while_stalled = counts[-1]
                stall.set()
    stall.set()
    assert shown_while_stalled == 1 + 2 * 8, counts  # the first token, then 2 cycles of 1 emitted + 7 rejected


def test_invalid_settings_are_refused_with_a_message_and_nothing_is_stored(ctx):
    with pytest.raises(gr.Error, match="temperature must be between 0 and 5"):
        h.submit_prompt(ctx, None, "hello", replace(SETTINGS, temperature=9.0))
    with pytest.raises(gr.Error, match="block_size must be between 1 and 16"):
        h.submit_prompt(ctx, None, "hello", replace(SETTINGS, block_size=99))
    with pytest.raises(gr.Error, match="The prompt is empty"):
        h.submit_prompt(ctx, None, "   ", SETTINGS)
    with pytest.raises(gr.Error, match="temperature must be a number"):  # what a Gradio API caller may send
        h.change_settings(ctx, None, 8, "hot", 1.0, 256, True, True)
    assert ctx.store.list_sessions() == []


def test_the_send_stores_the_message_its_check_accepted_not_what_the_box_holds_by_then(ctx):
    """The page checks a message, then sends it as a second event: text typed in between must
    neither replace the checked message nor be cleared away (nothing a user typed is lost)."""
    accepted = h.check_send(ctx, None, "write add()", SETTINGS)
    out = h.submit_prompt(ctx, None, "a newer draft", SETTINGS, accepted)
    assert messages(ctx, out["session"]) == [("user", "complete", "write add()")]
    assert "chat_input" not in out  # the box keeps the newer draft
    # a box emptied in between (which the check would refuse) sends the checked message
    accepted = h.check_send(ctx, out["session"], "and sub()", SETTINGS)
    out = h.submit_prompt(ctx, out["session"], "   ", Settings(4, 0.7, 0.9, 64, False, True), accepted)
    stored = ctx.store.get_messages(out["session"])[-1]
    assert (stored["content"], stored["settings"]["block_size"], stored["settings"]["temperature"]) == ("and sub()", 8, 0.0)
    accepted = h.check_send(ctx, out["session"], "same text", SETTINGS)
    assert h.submit_prompt(ctx, out["session"], "same text", SETTINGS, accepted)["chat_input"] == ""
    with pytest.raises(gr.Error, match="The prompt is empty"):
        h.check_send(ctx, None, "  ", SETTINGS)
    code = h.check_completion(ctx, None, "def f(x):\n", SETTINGS)
    session_id = h.submit_completion(ctx, None, "", SETTINGS, code)["session"]
    assert ctx.store.get_messages(session_id)[-1]["content"] == "def f(x):\n"


def test_an_over_long_prompt_is_refused_before_it_is_stored():
    ctx = fake_studio(FakeEngine(context_window=16), ui=False)
    ctx.engines.start().result(timeout=10)
    with pytest.raises(gr.Error, match="context window is 16 tokens"):
        h.submit_prompt(ctx, None, "word " * 40, SETTINGS)
    assert ctx.store.list_sessions() == []


def test_stop_ends_within_one_cycle_and_keeps_the_partial_reply(ctx, engine):
    engine.delay_s = 0.05
    engine.enqueue(FakeReply(" ".join(["tok"] * 400), accept=(1,)))
    session_id, sent = send(ctx, "long please")
    stream = h.respond(ctx, sent["reply_request"])
    updates = []
    for update in stream:
        updates.append(update)
        if len(updates) == 3:
            h.stop(ctx, session_id)
            stopped_at = time.monotonic()
    assert time.monotonic() - stopped_at < 1.0
    reply = ctx.store.get_messages(session_id)[-1]
    assert reply["status"] == "interrupted" and reply["finish_reason"] == "cancelled"
    assert 0 < len(reply["content"]) < len(" ".join(["tok"] * 400))
    assert "stopped" in updates[-1]["chat"][-1]["content"]


def test_an_engine_error_ends_the_reply_visibly_and_keeps_the_text(ctx, engine):
    engine.enqueue(FakeReply("a b c d e f g h i j k l m n", accept=(1,), fail_after=2, failure="CUDA fell over"))
    session_id, sent = send(ctx, "x")
    chat = run(ctx, sent)[-1]["chat"]
    reply = ctx.store.get_messages(session_id)[-1]
    assert reply["status"] == "error" and reply["error"] == "CUDA fell over" and reply["content"].startswith("a b")
    assert "⚠ error: CUDA fell over" in chat[-1]["content"]
    assert "⚠ error: CUDA fell over" in h.chat_history(ctx, session_id)[0][-1]["content"]  # after reload too


def test_regenerate_replaces_the_last_reply(ctx, engine):
    engine.enqueue("first answer", "second answer")
    session_id, sent = send(ctx, "q")
    run(ctx, sent)
    sent = h.regenerate(ctx, session_id, SETTINGS)
    assert sent["chat"][-1]["content"] == "…" and messages(ctx, session_id) == [("user", "complete", "q")]
    run(ctx, sent)
    assert [m[2] for m in messages(ctx, session_id)] == ["q", "second answer"]


def test_edit_and_resend_the_last_user_message(ctx, engine):
    engine.enqueue("one", "two")
    session_id, sent = send(ctx, "first")
    run(ctx, sent)
    ids = [m["id"] for m in ctx.store.get_messages(session_id)]
    evt = SimpleNamespace(index=0, value="first &lt;edited&gt;", previous_value="first")
    sent = h.edit_message(ctx, session_id, ids, evt, SETTINGS)
    run(ctx, sent)
    assert [m[2] for m in messages(ctx, session_id)] == ["first <edited>", "two"]
    assert engine.calls[-1]["prompt_ids"] == engine.encode([{"role": "user", "content": "first <edited>"}])


def test_editing_an_earlier_message_continues_in_a_copy_and_keeps_the_original(ctx, engine):
    engine.enqueue("A1", "A2", "A1 again")
    original, sent = send(ctx, "Q1")
    run(ctx, sent)
    _, sent = send(ctx, "Q2", original)
    run(ctx, sent)
    before = messages(ctx, original)
    ids = [m["id"] for m in ctx.store.get_messages(original)]
    view = sent = h.edit_message(ctx, original, ids, SimpleNamespace(index=0, value="Q1 &amp; more"), SETTINGS)
    copy = view["session"]
    assert copy != original and view["remembered"] == copy  # the page switches to the copy
    assert view["chat"][-1] == {"role": "assistant", "content": "…"} and len(view["msg_ids"]) == 1
    assert messages(ctx, original) == before  # nothing typed is lost
    assert messages(ctx, copy) == [("user", "complete", "Q1 & more")]
    assert ctx.store.get_session(copy)["title"].endswith("(edited)")
    run(ctx, sent)
    assert engine.calls[-1]["prompt_ids"] == engine.encode([{"role": "user", "content": "Q1 & more"}])
    assert [m[2] for m in messages(ctx, copy)] == ["Q1 & more", "A1 again"]


def test_editing_keeps_the_replies_and_cycles_before_the_edited_message(ctx, engine):
    engine.enqueue(FakeReply("def f():\n    pass\n", accept=(3, 1, 2)), "A2", "A3")
    original, sent = send(ctx, "Q1")
    run(ctx, sent)
    _, sent = send(ctx, "Q2", original)
    run(ctx, sent)
    _, sent = send(ctx, "Q3", original)
    run(ctx, sent)
    ids = [m["id"] for m in ctx.store.get_messages(original)]
    copy = h.edit_message(ctx, original, ids, SimpleNamespace(index=2, value="Q2 edited"), SETTINGS)["session"]
    kept = ctx.store.get_messages(copy)
    assert [(m["role"], m["content"]) for m in kept] == [("user", "Q1"), ("assistant", "def f():\n    pass\n"),
                                                         ("user", "Q2 edited")]
    first_reply = ctx.store.get_messages(original)[1]["id"]
    strip = lambda cycles: [{k: v for k, v in c.items() if k not in ("id", "message_id")} for c in cycles]
    assert strip(ctx.store.get_cycles(kept[1]["id"])) == strip(ctx.store.get_cycles(first_reply))


def test_an_edited_completion_keeps_only_the_code(ctx, engine):
    sent = h.submit_completion(ctx, None, "def f(x):\n", SETTINGS)
    session_id = sent["session"]
    run(ctx, sent)
    ids = [m["id"] for m in ctx.store.get_messages(session_id)]
    shown = h.chat_history(ctx, session_id)[0][0]["content"]
    edited = shown.replace("def f(x):", "def g(y):")
    h.edit_message(ctx, session_id, ids, SimpleNamespace(index=0, value=edited), SETTINGS)
    assert ctx.store.get_messages(session_id)[0]["content"] == "def g(y):\n"


def test_assistant_messages_and_stale_rows_cannot_be_edited(ctx, engine):
    session_id, sent = send(ctx, "a")
    run(ctx, sent)
    ids = [m["id"] for m in ctx.store.get_messages(session_id)]
    with pytest.raises(gr.Error, match="Only your own messages"):
        h.edit_message(ctx, session_id, ids, SimpleNamespace(index=1, value="changed"), SETTINGS)
    with pytest.raises(gr.Error, match="not in this session"):
        h.edit_message(ctx, session_id, ids, SimpleNamespace(index=5, value="changed"), SETTINGS)
    with pytest.raises(gr.Error, match="empty"):
        h.edit_message(ctx, session_id, ids, SimpleNamespace(index=0, value="  "), SETTINGS)


def test_the_conversation_so_far_is_the_prompt(ctx, engine):
    engine.enqueue("A1", "A2")
    session_id, sent = send(ctx, "Q1")
    run(ctx, sent)
    _, sent = send(ctx, "Q2", session_id)
    run(ctx, sent)
    expected = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    assert engine.calls[-1]["prompt_ids"] == engine.encode(expected)


def test_complete_mode_continues_the_code_as_raw_text_into_the_editor(ctx, engine):
    engine.enqueue(FakeReply("\n    return n > 1\n", accept=(3,)))
    sent = h.submit_completion(ctx, None, "def is_prime(n):\n", SETTINGS)
    session_id = sent["session"]
    last = list(h.respond(ctx, sent["reply_request"], to_editor=True))[-1]  # as the Complete button runs it
    assert last["code"] == "def is_prime(n):\n    return n > 1\n"  # the code editor
    # the line break after "):" is left to the model (token healing, engine.prompts.heal_code_prompt)
    assert engine.calls[-1]["prompt_ids"] == engine.encode("def is_prime(n):", raw=True)
    assert ctx.store.get_messages(session_id)[0]["content"] == "def is_prime(n):\n"  # stored as typed
    assert [m["kind"] for m in ctx.store.get_messages(session_id)] == ["complete", "complete"]
    assert '<span class="k">return</span>' in last["token_view"]  # whole text lexed as code


def test_one_engine_worker_runs_one_generation_at_a_time(ctx, engine):
    engine.delay_s = 0.02
    sent = [send(ctx, f"q{i}") for i in range(3)]
    sessions = [session_id for session_id, _ in sent]
    threads = [threading.Thread(target=run, args=(ctx, view)) for _, view in sent]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert engine.max_concurrent == 1
    assert all(messages(ctx, sid)[-1][1] == "complete" for sid in sessions)


def test_a_reply_is_finished_and_saved_even_if_the_page_goes_away(ctx, engine):
    engine.delay_s = 0.02
    engine.enqueue(FakeReply("a b c d e f g h i j k l m n o p", accept=(1,)))
    session_id, sent = send(ctx, "x")
    stream = h.respond(ctx, sent["reply_request"])
    next(stream)
    stream.close()  # the browser tab closed mid-reply
    deadline = time.monotonic() + 10
    while ctx.store.get_messages(session_id)[-1]["status"] != "complete" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert messages(ctx, session_id)[-1] == ("assistant", "complete", "a b c d e f g h i j k l m n o p")


def test_the_page_waits_for_the_model_with_its_load_progress():
    engine = FakeEngine()
    ctx = fake_studio(engine, load_delay_s=1.0, ui=False)
    ctx.engines.start()
    session_id, sent = send(ctx, "hello")  # the page is usable while the model loads
    updates = run(ctx, sent)
    waiting = [u["chat"][-1]["content"] for u in updates if u["chat"][-1]["content"].startswith("⏳")]
    assert waiting and "loading fake-coder" in waiting[0]
    assert messages(ctx, session_id)[-1][1] == "complete"


def test_sessions_list_switch_rename_search_delete_and_export(ctx, engine):
    engine.enqueue("reply one", "reply two")
    first, sent = send(ctx, "first topic")
    run(ctx, sent)
    second, sent = send(ctx, "second <topic>")
    run(ctx, sent)
    assert [title for title, _ in h.session_choices(ctx)] == ["second <topic>", "first topic"]  # most recent first

    view = h.on_load(ctx, None)  # a fresh page shows the latest session
    assert view["session"] == second and view["chat"][0]["content"] == "second &lt;topic&gt;"
    for junk in (10**30, float("inf"), float("nan"), "abc", -1):  # the remembered id is client state
        assert h.on_load(ctx, junk)["session"] == second  # found by the long fuzz run (10**30 overflowed)
    view = h.on_load(ctx, first)  # ... or the one this browser showed last
    assert view["session"] == first and [r["role"] for r in view["chat"]] == ["user", "assistant"]
    assert 'data-origin="bonus"' in view["token_view"]  # the last reply's tokens

    h.rename(ctx, first, "Renamed")
    assert ctx.store.get_session(first)["title"] == "Renamed"
    assert [c for c in h.search(ctx, "reply two", None).choices] == [("second <topic> · «reply» «two»", second)]
    assert [c for c in h.search(ctx, "SECOND", None).choices] == [("«second» <topic>", second)]  # a title match

    exported = h.export(ctx, first).value
    path = exported["path"] if isinstance(exported, dict) else exported
    document = json.loads(open(path, encoding="utf-8").read())
    assert document["sessions"][0]["title"] == "Renamed" and document["sessions"][0]["messages"][1]["cycles"]

    out = h.confirm_delete(ctx, second)
    assert [s["id"] for s in ctx.store.list_sessions()] == [first]
    assert out["session"] == first and out["confirm_row"].visible is False  # the page moves to the remaining one


def test_new_session_shows_a_selected_entry_until_its_first_message(ctx, engine):
    engine.enqueue("reply one", "reply two")
    first, sent = send(ctx, "first topic")
    run(ctx, sent)
    listing = h.new_session(ctx)["sessions"]
    assert listing.choices[0] == h.NEW_SESSION_ENTRY and listing.value == h.NEW_SESSION_ENTRY[1]
    assert ("first topic", first) in listing.choices  # nothing is stored for the empty session
    assert ctx.store.count_sessions() == 1
    assert h.select_session(ctx, h.NEW_SESSION_ENTRY[1])["session"] is None  # choosing the entry is a new page
    assert h.search(ctx, "first", None).choices == [("«first» topic", first)]  # a search lists sessions only
    second, sent = send(ctx, "second topic")  # the first message creates it, titled after itself
    run(ctx, sent)
    listing = h.select_session(ctx, second)["sessions"]
    assert listing.value == second and h.NEW_SESSION_ENTRY not in listing.choices


def test_delete_all_asks_with_the_count_then_empties_the_page(ctx, engine):
    with pytest.raises(gr.Error, match="no sessions"):
        h.ask_delete_all(ctx)
    engine.enqueue("r1", "r2")
    for text in ("one", "two"):
        session_id, sent = send(ctx, text)
        run(ctx, sent)
    question = h.ask_delete_all(ctx)["confirm_all_text"]
    assert "all 2 sessions" in question and "cannot be recovered" in question
    out = h.confirm_delete_all(ctx)
    assert ctx.store.count_sessions() == 0
    assert out["session"] is None and out["chat"] == [] and out["msg_ids"] == []  # no session, empty chat


def test_settings_are_saved_with_the_session_and_restored(ctx, engine):
    session_id, sent = send(ctx, "x")
    run(ctx, sent)
    assert h.change_settings(ctx, session_id, 4, 0.7, 0.9, 128, False, False)["settings"] == Settings(4, 0.7, 0.9, 128,
                                                                                                     False, False)
    saved = ctx.store.get_session(session_id)["settings"]
    assert {k: saved[k] for k in h.SETTING_KEYS} == {"block_size": 4, "temperature": 0.7, "top_p": 0.9,
                                                    "max_new_tokens": 128, "fallback": False, "show_rejected": False}
    view = h.select_session(ctx, session_id)
    assert {k: view[k] for k in h.SETTING_KEYS} == {"block_size": 4, "temperature": 0.7, "top_p": 0.9,
                                                   "max_new_tokens": 128, "fallback": False, "show_rejected": False}
    reply = ctx.store.get_messages(session_id)[-1]
    assert reply["settings"]["block_size"] == 8  # the settings each reply was generated with


def test_picking_an_incompatible_pair_is_refused_with_the_reason(ctx, engine):
    out = h.pick_model(ctx, "incompatible-pair")
    picker, status = out["model"], out["model_status"]
    assert ctx.engines.current_key == engine.name and ctx.engines.engine is engine
    assert "hidden size 64" in status and "fake-coder" in status
    assert picker.value == engine.name


def test_a_refused_pick_is_tried_again_when_picked_again(ctx, engine):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the same warning from the same line, twice
        h.pick_model(ctx, "incompatible-pair")
        h.pick_model(ctx, "incompatible-pair")
    refusals = [w for w in caught if "Cannot use incompatible-pair" in str(w.message)]
    assert len(refusals) == 2 and ctx.engines.engine is engine


def test_a_fresh_page_opens_the_latest_page_session_never_one_an_editor_made(ctx, engine):
    api_settings = {"source": "api", "endpoint": "completions", "temperature": 1.2, "max_new_tokens": 64}
    ctx.store.create_session("API · completions", settings=api_settings)
    view = h.on_load(ctx, None)
    assert view["session"] is None and view["max_new_tokens"] != 64  # only API sessions: a new one, on the defaults
    engine.enqueue("a reply")
    page_session, sent = send(ctx, "typed on the page")
    run(ctx, sent)
    api_session = ctx.store.create_session("API · later", settings=api_settings)  # the newest now
    assert h.on_load(ctx, None)["session"] == page_session
    assert h.on_load(ctx, api_session)["session"] == api_session  # the browser showed it last: it comes back


def test_the_tab_select_gradio_fires_while_the_page_loads_changes_nothing(ctx, engine):
    engine.enqueue("a reply")
    session_id, sent = send(ctx, "a question")
    run(ctx, sent)
    assert h.tab_figures(ctx, None, None, mode="chat") == {}  # before on_load: no page id yet
    shown = h.tab_figures(ctx, session_id, "a-page-id", mode="chat")
    assert '<span class="tok"' in shown["token_view"]
    assert '<span class="tok"' not in h.tab_figures(ctx, session_id, "a-page-id", mode="complete")["token_view"]


def test_the_live_refresh_waits_for_the_page_to_load(ctx, engine):
    engine.enqueue("a reply")
    session_id, sent = send(ctx, "a question")
    run(ctx, sent)
    assert h.live_refresh(ctx, None, "", None, None, None) == {}  # a tick before on_load draws nothing
    assert "sessions" in h.live_refresh(ctx, session_id, "", None, None, "a-page-id")


def test_a_live_tick_that_lands_after_new_session_is_redrawn_by_the_next(ctx, engine):
    """A tick reads the page's session when it fires; one fired just before "+ New session" lands
    after it and draws the list for the session left behind (no New entry, the old one ticked).
    The next tick, given the page's real session, draws the list again."""
    engine.enqueue("a reply")
    session_id, sent = send(ctx, "a question")
    run(ctx, sent)
    stale = h.live_refresh(ctx, session_id, "", None, None, "a-page-id")  # fired on the old session
    assert [v for _, v in stale["sessions"].choices] == [session_id]
    healed = h.live_refresh(ctx, None, "", stale["live_seen"], None, "a-page-id")  # the page is a new session
    assert healed["sessions"].choices[0] == h.NEW_SESSION_ENTRY and healed["sessions"].value == h.NEW_SESSION_ENTRY[1]
    assert set(h.live_refresh(ctx, None, "", healed["live_seen"], None, "a-page-id")) == {"live_seen"}


def test_a_live_tick_fired_before_the_first_send_lands_on_the_session_the_send_made(ctx, engine):
    """A tick fired on an empty page (no session yet) that runs after the page's first send
    created its session draws the list for that session, not a "New session" entry the page no
    longer has; once the page moves to a new session, an empty page's tick draws the entry again."""
    engine.enqueue("a reply")
    sent = h.submit_prompt(ctx, None, "a question", SETTINGS, page="a-page-id")
    run(ctx, sent, page="a-page-id")
    late = h.live_refresh(ctx, None, "", None, None, "a-page-id")  # its session was read before the send
    assert late["sessions"].value == sent["session"]
    assert h.NEW_SESSION_ENTRY not in late["sessions"].choices
    other_page = h.live_refresh(ctx, None, "", None, None, "another-page-id")
    assert other_page["sessions"].value == h.NEW_SESSION_ENTRY[1]  # another page's empty view is its own
    h.new_session(ctx, "a-page-id")
    after_new = h.live_refresh(ctx, None, "", late["live_seen"], None, "a-page-id")
    assert after_new["sessions"].value == h.NEW_SESSION_ENTRY[1]


def test_the_pages_remembered_for_late_ticks_are_bounded(ctx):
    for n in range(MAX_PAGES_REMEMBERED + 5):
        ctx.sent_to_new_session(f"page-{n}", n)
    assert ctx.shown_session("page-0", None) is None  # the oldest went
    assert ctx.shown_session(f"page-{MAX_PAGES_REMEMBERED + 4}", None) == MAX_PAGES_REMEMBERED + 4
    assert ctx.shown_session(f"page-{MAX_PAGES_REMEMBERED + 4}", 7) == 7  # what the page says comes first


def test_the_live_tick_writes_only_states_and_hands_what_changed_to_its_redraw(ctx, engine):
    """The tick never leaves the chat or a figure "unchanged" (Gradio would keep a stale copy of
    it per tick, see ``live_check``): it changes States, and the redraw gives values only."""
    engine.enqueue("a reply")
    session_id, sent = send(ctx, "a question")
    run(ctx, sent)
    assert h.live_check(ctx, None, "", None, None, None) == {}  # before on_load: nothing at all
    first = h.live_check(ctx, session_id, "", None, None, "a-page-id")
    assert set(first) == set(h.LIVE_CHECKED)
    assert set(h.live_redraw_apply(first["live_redraw"])) == {"sessions"}  # the list, drawn once
    quiet = h.live_check(ctx, session_id, "", first["live_seen"], None, "a-page-id")
    assert set(quiet) == {"live_seen"}  # nothing new: the redraw State stays as it was
    ctx.store.create_session("another")
    again = h.live_check(ctx, session_id, "", quiet["live_seen"], None, "a-page-id")
    assert again["live_redraw"] != first["live_redraw"]  # a new redraw, so its change event fires
    assert "another" in str(h.live_redraw_apply(again["live_redraw"])["sessions"].choices)
    assert set(h.live_redraw_apply(again["live_redraw"])) <= set(h.LIVE_REDRAWN)
    assert h.live_redraw_apply(None) == {}


def test_show_reply_renders_a_past_reply(ctx, engine):
    engine.enqueue("old reply", "new reply")
    session_id, sent = send(ctx, "a")
    run(ctx, sent)
    _, sent = send(ctx, "b", session_id)
    run(ctx, sent)
    ids = [m["id"] for m in ctx.store.get_messages(session_id)]
    token_view = h.show_reply(ctx, ids, SimpleNamespace(index=1))["token_view"]
    assert "old" in token_view and "new" not in token_view


def test_a_prompt_the_loaded_model_cannot_take_is_refused_with_a_message_and_kept():
    ctx = fake_studio(FakeEngine(context_window=16), load_delay_s=0.5, ui=False)
    ctx.engines.start()  # still loading: the length check waits for the model
    session_id, sent = send(ctx, "word " * 40)
    with pytest.warns(UserWarning, match="context window is 16 tokens"):
        updates = run(ctx, sent)
    assert "Not generated" in updates[-1]["token_view"]
    assert messages(ctx, session_id) == [("user", "complete", "word " * 40)]  # the text is kept, no empty reply


def test_stop_while_queued_means_the_reply_never_starts_and_the_message_is_kept(ctx, engine):
    engine.delay_s = 0.05
    engine.enqueue(FakeReply(" ".join(["busy"] * 60), accept=(1,)))
    busy, busy_sent = send(ctx, "keeps the engine busy")
    first = threading.Thread(target=run, args=(ctx, busy_sent))
    first.start()
    session_id, sent = send(ctx, "waits in the queue")
    h.stop(ctx, session_id)  # pressed while the request waits for the engine
    updates = run(ctx, sent)
    first.join(timeout=30)
    assert messages(ctx, session_id) == [("user", "complete", "waits in the queue")]
    assert "stopped before generation started" in updates[-1]["token_view"]
    assert len(engine.calls) == 1  # the engine never ran the stopped request
    # an earlier Stop does not block the next request
    engine.enqueue(FakeReply("fine", accept=(1,)))
    sent = h.regenerate(ctx, session_id, SETTINGS)
    run(ctx, sent)
    assert messages(ctx, session_id)[-1] == ("assistant", "complete", "fine")


def test_import_restores_an_exported_session_once_and_refuses_bad_files(ctx, engine, tmp_path):
    engine.enqueue("the reply")
    session_id, sent = send(ctx, "keep me")
    run(ctx, sent)
    exported = h.export(ctx, session_id).value
    path = exported["path"] if isinstance(exported, dict) else exported
    h.confirm_delete(ctx, session_id)
    assert ctx.store.count_sessions() == 0

    view = h.import_sessions(ctx, path)
    restored = view["session"]
    assert [(m["role"], m["content"]) for m in ctx.store.get_messages(restored)] == [
        ("user", "keep me"), ("assistant", "the reply")]
    assert ctx.store.get_cycles(ctx.store.get_messages(restored)[-1]["id"])  # with its cycles
    assert view["chat"][0]["content"] == "keep me"  # the page shows it
    assert h.import_sessions(ctx, path)["session"] == restored and ctx.store.count_sessions() == 1  # twice: no copy

    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "wrong.json").write_text(json.dumps({"sessions": [{"title": "no uuid"}]}), encoding="utf-8")
    for name, message in [("bad.json", "not JSON"), ("wrong.json", "was not imported")]:
        with pytest.raises(gr.Error, match=message):
            h.import_sessions(ctx, str(tmp_path / name))
    assert ctx.store.count_sessions() == 1  # nothing written


def test_the_page_imports_what_windows_tools_save_like_the_cli_does(ctx, engine, tmp_path):
    """The page's upload and `sessions import` read files with one reader: a UTF-8 byte-order mark
    (Notepad) or UTF-16 (PowerShell 5's `>`) imports, other encodings are refused by name."""
    engine.enqueue("the reply")
    session_id, sent = send(ctx, "keep me")
    run(ctx, sent)
    text = json.dumps(ctx.store.export_session(session_id), ensure_ascii=False)
    for name, data in (("bom.json", b"\xef\xbb\xbf" + text.encode()), ("utf16.json", text.encode("utf-16"))):
        h.confirm_delete(ctx, ctx.store.list_sessions()[0]["id"])
        (tmp_path / name).write_bytes(data)
        restored = h.import_sessions(ctx, str(tmp_path / name))["session"]
        assert [m["content"] for m in ctx.store.get_messages(restored)] == ["keep me", "the reply"], name
    (tmp_path / "latin1.json").write_bytes(text.replace("keep me", "café").encode("latin-1", errors="replace"))
    with pytest.raises(gr.Error, match="latin1.json is not UTF-8"):
        h.import_sessions(ctx, str(tmp_path / "latin1.json"))


# ============================================================================ while a reply runs elsewhere


def busy_engine(ctx, engine, words=80):
    """A reply in another session that holds the one engine worker (~4 s unless stopped)."""
    engine.delay_s = 0.05
    engine.enqueue(FakeReply(" ".join(["busy"] * words), accept=(1,)))
    busy, sent = send(ctx, "keeps the engine busy")
    thread = threading.Thread(target=run, args=(ctx, sent))
    thread.start()
    assert engine.running.wait(5)
    return busy, thread


def test_a_message_is_refused_while_the_last_one_still_waits_for_the_engine(ctx, engine):
    """Its reply has no stored row yet: a second message would be stored before it, answered out
    of order, and the second reply stream would find nothing to answer."""
    busy, thread = busy_engine(ctx, engine)
    session_id, sent = send(ctx, "first")
    waiting = threading.Thread(target=run, args=(ctx, sent))
    waiting.start()
    deadline = time.monotonic() + 5
    while not ctx.replies.reply_pending(session_id) and time.monotonic() < deadline:
        time.sleep(0.01)
    for attempt in (lambda: h.check_send(ctx, session_id, "second", SETTINGS),
                    lambda: h.check_regenerate(ctx, session_id, SETTINGS)):
        with pytest.raises(gr.Error, match="still waiting for the engine"):
            attempt()
    h.stop(ctx, busy)
    thread.join(10)
    waiting.join(10)
    assert not ctx.replies.reply_pending(session_id)  # forgotten as the reply ends, before the page hears of it
    engine.enqueue("second answer")
    _, sent = send(ctx, "second", session_id)
    run(ctx, sent)
    assert [m["content"] for m in ctx.store.get_messages(session_id)][::2] == ["first", "second"]
    assert messages(ctx, session_id)[-1] == ("assistant", "complete", "second answer")


def test_a_reply_the_page_stopped_reading_goes_on_and_stop_still_reaches_it(ctx, engine):
    """Showing another session ends the page's stream: its last update changes nothing (the page
    shows the other session), the reply goes on and is saved, and a Stop pressed on coming back
    still stops it."""
    other, sent = send(ctx, "the other one")
    run(ctx, sent)
    engine.delay_s = 0.05
    engine.enqueue(FakeReply(" ".join(["tok"] * 200), accept=(1,)))
    session_id, sent = send(ctx, "long please")
    updates = []
    stream = threading.Thread(target=lambda: updates.extend(h.respond(ctx, sent["reply_request"], page="tab-1")))
    stream.start()
    while not any(u.get("streaming") for u in list(updates)):
        time.sleep(0.02)
    view = h.select_session(ctx, other, "", page="tab-1")  # returns once the stream has sent its last update
    assert not stream.is_alive() and updates[-1] == {}  # Gradio repeats a stream's last values as it ends
    assert view["chat"][0]["content"] == "the other one"
    assert ctx.replies.reply_pending(session_id)
    time.sleep(0.3)
    assert ctx.store.get_messages(session_id)[-1]["status"] == "streaming"  # still generating
    h.stop(ctx, session_id)
    deadline = time.monotonic() + 5
    while ctx.store.get_messages(session_id)[-1]["status"] == "streaming" and time.monotonic() < deadline:
        time.sleep(0.05)
    reply = ctx.store.get_messages(session_id)[-1]
    assert reply["status"] == "interrupted" and 0 < len(reply["content"].split()) < 200


def test_the_shown_session_refreshes_while_a_reply_the_page_does_not_stream_grows(ctx, engine):
    engine.delay_s = 0.05
    engine.enqueue(FakeReply(" ".join(["tok"] * 120), accept=(1,)))
    session_id, sent = send(ctx, "grow")
    stream = h.respond(ctx, sent["reply_request"])
    streamed = next(u["streaming"] for u in stream if u.get("streaming"))
    seen = h.live_refresh(ctx, session_id, "", None, streamed, page="a-page-id")["live_seen"]
    time.sleep(1.2)  # the stored reply grows (flushed every second)
    assert "chat" not in h.live_refresh(ctx, session_id, "", seen, streamed, page="a-page-id")  # this page streams it itself
    stream.close()
    view = h.select_session(ctx, session_id)  # shown again: the page no longer streams it
    assert view["streaming"] is None
    seen = h.live_refresh(ctx, session_id, "", seen, view["streaming"], page="a-page-id")["live_seen"]
    time.sleep(1.2)
    update = h.live_refresh(ctx, session_id, "", seen, view["streaming"], page="a-page-id")
    assert update["chat"][-1]["content"].count("tok") > view["chat"][-1]["content"].count("tok")
    h.stop(ctx, session_id)


def test_deleting_a_session_while_its_reply_streams_ends_the_stream_quietly(ctx, engine):
    engine.delay_s = 0.05
    engine.enqueue(FakeReply(" ".join(["tok"] * 200), accept=(1,)))
    session_id, sent = send(ctx, "doomed")
    stream = h.respond(ctx, sent["reply_request"])
    first = next(u for u in stream if u.get("streaming"))
    h.confirm_delete(ctx, session_id)
    updates = list(stream)  # no exception: it would badge every streamed output
    # the session chart stays as drawn (not read again from a session that is gone), and no
    # "Generation failed" toast
    assert updates[-1]["session_chart"] == first["session_chart"]
    assert ctx.store.count_sessions() == 0


def test_rename_refuses_a_blank_title_before_anything_changes(ctx, engine):
    session_id, sent = send(ctx, "named")
    with pytest.raises(gr.Error, match="cannot be empty"):
        h.check_rename(session_id, "   ")
    with pytest.raises(gr.Error, match="No session selected"):
        h.check_rename(None, "title")
    h.check_rename(session_id, "a title")


def test_a_reply_footer_gives_the_speedup_the_stats_give_also_when_redrawn_from_the_database(ctx):
    """The chat redraws footers from the light cycle series: it must read each cycle's measured
    cost in plain steps, not fall back to the prior (which read 3.48x for a 1.70x reply)."""
    session_id = ctx.store.create_session("costs")
    ctx.store.add_message(session_id, "user", "q")
    reply = ctx.store.start_reply(session_id, model="m", settings={})
    cycles = [{"index": i, "block_size": 8, "accepted": a, "tau": a + 1, "draft_ms": 3.0, "verify_ms": 18.0,
               "emitted_pieces": ["x"] * (a + 1), "cost_in_plain_steps": 1.65,
               "fallback": {"state": "full", "changed": False, "next_block_size": 8}}
              for i, a in enumerate((0, 0, 6, 3, 0), start=1)]
    ctx.store.save_reply(reply, content="x" * 14, cycles=cycles, status="complete", new_tokens=14)
    stats = h.stored_trace(ctx, ctx.store.get_messages(session_id)[-1]).estimated_speedup()
    assert stats == pytest.approx(2.8 / 1.65)
    footer = h.chat_history(ctx, session_id)[0][-1]["content"]
    assert f"~{stats:.2f}× est. speedup" in footer


def test_a_send_is_checked_once_and_respond_reads_nothing_again(ctx, engine, monkeypatch):
    """The page's check hands the send what it accepted, and the send hands respond the checked
    request: the context window is checked once before the engine's own check, and respond reads
    none of the session's messages (only its stats, for the session chart at the end)."""
    _, sent = send(ctx, "first")
    run(ctx, sent)
    checks, reads = [], []
    check_request = engine.check_request
    monkeypatch.setattr(engine, "check_request", lambda *args: checks.append(args) or check_request(*args))
    get_messages = ctx.store.get_messages
    monkeypatch.setattr(ctx.store, "get_messages", lambda *args: reads.append(args) or get_messages(*args))
    accepted = h.check_send(ctx, sent["session"], "second", SETTINGS)
    handed = h.submit_prompt(ctx, sent["session"], "second", SETTINGS, accepted)
    assert len(checks) == 1
    reads.clear()
    updates = run(ctx, handed)
    assert reads == [] and len(checks) == 2  # the second check is the engine's own, as it generates
    assert updates[0]["reply_request"] is None  # asked for once: a second respond finds nothing to answer
    with pytest.raises(gr.Error, match="Nothing to answer"):
        run(ctx, {"reply_request": None})
    assert engine.calls[-1]["prompt_ids"] == engine.encode([{"role": "user", "content": "first"},
                                                            {"role": "assistant", "content": ctx.store.get_messages(
                                                                sent["session"])[1]["content"]},
                                                            {"role": "user", "content": "second"}])
