"""Which session a fresh page opens (no session remembered by this browser): the latest one made
on the page, never a session an editor made through the API (its client's max_tokens and
temperature would become the page's settings for the next Send)."""

from __future__ import annotations

import pytest

from tests.fake_engine import FakeEngine, fake_studio
from ui import handlers as h

CONTROLS = (8, 0.0, 1.0, 256, True, False)  # block size, temperature, top-p, max new tokens, fallback, show rejected
API_SETTINGS = {"source": "api", "endpoint": "completions", "model": "tiny-coder", "block_size": 8,
                "temperature": 1.2, "top_p": 1.0, "max_new_tokens": 64, "fallback": True,
                "client": {"model": "tiny-coder", "max_tokens": 64, "temperature": 1.2}}


@pytest.fixture
def ctx():
    ctx = fake_studio(FakeEngine(), ui=False)
    ctx.engines.start().result(timeout=10)
    yield ctx
    ctx.engines.shutdown()
    ctx.store.close()


def controls_of(view: dict) -> tuple:
    return tuple(view[key] for key in h.SETTING_KEYS)


def test_a_fresh_page_with_only_api_sessions_opens_a_new_session_with_the_defaults(ctx):
    defaults = controls_of(h.on_load(ctx, None))
    api = ctx.store.create_session("API · completions", model="tiny-coder", settings=API_SETTINGS)
    view = h.on_load(ctx, None)
    assert view["session"] is None and controls_of(view) == defaults
    assert controls_of(h.select_session(ctx, api))[1:4] == (1.2, 1.0, 64)  # still one click away, as it was


def test_a_fresh_page_opens_the_latest_page_session_not_a_newer_api_one(ctx):
    mine = h.submit_prompt(ctx, None, "write add()", *CONTROLS)["session"]
    list(h.respond(ctx, mine, *CONTROLS))
    ctx.store.create_session("API · completions", model="tiny-coder", settings=API_SETTINGS)
    view = h.on_load(ctx, None)
    assert view["session"] == mine and controls_of(view)[1:4] == (0.0, 1.0, 256)
    assert h.on_load(ctx, mine)["session"] == mine
