"""What the page and the command line say is true, without a browser: where a new session's
settings come from, one speed story, readable defaults, one-line errors and right words.
(Chromium checks of the same page: tests/e2e/test_truthful_page.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gradio as gr
import pytest

from engine.errors import CheckpointError
from storage import SessionStore
from tests.fake_engine import FakeEngine, FakeReply, fake_studio
from ui import handlers as h

ROOT = Path(__file__).resolve().parents[1]
CONTROLS = (8, 0.0, 1.0, 256, True, False)  # block size, temperature, top-p, max new tokens, fallback, show rejected


@pytest.fixture
def engine():
    return FakeEngine()


@pytest.fixture
def ctx(engine):
    ctx = fake_studio(engine, ui=False)
    ctx.engines.start().result(timeout=10)
    yield ctx
    ctx.engines.shutdown()
    ctx.store.close()


def controls_of(view: dict) -> tuple:
    return tuple(view[key] for key in h.SETTING_KEYS)


# ---------------------------------------------------------------------------- defaults


def test_a_new_session_starts_from_the_defaults_not_from_the_session_shown(ctx, engine):
    startup = controls_of(h.on_load(ctx, None))
    odd = (1, 1.2, 0.9, 64, False, True)
    session = h.submit_prompt(ctx, None, "write add()", *odd)["session"]
    list(h.respond(ctx, session, *odd))
    assert controls_of(h.select_session(ctx, session)) == odd  # a session shows its own settings
    assert controls_of(h.new_session(ctx)) == startup  # a new one starts from the defaults


def test_saved_defaults_are_what_new_sessions_start_from_until_reset(ctx):
    mine = (4, 0.2, 0.95, 300, True, True)
    note = h.save_defaults(ctx, *mine)
    assert "saved on this page" in note and "300 new tokens" in note
    assert controls_of(h.new_session(ctx)) == mine
    assert ctx.store.get_preference(h.DEFAULTS_PREFERENCE)["max_new_tokens"] == 300  # kept in the database
    reset = h.reset_defaults(ctx, None)
    assert "start-up options" in reset["defaults_note"]
    assert controls_of(reset) == controls_of(h.new_session(ctx)) != mine


def test_invalid_defaults_are_refused_and_not_saved(ctx):
    with pytest.raises(gr.Error):
        h.save_defaults(ctx, 99, 0.0, 1.0, 256, True, False)
    assert ctx.store.get_preference(h.DEFAULTS_PREFERENCE) is None


def test_rejected_drafts_are_hidden_by_default(ctx):
    assert h.on_load(ctx, None)["show_rejected"] is False


# ---------------------------------------------------------------------------- refusals and words


def test_a_refusal_is_one_line_on_the_console_and_no_traceback(ctx, capsys):
    with pytest.raises(gr.Error) as refusal:
        h.check_send(ctx, None, "   ", *CONTROLS)
    assert refusal.value.print_exception is False  # Gradio prints no traceback for it
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dflash-studio: refused: ")


def test_sessions_with_the_same_title_are_told_apart(ctx):
    for _ in range(3):
        h.submit_prompt(ctx, None, "def is_prime(n):", *CONTROLS)
    labels = [label for label, _ in h.session_choices(ctx)]
    assert sorted(labels) == ["def is_prime(n):", "def is_prime(n): (2)", "def is_prime(n): (3)"]


def test_analytics_counts_and_regions_in_words(ctx, engine):
    from ui import analytics as an
    from ui.teach import analytics_summary_html

    engine.enqueue(FakeReply("def add(a, b):\n    return a + b\n", accept=(3, 2, 4)))
    session = h.submit_prompt(ctx, None, "write add()", *CONTROLS)["session"]
    list(h.respond(ctx, session, *CONTROLS))
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
        for i in range(400):  # more than a pipe's buffer
            store.create_session(f"session {i} with a title long enough to fill the pipe quickly")
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
