"""A Qwen3-family model with its published template in the page: with thinking on, the reasoning
streams into its own collapsible block above the answer, its tokens coloured by origin and never
lexed as code; with thinking off (the control, stored with the session) the template closes an
empty think block and the reply has no reasoning block. The engine renders prompts with the
published template and replies with scripted token streams (tests/chat_twins.py)."""

from __future__ import annotations

import pytest

from tests.chat_twins import ScriptedChatEngine

from .conftest import launch, opened_page
from .test_browser import send, wait_replies

pytestmark = pytest.mark.e2e

REPLY = ("<think>\nThe user wants a function. Let me plan it.\n</think>\n\n```python\ndef add(a, b):\n"
         "    return a + b\n```\n<|im_end|>")


@pytest.fixture(scope="module")
def qwen_app(tmp_path_factory):
    from tests.fake_engine import fake_studio

    engine = ScriptedChatEngine("qwen3", name="qwen3-twin", delay_s=0.05)
    studio = fake_studio(engine, db_path=tmp_path_factory.mktemp("e2e") / "sessions.db")
    studio.host.start().result(timeout=10)
    url = launch(studio)
    yield studio, engine, url
    studio.close()


def test_thinking_on_then_off_in_the_page(browser, qwen_app):
    studio, engine, url = qwen_app
    with opened_page(browser, url) as page:
        toggle = page.locator("#thinking input[type=checkbox]")
        page.wait_for_function("() => { const box = document.querySelector('#thinking input[type=checkbox]');"
                               " return box && !box.disabled && box.checked; }")  # Qwen3's default: on
        engine.enqueue(REPLY)
        send(page, "Write add in Python.")
        wait_replies(page, 1)
        assert engine.prompts[-1].endswith("<|im_start|>assistant\n")
        block = page.locator("#token-view details.tv-reasoning")
        assert block.count() == 1
        thought = block.locator(".tok[data-part='reasoning']")
        assert "Let me plan it." in block.inner_text()
        origins = {thought.nth(i).get_attribute("data-origin") for i in range(thought.count())}
        assert {"accepted", "bonus"} <= origins  # coloured by origin like every token
        assert block.locator(".tok span[class]").count() == 0  # no syntax colours in the reasoning
        answer = page.locator("#token-view .tv-body > .tv-block .tok:not([data-part])")
        assert "def add" in "".join(answer.all_inner_texts())
        assert page.locator("#token-view .tv-body > .tv-block span.k").count() > 0  # the code is coloured
        chat_block = page.locator("#chat details.chat-reasoning")
        assert chat_block.count() == 1 and "Let me plan it." in chat_block.text_content()  # collapsed once answered
        code = page.locator("#chat pre").last.inner_text()
        assert "def add" in code and "plan" not in code  # the reasoning never enters the code block
        assert "reasoning" in page.locator("#stats [data-stat='reasoning-split']").inner_text()

        toggle.uncheck()
        page.wait_for_timeout(300)
        engine.enqueue("```python\ndef add(a, b):\n    return a + b\n```\n<|im_end|>")
        send(page, "Again, without thinking.")
        wait_replies(page, 2)
        assert engine.prompts[-1].endswith("<think>\n\n</think>\n\n")  # the template's "off"
        assert page.locator("#token-view details.tv-reasoning").count() == 0
        session = studio.store.list_sessions(limit=1)[0]
        assert studio.store.get_session(session["id"])["settings"]["thinking"] is False
