"""An editor's API request seen in the Studio, in Chromium: the session appears in the sessions
panel by itself, and shown while it streams its tokens arrive coloured, with the charts; teach
mode replays it afterwards."""

from __future__ import annotations

import threading

import openai
import pytest

from tests.fake_engine import FakeReply

from .test_teach import check_replay, open_teach

pytestmark = pytest.mark.e2e
TOKENS = "#token-view .tok"


def test_an_api_request_appears_live_with_colours_charts_and_replay(page, fake_app):
    studio, engine, url = fake_app
    engine.enqueue(FakeReply(delay_s=0.25))  # ~7 s of cycles: time to see it stream in the page
    client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="none", max_retries=0)
    result = {}

    def editor():
        stream = client.chat.completions.create(model="fake-coder", stream=True,
                                                messages=[{"role": "user", "content": "live from the editor"}])
        result["text"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    thread = threading.Thread(target=editor)
    thread.start()
    label = page.locator("#session-list label", has_text="API · live from the editor")
    label.wait_for(timeout=15_000)  # no reload: the panel refreshes itself
    label.click()
    page.evaluate("""() => { window.__counts = new Set();
        window.__sampler = setInterval(() => window.__counts.add(
            document.querySelectorAll('#token-view .tok').length), 50); }""")
    thread.join(timeout=60)
    page.wait_for_function("document.querySelectorAll('#chat .reply-footer').length >= 1", timeout=20_000)
    seen = page.evaluate("() => { clearInterval(window.__sampler); return Array.from(window.__counts); }")
    assert result["text"] and "live from the editor" in page.locator("#chat").inner_text()
    assert len([n for n in seen if n > 0]) >= 2, f"the token view should grow while the API reply streams ({seen})"
    for origin in ("accepted", "bonus", "rejected"):
        assert page.locator(f"{TOKENS}[data-origin='{origin}']").count() > 0
    page.wait_for_selector("#acceptance-chart .js-plotly-plot")
    session = studio.store.list_sessions(limit=1)[0]
    reply = studio.store.get_messages(session["id"])[-1]
    assert reply["content"] == result["text"]
    open_teach(page)
    check_replay(page, studio.store, reply["id"], limit=3)
