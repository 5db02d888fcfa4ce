"""What the page and the command line say is true, without a browser: where a new session's
settings come from, one speed story, readable defaults, one-line errors and right words.
(Chromium checks of the same page: tests/e2e/test_truthful_page.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import gradio as gr
import pytest

from engine.errors import CheckpointError
from service.settings import Settings
from storage import SessionStore
from tests.fake_engine import FakeReply
from ui.chat import handlers as h

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = Settings(block_size=8, temperature=0.0, top_p=1.0, max_new_tokens=256, fallback=True, show_rejected=False)


def controls_of(view: dict) -> tuple:
    """The six setting controls a view shows; the page's Settings State must say the same."""
    shown = tuple(view[key] for key in h.SETTING_KEYS)
    assert tuple(getattr(view["settings"], key) for key in h.SETTING_KEYS) == shown
    return shown


# ---------------------------------------------------------------------------- defaults


def test_a_new_session_starts_from_the_defaults_not_from_the_session_shown(ctx, engine):
    startup = controls_of(h.on_load(ctx, None))
    odd = (1, 1.2, 0.9, 64, False, True)
    sent = h.submit_prompt(ctx, None, "write add()", Settings(*odd))
    list(h.respond(ctx, sent["reply_request"]))
    session = sent["session"]
    assert controls_of(h.select_session(ctx, session)) == odd  # a session shows its own settings
    assert controls_of(h.new_session(ctx)) == startup  # a new one starts from the defaults


def test_saved_defaults_are_what_new_sessions_start_from_until_reset(ctx):
    mine = (4, 0.2, 0.95, 300, True, True)
    note = h.save_defaults(ctx, Settings(*mine))
    assert "saved on this page" in note and "300 new tokens" in note
    assert controls_of(h.new_session(ctx)) == mine
    assert ctx.store.get_preference(h.DEFAULTS_PREFERENCE)["max_new_tokens"] == 300  # kept in the database
    reset = h.reset_defaults(ctx, None)
    assert "start-up options" in reset["defaults_note"]
    assert controls_of(reset) == controls_of(h.new_session(ctx)) != mine


def test_invalid_defaults_are_refused_and_not_saved(ctx):
    with pytest.raises(gr.Error):
        h.save_defaults(ctx, replace(SETTINGS, block_size=99))
    assert ctx.store.get_preference(h.DEFAULTS_PREFERENCE) is None


def test_rejected_drafts_are_hidden_by_default(ctx):
    assert h.on_load(ctx, None)["show_rejected"] is False


# ---------------------------------------------------------------------------- refusals and words


def test_a_refusal_is_one_line_on_the_console_and_no_traceback(ctx, capsys):
    with pytest.raises(gr.Error) as refusal:
        h.check_send(ctx, None, "   ", SETTINGS)
    assert refusal.value.print_exception is False  # Gradio prints no traceback for it
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dflash-studio: refused: ")


def test_sessions_with_the_same_title_are_told_apart(ctx):
    for _ in range(3):
        h.submit_prompt(ctx, None, "def is_prime(n):", SETTINGS)
    labels = [label for label, _ in h.session_choices(ctx)]
    assert sorted(labels) == ["def is_prime(n):", "def is_prime(n): (2)", "def is_prime(n): (3)"]


def test_analytics_counts_and_regions_in_words(ctx, engine):
    from ui.teach import analytics as an
    from ui.teach.tab import analytics_summary_html

    engine.enqueue(FakeReply("def add(a, b):\n    return a + b\n", accept=(3, 2, 4)))
    sent = h.submit_prompt(ctx, None, "write add()", SETTINGS)
    list(h.respond(ctx, sent["reply_request"]))
    session = sent["session"]
    html = analytics_summary_html(an.session_analytics(ctx.store, session))
    assert "1 reply ·" in html and "1 replies" not in html and "0 replies" in html
    assert "in prose" not in html and 'data-region="code"' in html  # every reply was code


def test_a_mistyped_relative_path_says_no_such_directory(monkeypatch):
    from engine.loading import resolve

    monkeypatch.chdir(ROOT)
    for source in ("assets/models/tiny-coder-requets/target", "./assets/models/tiny-coder-requets/target"):
        with pytest.raises(CheckpointError) as error:
            resolve(source, "target")
        message = str(error.value)
        assert "no such directory" in message and "hub" not in message
        assert "did you mean assets/models/tiny-coder-requests/target?" in message


def test_sessions_list_into_a_closed_pipe_ends_quietly(tmp_path):
    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        for i in range(300):  # the list's 200 lines make about 220 kB: several times a pipe's 64 kB buffer,
            # so the writer is still writing when the reader goes (20 kB fitted in the buffer and could end 0)
            store.create_session(f"session {i} with a title long enough to fill the pipe quickly " + "x" * 1000)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    reader = subprocess.Popen([sys.executable, "-m", "app.cli", "sessions", "list", "--db", str(db)], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    reader.stdout.readline()  # `| head -1`
    reader.stdout.close()
    err = reader.stderr.read().decode()
    assert reader.wait(timeout=60) == 1
    assert "Broken pipe" not in err and "Traceback" not in err, err


def test_the_server_prints_the_page_and_the_api_base_url():
    from app.cmd_serve import addresses

    text = addresses("http://127.0.0.1:7860/", api=True)
    assert "http://127.0.0.1:7860/" in text and "http://127.0.0.1:7860/v1" in text
    assert "/v1" not in addresses("http://127.0.0.1:7860/", api=False)


# ---------------------------------------------------------------------------- one speed story


def stored_cycles(blocks: list[int], accepted: list[int], steps: dict[int, float]) -> list[dict]:
    return [{"index": i, "block_size": b, "accepted": a, "tau": a + 1, "emitted_pieces": ["x"] * (a + 1),
             "draft_ms": 1.0, "verify_ms": 2.0, "cost_in_plain_steps": steps[b],
             "fallback": {"state": "full", "changed": False}}
            for i, (b, a) in enumerate(zip(blocks, accepted), start=1)]


def trace_of(cycles: list[dict]):
    from ui.chat.trace import ReplyTrace

    return ReplyTrace.from_stored("y" + "x" * sum(c["tau"] for c in cycles), cycles)


def test_speculation_never_pays_at_or_below_even_nor_at_block_one():
    even = trace_of(stored_cycles([8] * 4, [1] * 4, {8: 2.0}))  # τ 2 ÷ 2 steps = 1.00×
    assert even.estimated_speedup() == pytest.approx(1.0)
    assert "pays" not in even.speed_explanation() and "about even" in even.speed_explanation()
    plain = trace_of(stored_cycles([1] * 5, [0] * 5, {1: 1.0}))
    assert "pays" not in plain.speed_explanation() and "block 1" in plain.speed_explanation()
    fast = trace_of(stored_cycles([8] * 4, [5] * 4, {8: 2.0}))
    assert "speculation pays" in fast.speed_explanation()


def test_the_stats_say_when_fallback_changed_the_block_size():
    from ui.chat.render import stats_html

    changed = trace_of(stored_cycles([8] * 5 + [4] * 12, [6] * 5 + [1] * 12, {8: 2.0, 4: 1.5}))
    html = stats_html(changed)
    assert 'data-stat="fallback-summary"' in html and "fallback: block 8→4 for 12 of 17 cycles" in html
    carried = trace_of(stored_cycles([4] * 3 + [8] * 3, [3] * 6, {8: 2.0, 4: 1.5}))
    carried.max_block_size = 8  # the reply asked for block 8
    assert "started at block 4" in stats_html(carried)
    fixed = trace_of(stored_cycles([8] * 5, [6] * 5, {8: 2.0}))
    assert "fallback-summary" not in stats_html(fixed)
    measured = stored_cycles([8, 1] + [8] * 5, [6, 0] + [6] * 5, {8: 2.0, 1: 1.0})  # one plain step, measured
    assert "fallback-summary" not in stats_html(trace_of(measured))
    off = stored_cycles([8] * 3 + [1] * 4, [6] * 3 + [0] * 4, {8: 2.0, 1: 1.0})
    for cycle in off[3:]:
        cycle["fallback"]["state"] = "off"
    assert "fallback: block 8→1 for 4 of 7 cycles" in stats_html(trace_of(off))


def run_of(label: str, prefill_ms: float, cycle_ms: float, taus: list[int], tokens_per_s: float):
    from ui.teach.compare import Run

    run = Run(label, tokens_per_s=tokens_per_s, prefill_ms=prefill_ms, cycles=len(taus))
    elapsed, tokens = prefill_ms, 1
    run.timeline.append((elapsed, tokens))
    for tau in taus:
        elapsed, tokens = elapsed + cycle_ms, tokens + tau
        run.timeline.append((elapsed, tokens))
    return run


def test_compare_says_why_its_measurement_differs_from_the_estimate():
    from ui.teach.compare import Comparison
    from ui.teach.render import compare_html

    plain = run_of("plain decoding", 10.0, 10.0, [1] * 60, 100.0)
    slow = run_of("DFlash (re-run now)", 10.0, 70.0, [5] * 12, 74.0)  # a cycle cost 7 plain steps now
    comparison = Comparison(run_of("stored reply", 10.0, 20.0, [5] * 12, 179.0), plain, slow, 0.0)
    html = compare_html(comparison, estimate={"speedup": 1.79, "tau": 5.0, "steps": 2.79})
    assert 'id="compare-estimate"' in html and "~1.79×" in html and "0.74×" in html
    assert "differ" in html and "a cycle cost 2.5× what the estimate assumed" in html
    agreeing = run_of("DFlash (re-run now)", 10.0, 28.0, [5] * 12, 176.0)
    html = compare_html(Comparison(comparison.stored, plain, agreeing, 0.0),
                        estimate={"speedup": 1.79, "tau": 5.0, "steps": 2.79})
    assert "agree within the estimate&#x27;s ±15%" in html


def test_compare_without_a_measurable_cycle_time_shows_the_runs_without_a_story():
    """A DFlash run whose cycles all carry the same timestamp (timings too coarse to tell them
    apart) has no cycle cost to compare with the estimate: no story, and no crash."""
    from ui.teach.compare import Comparison
    from ui.teach.render import compare_html

    plain = run_of("plain decoding", 10.0, 10.0, [1] * 60, 100.0)
    instant = run_of("DFlash (re-run now)", 10.0, 0.0, [5] * 12, 176.0)
    html = compare_html(Comparison(run_of("stored reply", 10.0, 20.0, [5] * 12, 179.0), plain, instant, 0.0),
                        estimate={"speedup": 1.79, "tau": 5.0, "steps": 2.79})
    assert "plain decoding" in html and "in the decode loop" not in html


# ---------------------------------------------------------------------------- charts


def test_fallback_labels_on_the_cycle_chart_keep_apart():
    from ui.chat import charts
    from ui.chat.trace import ReplyTrace

    trace = ReplyTrace()
    for i in range(1, 121):  # a change every third cycle over a long reply
        trace.add_cycle({"index": i, "block_size": 8 if i % 2 else 4, "accepted": 2, "tau": 3,
                         "emitted_pieces": ["a", "b", "c"],
                         "fallback": {"state": "reduced", "changed": i % 3 == 0, "next_block_size": 4,
                                      "reason": f"reason {i}"}})
    figure = charts.acceptance_chart(trace)
    xs = sorted(a["x"] for a in figure["layout"]["annotations"])
    assert len(xs) >= 2 and min(b - a for a, b in zip(xs, xs[1:])) >= charts.LABEL_SHARE * trace.cycles
    hover = next(d for d in figure["data"] if d.get("name") == "fallback change")
    assert len(hover["x"]) == len(trace.marks) == 40  # every change still shows, on hover


def test_a_reply_of_no_tokens_says_why_its_figures_are_empty():
    from ui.chat.render import stats_html
    from ui.chat.trace import ReplyTrace

    empty = ReplyTrace()
    empty.finished = {"reason": "stop", "new_tokens": 0, "tokens_per_s": None}
    assert "ended the reply before writing one" in stats_html(empty)
    assert 'data-stat="why"' not in stats_html(None)  # before any reply there is nothing to explain


def test_a_rejected_draft_never_breaks_the_line_it_sits_above():
    from ui.chat.render import render_token_view
    from ui.chat.trace import ReplyTrace

    trace = ReplyTrace()
    trace.start("def", 4)
    trace.add_cycle({"index": 1, "block_size": 4, "accepted": 1, "tau": 2, "emitted_pieces": [" f", "("],
                     "rejected_pieces": [":\n    ", "x"], "fallback": {"state": "full"}})
    html = render_token_view(trace)
    rejected = html.split('class="tok" data-origin="rejected"')[1].split("</span>")[0]
    assert "\n" not in rejected and "⏎" in rejected
