"""The Teach tab's pure parts and handlers: steps built from stored cycles (FakeEngine replies
and a real tiny engine), captions, the comparison with plain decoding, Play/Prev/Next, and the
session analytics checked against SQL run directly on the database file."""

from __future__ import annotations

import csv
import io
import json
import sqlite3

import gradio as gr
import pytest

from service.settings import Settings
from tests.fake_engine import FakeEngine, FakeReply, fake_studio
from tests.needs import missing
from ui.chat import handlers as h
from ui.teach import analytics as an
from ui.teach import tab as teach
from ui.teach.compare import Comparison, Run, stored_run, why_different
from ui.teach.render import compare_html, step_html
from ui.teach.steps import build_steps, caption, first_text, reply_numbers, reply_prompt

SETTINGS = Settings(block_size=8, temperature=0.0, top_p=1.0, max_new_tokens=256, fallback=True, show_rejected=True)
CODE_REPLY = "```python\ndef add(a, b):\n    return a + b\n\n\nclass Stack:\n    def push(self, x):\n        self.items.append(x)\n```\n"
PROSE_REPLY = ("Speculative decoding lets a small model guess several tokens at once. The large model then checks "
               "the guesses in a single pass and keeps the ones it agrees with. It never changes the answer.\n")
EVIL = 'Try <script>alert("x")</script> & <img src=x onerror=alert(1)> now.\n'


@pytest.fixture
def engine():
    return FakeEngine()


@pytest.fixture
def ctx(engine, tmp_path):
    ctx = fake_studio(engine, db_path=tmp_path / "sessions.db", ui=False)
    ctx.engines.start().result(timeout=10)
    yield ctx
    ctx.engines.shutdown()
    ctx.store.close()


def chat(ctx, engine, text, reply=None, session_id=None, settings=SETTINGS):
    if reply is not None:
        engine.enqueue(reply)
    sent = h.submit_prompt(ctx, session_id, text, settings)
    list(h.respond(ctx, sent["reply_request"]))
    session_id = sent["session"]
    return session_id, ctx.store.get_messages(session_id)[-1]


def expected_verdicts(cycle: dict) -> list[str]:
    """What #teach-slots must show for a stored cycle: anchor, the stored slot verdicts, the bonus."""
    verdicts = ["anchor"] + [slot["verdict"] for slot in cycle["slots"]]
    if cycle["bonus"] is not None and len(cycle["emitted"]) == cycle["accepted"] + 1:
        verdicts.append("bonus")
    return verdicts


# ============================================================================ steps


def test_steps_follow_the_stored_cycles_slot_by_slot(ctx, engine):
    _, reply = chat(ctx, engine, "fib please", FakeReply(accept=(3, 0, 7, 1), fallback_at={}))
    cycles = ctx.store.get_cycles(reply["id"])
    steps = build_steps(reply["content"], cycles)
    assert len(steps) == len(cycles) > 5
    for step, cycle in zip(steps, cycles):
        assert step.verdicts == expected_verdicts(cycle)
        assert len(step.draft_slots) == cycle["block_size"] - 1
        assert step.tau == cycle["tau"] and step.accepted == cycle["accepted"]
        assert step.draft_view == [step.anchor_text] + ["MASK"] * (cycle["block_size"] - 1)
        assert [s.text for s in step.draft_slots] == [s["text"] for s in cycle["slots"]]
        assert step.bonus_text == cycle["emitted_pieces"][cycle["accepted"]]
        assert step.cache_line.startswith(f"target cache {cycle['anchor_position']} → {cycle['context_length']} tokens")
        assert f"{cycle['new_context_features']} new context feature" in step.cache_line
    # the anchors chain: each cycle's anchor is the previous cycle's last token; the text adds up
    assert steps[0].anchor_text == first_text(reply["content"], cycles) == "Here"
    for before, after in zip(steps, steps[1:]):
        assert after.anchor_text == before.emitted_pieces[-1]
        assert after.text_before == before.text_after
    assert steps[-1].text_after == reply["content"]
    # a cycle with every draft accepted, one with none
    full = next(s for s in steps if s.accepted == 7)
    assert full.verdicts == ["anchor"] + ["accepted"] * 7 + ["bonus"]
    none = next(s for s in steps if s.accepted == 0)
    assert none.verdicts == ["anchor", "rejected"] + ["unverified"] * 6 + ["bonus"]


def test_captions_say_what_happened():
    def cycle(block, accepted, emitted, bonus=7, rejected=("x",), changed=False):
        drafts = block - 1
        slots = [{"token": 1, "text": f"d{j}", "draft_top": [[1, f"d{j}", 0.5]], "target_prob": 0.5, "target_token": 1,
                  "verdict": "accepted" if j < accepted else ("rejected" if j == accepted else "unverified")}
                 for j in range(drafts)]
        return {"index": 1, "block_size": block, "accepted": accepted, "tau": len(emitted), "bonus": bonus,
                "anchor": 5, "anchor_position": 10, "emitted": list(range(len(emitted))), "emitted_pieces": list(emitted),
                "rejected_pieces": list(rejected), "slots": slots, "draft_ms": 1.0, "verify_ms": 2.0,
                "context_length": 10 + len(emitted), "new_context_features": len(emitted),
                "fallback": {"state": "reduced", "changed": changed, "reason": "τ 1.2 over last 8 cycles",
                             "next_block_size": 4}}

    partial = build_steps("A" + "bcd", [cycle(8, 2, ["b", "c", "d"])])[0]
    words = caption(partial)
    assert "agreed with the first 2 draft tokens" in words and "slot 3" in words and "4 draft tokens after it" in words
    assert "bonus" in words and "3 tokens from one target pass" in words
    full = caption(build_steps("A" + "bcd", [cycle(4, 3, ["b", "c", "d", "e"], rejected=())])[0])
    assert "agreed with every draft token" in full
    zero = caption(build_steps("Ab", [cycle(4, 0, ["b"])])[0])
    assert "disagreed with the very first draft token" in zero
    plain = build_steps("Ab", [cycle(1, 0, ["b"], rejected=())])[0]
    assert "Speculation was off" in caption(plain) and plain.verdicts == ["anchor", "bonus"]
    cut = build_steps("Abc", [cycle(8, 2, ["b", "c"], bonus=None, changed=True)])[0]
    assert cut.cut and "bonus" not in cut.verdicts and "no bonus" in caption(cut) and "target “" not in caption(cut)
    assert "Dynamic fallback changed the next block size to 4" in caption(cut)
    ended = caption(build_steps("Ab", [cycle(4, 3, ["b", "c", "d", ""], rejected=())])[0])  # the end token has no text
    assert "“∅”" in ended and "the token that ends the reply" in ended


def test_steps_without_slot_details_derive_verdicts_from_the_accepted_count():
    cycle = {"index": 1, "block_size": 4, "accepted": 1, "tau": 2, "bonus": 9, "emitted": [3, 9],
             "emitted_pieces": ["x", "y"], "rejected_pieces": ["q", "r"], "slots": [], "draft_tokens": [3, 4, 5]}
    step = build_steps("Axy", [cycle])[0]
    assert step.verdicts == ["anchor", "accepted", "rejected", "unverified", "bonus"]
    assert [s.text for s in step.draft_slots] == ["x", "q", "r"]
    assert "without the draft" in step_html(step)


def test_model_text_is_escaped_in_every_view(ctx, engine):
    _, reply = chat(ctx, engine, "<b>hi</b>", FakeReply(EVIL, accept=(2, 1, 3), fallback_at={}))
    steps = build_steps(reply["content"], ctx.store.get_cycles(reply["id"]))
    page = "".join(step_html(s) for s in steps)
    assert "<script" not in page and "<img" not in page and "&lt;script" in page
    comparison = Comparison(Run("stored reply", text=EVIL), Run("plain decoding", text=EVIL + "<i>"), None, 0.0)
    assert "<i>" not in compare_html(comparison) and "<script" not in compare_html(comparison)


def test_reply_prompt_rebuilds_what_the_app_sent(ctx, engine):
    session_id, _ = chat(ctx, engine, "first question", "first answer")
    chat(ctx, engine, "second question", "second answer", session_id)
    messages = ctx.store.get_messages(session_id)
    second = messages[-1]
    prompt, raw = reply_prompt(messages, second)
    assert not raw and prompt == [{"role": "user", "content": "first question"},
                                  {"role": "assistant", "content": "first answer"},
                                  {"role": "user", "content": "second question"}]
    assert reply_prompt(messages, messages[1]) == ([{"role": "user", "content": "first question"}], False)
    sent = h.submit_completion(ctx, session_id, "def f(x):\n", SETTINGS)
    list(h.respond(ctx, sent["reply_request"]))
    messages = ctx.store.get_messages(session_id)
    assert reply_prompt(messages, messages[-1]) == ("def f(x):", True)  # healed, as the app sent it


# ============================================================================ replay handlers


def test_the_view_defaults_to_the_latest_reply_and_steps_through_it(ctx, engine):
    first, _ = chat(ctx, engine, "old session", "old reply here")
    session_id, reply = chat(ctx, engine, "new", FakeReply(accept=(2,), fallback_at={}))
    view = teach.full_view(ctx)
    assert set(view) == set(teach.FULL_VIEW)
    assert view["session"].value == session_id and view["reply"].value == reply["id"]
    assert [v for _, v in view["session"].choices] == [session_id, first]
    n = len(ctx.store.get_cycles(reply["id"]))
    assert view["cycle"].maximum == n and 'data-cycle="1"' in view["step"]
    assert f"DFlash used <b>{n}</b>" in view["explainer"]
    moved = teach.move(ctx, reply["id"], 1, +1)
    assert moved["cycle"] == 2 and 'id="teach-slots" data-cycle="2"' in moved["step"]
    assert teach.move(ctx, reply["id"], 1, -1)["cycle"] == 1  # clamped at both ends
    assert teach.move(ctx, reply["id"], n, +1)["cycle"] == n
    # Play from the end restarts; each tick moves one cycle; the last tick stops the timer
    played = teach.toggle_play(ctx, reply["id"], n, False, 2.0)
    assert played["playing"] and played["timer"].active and played["timer"].value == 0.5 and played["cycle"] == 1
    ticked = teach.tick(ctx, reply["id"], 1, True)
    assert ticked["cycle"] == 2 and 'data-cycle="2"' in ticked["step"] and set(ticked) == {"cycle", "step"}
    ticked = teach.tick(ctx, reply["id"], n - 1, True)
    assert ticked["cycle"] == n and not ticked["playing"]
    assert ticked["timer"].active is False and ticked["play"].value == teach.PLAY
    paused = teach.tick(ctx, reply["id"], 3, False)  # a tick that arrives after Pause changes nothing
    assert set(paused) == {"timer"} and paused["timer"].active is False
    assert teach.toggle_play(ctx, reply["id"], 3, True, 1.0)["playing"] is False  # pause
    # an older session's reply can be picked; an unknown one falls back to the default
    assert teach.full_view(ctx, first)["reply"].value == ctx.store.get_messages(first)[-1]["id"]
    assert teach.full_view(ctx, 999_999)["session"].value == session_id


def test_an_empty_database_shows_a_hint_not_an_error(ctx):
    view = teach.full_view(ctx)
    assert view["session"].value is None and view["reply"].value is None
    assert "chat first" in view["step"]


# ============================================================================ comparison


def test_compare_reports_identical_output_and_the_speedup(ctx, engine):
    _, reply = chat(ctx, engine, "fib", FakeReply(accept=(5, 2, 7), fallback_at={}))
    updates = list(teach.compare(ctx, reply["id"]))
    html, chart = updates[-1]["compare_result"], updates[-1]["compare_chart"]
    assert 'data-identical="true"' in html and "identical" in html and 'id="compare-speedup"' in html
    assert {trace["name"] for trace in json.loads(chart.plot)["data"]} == {"plain decoding", "DFlash (re-run now)",
                                                                          "stored reply"}
    warm_plain, warm_dflash, plain_call, dflash_call = engine.calls[-4:]
    assert warm_plain["sampling"].max_new_tokens == warm_dflash["sampling"].max_new_tokens == 4
    assert plain_call["sampling"].block_size == 1 and dflash_call["sampling"].block_size == 8
    assert plain_call["prompt_ids"] == dflash_call["prompt_ids"] == engine.calls[0]["prompt_ids"]
    assert plain_call["sampling"].max_new_tokens == 256 and plain_call["sampling"].seed == 0


def test_compare_reports_a_difference_and_explains_it_at_temperature_above_zero(ctx, engine):
    settings = Settings(8, 0.7, 0.9, 256, False, True)
    _, reply = chat(ctx, engine, "fib", "one answer", settings=settings)
    engine.enqueue(*["another answer"] * 4)  # two short warm-up runs, then plain and DFlash
    html = list(teach.compare(ctx, reply["id"]))[-1]["compare_result"]
    assert 'data-identical="false"' in html and "different" in html
    assert "temperature 0.7" in html and "random sample" in html
    assert engine.calls[-1]["sampling"].temperature == 0.7 and engine.calls[-1]["sampling"].top_p == 0.9


def test_stop_ends_a_running_comparison(ctx, engine):
    import threading

    _, reply = chat(ctx, engine, "long", FakeReply(" ".join(f"w{i}" for i in range(200)), accept=(1,), fallback_at={}))
    engine.delay_s = 0.05  # ~10 s per run unless stopped
    updates = []
    worker = threading.Thread(target=lambda: updates.extend(teach.compare(ctx, reply["id"])))
    worker.start()
    assert engine.running.wait(5)
    teach.stop_compare(ctx, reply["id"])
    worker.join(5)
    assert not worker.is_alive() and "stopped" in updates[-1]["compare_result"]


def test_a_stop_pressed_earlier_in_the_session_does_not_cancel_a_new_comparison(ctx, engine):
    _, reply = chat(ctx, engine, "fib", FakeReply(accept=(2, 4), fallback_at={}))
    h.stop(ctx, reply["session_id"])  # e.g. Esc pressed after the reply ended
    teach.stop_compare(ctx, reply["id"])
    html = list(teach.compare(ctx, reply["id"]))[-1]["compare_result"]
    assert 'data-identical="true"' in html


def test_what_refuses_a_comparison_is_checked_before_it_runs(ctx, engine):
    with pytest.raises(gr.Error, match="Pick a reply"):
        teach.check_compare(ctx, None)
    session_id, reply = chat(ctx, engine, "fib", FakeReply(accept=(2, 4), fallback_at={}))
    with pytest.raises(gr.Error, match="Only a reply"):
        teach.check_compare(ctx, ctx.store.get_messages(session_id)[0]["id"])
    assert teach.check_compare(ctx, reply["id"])[0]["id"] == reply["id"]


def test_a_stopped_reply_is_compared_on_the_tokens_it_has(ctx, engine):
    session_id, full = chat(ctx, engine, "fib", FakeReply(accept=(2, 4), fallback_at={}))
    cycles = ctx.store.get_cycles(full["id"])[:3]
    text = first_text(full["content"], ctx.store.get_cycles(full["id"]))
    text += "".join("".join(c["emitted_pieces"]) for c in cycles)
    ctx.store.add_message(session_id, "user", "fib")  # the same prompt again, answered and stopped early
    stopped = ctx.store.start_reply(session_id, model=engine.name, settings=full["settings"])
    ctx.store.save_reply(stopped, content=text, cycles=cycles, status="interrupted")
    html = list(teach.compare(ctx, stopped))[-1]["compare_result"]
    produced = 1 + sum(c["tau"] for c in cycles)
    assert 'data-identical="true"' in html and f"interrupted after {produced} tokens" in html
    assert engine.calls[-1]["sampling"].max_new_tokens == produced


def test_comparison_figures_are_pure():
    stored = stored_run({"content": "abc", "tokens_per_s": 30.0, "prefill_ms": 5.0},
                        [{"tau": 2, "draft_ms": 1.0, "verify_ms": 3.0}, {"tau": 1, "draft_ms": 1.0, "verify_ms": 3.0}])
    assert stored.timeline == [(5.0, 1), (9.0, 3), (13.0, 4)] and stored.mean_tau == 1.5
    plain, dflash = Run("plain", text="abc", tokens_per_s=10.0), Run("dflash", text="abc", tokens_per_s=25.0)
    assert Comparison(stored, plain, dflash, 0.0).speedup == 2.5
    assert Comparison(stored, plain, None, 0.0).speedup == 3.0  # no re-run: the stored reply's speed
    assert "was <b id=\"compare-speedup\">2.50×</b> faster" in compare_html(Comparison(stored, plain, dflash, 0.0))
    slow = Comparison(stored, Run("plain", text="abc", tokens_per_s=50.0), dflash, 0.0)
    assert "ran at <b id=\"compare-speedup\">0.50×</b> the speed" in compare_html(slow)
    different = Comparison(stored, Run("plain", text="abd", tokens_per_s=10.0), None, 0.0)
    assert not different.identical and different.first_difference() == 2
    assert "temperature 0" in why_different(different)


def test_the_plain_run_of_a_real_engine_matches_greedy_dflash(tmp_path):
    """On a tiny random pair: a stored greedy reply replays with its real slots, and the plain
    re-run (speculation off, through the same loop) is identical to it."""
    from engine.config import EngineConfig, FallbackConfig, SamplingConfig
    from engine.events import Cycle, Finished, event_to_dict
    from engine.runtime import Engine
    from storage import SessionStore
    from tests.tiny_models import save_tiny_pair
    from ui.teach.compare import run_comparison

    target_dir, draft_dir, *_ = save_tiny_pair(tmp_path / "pair", block_size=4)
    engine = Engine.load(EngineConfig(target=str(target_dir), draft=str(draft_dir), device="cpu"))
    store = SessionStore(tmp_path / "s.db")
    session = store.create_session("tiny")
    store.add_message(session, "user", "def add(a, b):")
    settings = {"block_size": 4, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 24, "fallback": False}
    reply = store.start_reply(session, model=engine.name, settings=settings)
    prompt = [{"role": "user", "content": "def add(a, b):"}]
    ids = engine.encode(prompt)
    events = list(engine.generate(ids, SamplingConfig(max_new_tokens=24, block_size=4), FallbackConfig(enabled=False)))
    finished = events[-1]
    assert isinstance(finished, Finished)
    store.save_reply(reply, content=finished.text, cycles=[event_to_dict(e) for e in events if isinstance(e, Cycle)],
                     status="complete")
    message = store.get_message(reply)
    cycles = store.get_cycles(reply)
    steps = build_steps(message["content"], cycles)
    assert [s.verdicts for s in steps] == [expected_verdicts(c) for c in cycles]
    assert all(len(s.draft_slots[0].draft_top) == 3 for s in steps if s.block_size > 1)
    assert steps[-1].text_after == message["content"]
    plain, dflash = run_comparison(engine, prompt, False, settings)
    assert plain.text == message["content"] == dflash.text
    assert plain.cycles == plain.new_tokens - 1 and plain.mean_tau == 1.0
    assert Comparison(stored_run(message, cycles), plain, dflash, 0.0).identical
    numbers = reply_numbers(steps)
    assert numbers.plain_passes == len(finished.token_ids) - 1 and numbers.verify_passes == len(cycles)
    store.close()


# ============================================================================ analytics


def make_analytics_session(ctx, engine):
    session_id, _ = chat(ctx, engine, "code please", FakeReply(CODE_REPLY, accept=(6, 5, 7), fallback_at={}))
    chat(ctx, engine, "explain", FakeReply(PROSE_REPLY, accept=(1, 0, 2), fallback_at={}), session_id)
    chat(ctx, engine, "more code", FakeReply(CODE_REPLY + "x = 1\n", accept=(4, 7, 2, 0),
                                             fallback_at={3: (4, "reduced", "τ low")}), session_id)
    chat(ctx, engine, "and words", FakeReply(PROSE_REPLY, accept=(3,), fallback_at={}), session_id)
    sent = h.submit_completion(ctx, session_id, "def f(x):\n", SETTINGS)
    engine.enqueue(FakeReply("    return x * 2\n", accept=(2,), fallback_at={}))
    list(h.respond(ctx, sent["reply_request"]))
    return session_id


def test_reply_kinds_are_detected_from_the_text():
    assert an.reply_kind(CODE_REPLY) == "code"
    assert an.reply_kind(PROSE_REPLY) == "prose"
    assert an.reply_kind("Here you go:\n\n" + CODE_REPLY + "\nIt adds.") == "code"
    assert an.reply_kind("import os\nfor name in os.listdir('.'):\n    print(name)\n") == "code"  # no fences
    assert an.reply_kind("Sure.") == "prose" and an.reply_kind("") == "prose"
    assert an.reply_kind("just words", mode="complete") == "code"


def test_analytics_match_sql_on_the_database(ctx, engine):
    session_id = make_analytics_session(ctx, engine)
    data = an.session_analytics(ctx.store, session_id)
    assert [r.kind for r in data.replies] == ["code", "prose", "code", "prose", "code"]
    db = sqlite3.connect(ctx.store.path)
    rows = db.execute(
        "SELECT m.id, m.seq, count(c.id), sum(c.tau), avg(c.tau), CAST(sum(c.accepted) AS REAL) / sum(c.block_size - 1) "
        "FROM messages m JOIN cycles c ON c.message_id = m.id WHERE m.session_id = ? AND m.role = 'assistant' "
        "GROUP BY m.id ORDER BY m.seq", [session_id]).fetchall()
    assert len(rows) == len(data.replies) == 5
    for (message_id, seq, cycles, tokens, mean_tau, rate), reply in zip(rows, data.replies):
        assert (reply.message_id, reply.seq, reply.figures.cycles, reply.figures.tokens) == (message_id, seq, cycles, tokens)
        assert reply.figures.mean_tau == pytest.approx(mean_tau)
        assert reply.figures.acceptance_rate == pytest.approx(rate)
    kinds = {r.message_id: r.kind for r in data.replies}
    for kind in ("code", "prose", "all"):
        ids = [m for m, k in kinds.items() if kind == "all" or k == kind]
        marks = ",".join("?" * len(ids))
        cycles, tokens, mean_tau, rate = db.execute(
            f"SELECT count(*), sum(tau), avg(tau), CAST(sum(accepted) AS REAL) / sum(block_size - 1) FROM cycles "
            f"WHERE message_id IN ({marks})", ids).fetchone()
        figures = data.by_kind[kind]
        assert (figures.cycles, figures.tokens) == (cycles, tokens)
        assert figures.mean_tau == pytest.approx(mean_tau) and figures.acceptance_rate == pytest.approx(rate)
        histogram = dict(db.execute(f"SELECT tau, count(*) FROM cycles WHERE message_id IN ({marks}) GROUP BY tau", ids))
        assert figures.tau_histogram == histogram
        max_block = db.execute(f"SELECT max(block_size) FROM cycles WHERE message_id IN ({marks})", ids).fetchone()[0]
        expected = []
        for j in range(1, max_block):
            accepted, drafted = db.execute(
                f"SELECT sum(accepted >= ?), sum(block_size - 1 >= ?) FROM cycles WHERE message_id IN ({marks})",
                [j, j, *ids]).fetchone()
            expected.append(accepted / drafted)
        assert figures.per_position_acceptance == pytest.approx(expected)
    # the store's own SQL statistics agree on the whole session
    stats = ctx.store.session_stats(session_id)
    assert data.by_kind["all"].mean_tau == pytest.approx(stats["mean_tau"])
    assert data.by_kind["all"].acceptance_rate == pytest.approx(stats["acceptance_rate"])
    db.close()


def test_the_png_export_says_what_it_needs_when_no_browser_is_there(ctx, engine, tmp_path, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chrome"))  # where kaleido looks first
    monkeypatch.setenv("PATH", str(tmp_path))  # and no chromium on the PATH either
    data = an.session_analytics(ctx.store, make_analytics_session(ctx, engine))
    with pytest.raises(an.ChartExportError, match="CSV files are in .*export.*need Chrome or Chromium"):
        an.export_files(data, tmp_path / "export")
    assert sorted(p.name.split("-", 2)[2] for p in (tmp_path / "export").iterdir()) == [
        "replies.csv", "summary.csv", "token-classes.csv"]
    with pytest.raises(gr.Error, match="need Chrome or Chromium"):
        teach.export_analytics(ctx, data.session_id)


MIXED_REPLY = "Here is the helper you asked for, with a test.\n```python\ndef double(x):\n    return 2 * x\n```\nCall it with any number and it returns twice that number.\n"


def test_cycles_are_split_by_whether_they_landed_in_code_or_prose(ctx, engine):
    """Inside one reply: each cycle's tokens are in a code fence or not; checked against the
    pieces read straight from the database with a fence scanner of the test's own."""
    import json

    session_id, _ = chat(ctx, engine, "mixed", FakeReply(MIXED_REPLY, accept=(2, 5, 0, 3), fallback_at={}))
    chat(ctx, engine, "more", FakeReply(PROSE_REPLY + MIXED_REPLY, accept=(6, 1), fallback_at={}), session_id)
    data = an.session_analytics(ctx.store, session_id)
    db = sqlite3.connect(ctx.store.path)
    expected = {"code": [], "prose": []}
    for message_id, content in db.execute(
            "SELECT id, content FROM messages WHERE session_id = ? AND role = 'assistant' ORDER BY seq", [session_id]):
        rows = db.execute("SELECT emitted_pieces, tau FROM cycles WHERE message_id = ? ORDER BY idx", [message_id]).fetchall()
        pieces = ["".join(json.loads(p)) for p, _ in rows]
        inside, flags = False, []
        for line in content.splitlines(keepends=True):
            fence = line.lstrip().startswith("```")
            flags += [inside or fence] * len(line)
            inside = inside != fence
        pos = len(content) - len("".join(pieces))
        for piece, (_, tau) in zip(pieces, rows):
            span = flags[pos:pos + len(piece)]
            expected["code" if 2 * sum(span) >= len(span) else "prose"].append(tau)
            pos += len(piece)
    assert expected["code"] and expected["prose"]
    for region, taus in expected.items():
        figures = data.by_region[region]
        assert figures.cycles == len(taus) and figures.mean_tau == pytest.approx(sum(taus) / len(taus))
    html = teach.analytics_summary_html(data)
    assert 'data-region="code"' in html and f"{data.by_region['code'].mean_tau:.2f}" in html
    db.close()


def test_analytics_view_export_csv_and_png(ctx, engine, tmp_path):
    from PIL import Image

    session_id = make_analytics_session(ctx, engine)
    view = teach.analytics_view(ctx, session_id)
    summary, table = view["summary"], view["table"]
    over_time, histogram, positions, token_classes = (json.loads(view[name].plot) for name in (
        "tau_time", "tau_hist", "position", "token_classes"))  # the figure dicts the page draws
    assert 'data-kind="code"' in summary and 'data-kind="prose"' in summary
    assert len(table) == 5 and [row[1] for row in table] == ["code", "prose", "code", "prose", "code"]
    assert {trace["name"] for trace in histogram["data"]} == {"code", "prose"}
    assert {trace["name"] for trace in positions["data"]} == {"code", "prose", "all"}
    assert sum(len(trace["x"]) for trace in over_time["data"] if trace["mode"] == "markers") == 5
    data = an.session_analytics(ctx.store, session_id)
    try:
        paths = an.export_files(data, tmp_path / "export")
    except an.ChartExportError as exc:
        missing(str(exc))
    assert [p.split("session-")[-1].split("-", 1)[1] for p in paths] == [
        "replies.csv", "summary.csv", "token-classes.csv", "tau-per-reply.png", "tau-histogram.png",
        "acceptance-by-slot.png", "drafted-by-token-class.png"]
    assert token_classes["data"][0]["type"] == "bar"
    assert len(token_classes["data"][0]["x"]) == len(data.by_token_class.present())
    rows = {r["token_class"]: r for r in csv.DictReader(io.StringIO(open(paths[2], encoding="utf-8").read()))}
    assert sum(int(r["tokens"]) for r in rows.values()) == sum(data.by_token_class.total.values()) > 0
    replies = list(csv.DictReader(io.StringIO(open(paths[0], encoding="utf-8").read())))
    assert [r["kind"] for r in replies] == ["code", "prose", "code", "prose", "code"]
    slots = len(data.by_kind["all"].per_position_acceptance)
    for row, reply in zip(replies, data.replies):
        assert int(row["message_id"]) == reply.message_id and int(row["cycles"]) == reply.figures.cycles
        assert float(row["mean_tau"]) == pytest.approx(reply.figures.mean_tau, abs=1e-4)
        rates = [row[f"accepted_at_slot_{j}"] for j in range(1, slots + 1)]
        assert [float(r) for r in rates if r] == pytest.approx(reply.figures.per_position_acceptance, abs=1e-4)
        histogram = {t: int(row[f"cycles_with_tau_{t}"]) for t in range(1, 9) if int(row[f"cycles_with_tau_{t}"])}
        assert histogram == reply.figures.tau_histogram
    summary = {r["kind"]: r for r in csv.DictReader(io.StringIO(open(paths[1], encoding="utf-8").read()))}
    assert list(summary) == ["code", "prose", "all", "cycles in code", "cycles in prose"]
    assert summary["all"]["replies"] == "5"
    for kind, row in summary.items():
        figures = data.by_kind.get(kind) or data.by_region[kind.split()[-1]]
        assert int(row["cycles"]) == figures.cycles
        assert float(row["mean_tau"]) == pytest.approx(figures.mean_tau, abs=1e-4)
    for path in paths[3:]:  # the page's figures, as Plotly writes them (kaleido)
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size == an.PNG_SIZE
            assert len(image.convert("RGB").getcolors(1 << 20) or []) > 5  # drawn, not blank
    files = teach.export_analytics(ctx, session_id)
    assert files.visible and len(files.value) == 7


def test_the_tab_builds_inside_and_outside_a_tab(ctx):
    import gradio as gr

    with gr.Blocks() as demo:
        remembered = gr.BrowserState(None, storage_key="dflash-studio-session")
        with gr.Tab("Teach", elem_id="teach") as tab:
            inside = teach.build_teach_tab(ctx, demo, tab, chat_session=remembered)
    assert inside["chat_session"] is remembered
    ids = {block.elem_id for block in demo.blocks.values() if getattr(block, "elem_id", None)}
    assert {"teach-prev", "teach-next", "teach-play", "teach-step", "compare", "compare-result"} <= ids
    with gr.Blocks() as bare:
        outside = teach.build_teach_tab(ctx, bare)  # no tab, no chat: filled on page load instead
    assert outside["chat_session"] is None
    assert any(dep.get("trigger_after") is None and any(t[1] == "load" for t in dep.get("targets", []))
               for dep in bare.config["dependencies"])


def test_reply_prompt_leaves_out_the_turns_another_model_answered():
    """After a model change the app sends the new model only its own turns; Compare and Teach rebuild
    that prompt, not the whole history (else plain decoding answers another prompt and Compare reports
    a different output for a reply DFlash decoded correctly)."""
    def message(seq, role, content, model=""):
        return {"id": seq, "seq": seq, "role": role, "kind": "chat", "content": content, "model": model,
                "settings": {"model": model} if model else {}}

    messages = [message(1, "user", "write add"), message(2, "assistant", "def add(a, b): ...", "tiny-coder"),
                message(3, "user", "write is_even"), message(4, "assistant", "class Tk: pass", "tiny-coder-fast"),
                message(5, "user", "and is_odd"), message(6, "assistant", "def is_odd(n): ...", "tiny-coder")]
    assert reply_prompt(messages, messages[3]) == ([{"role": "user", "content": "write is_even"}], False)
    assert reply_prompt(messages, messages[5])[0] == [
        {"role": "user", "content": "write add"}, {"role": "assistant", "content": "def add(a, b): ..."},
        {"role": "user", "content": "and is_odd"}]
    older_name = {"tiny-coder (embedded)": "tiny-coder-fast"}  # a pair stored under its older name
    messages[1]["model"] = messages[1]["settings"]["model"] = "tiny-coder (embedded)"
    prompt, _ = reply_prompt(messages, messages[3], lambda name: older_name.get(name, name))
    assert [m["content"] for m in prompt] == ["write add", "def add(a, b): ...", "write is_even"]


def test_replies_are_numbered_1_2_in_the_menu_the_analytics_the_share_page_and_the_cli(ctx, engine, capsys):
    from app.cli import main as cli
    from ui.share.replay import load_share

    session_id, _ = chat(ctx, engine, "first request")
    chat(ctx, engine, "second request", session_id=session_id)
    menu = teach.reply_choices(ctx, session_id)
    assert [label.split(" · ")[0] for label, _ in menu] == ["reply 1", "reply 2"]
    assert [(r.number, r.message_id) for r in an.session_analytics(ctx.store, session_id).replies] == [
        (1, menu[0][1]), (2, menu[1][1])]
    assert [load_share(ctx.store, session_id, reply=n).message["id"] for n in (1, 2)] == [menu[0][1], menu[1][1]]
    rows = list(csv.DictReader(io.StringIO(an.replies_csv(an.session_analytics(ctx.store, session_id)))))
    assert [(row["reply"], int(row["message_id"])) for row in rows] == [("1", menu[0][1]), ("2", menu[1][1])]
    assert cli(["sessions", "show", str(session_id), "--db", str(ctx.store.path)]) == 0
    headers = [line.split(" · ")[0] for line in capsys.readouterr().out.splitlines() if " · complete" in line]
    assert headers == ["user", "reply 1", "user", "reply 2"]
