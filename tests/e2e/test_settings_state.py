"""The page keeps its six settings as one value in a State: a setting changed just before Send
must be the one the reply is generated and stored with, as when the send read the controls."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.e2e

NUMBER = "#max-new-tokens input[type='number']"


def send_at_once(page, text: str) -> None:
    page.fill("#chat-input textarea", text)
    page.press("#chat-input textarea", "Enter")


def test_a_setting_changed_just_before_send_is_the_one_sent(page, fake_app, monkeypatch):
    studio, engine, _ = fake_app
    send_at_once(page, "a session to save settings into")
    page.wait_for_function("document.querySelectorAll('#chat .reply-footer').length >= 1", timeout=20_000)
    save = studio.store.update_session_settings

    def slow_save(*args, **kwargs):  # the settings event saves them with the session before the State changes:
        time.sleep(0.4)  # a slow disk must not let Send's check read the settings from before
        return save(*args, **kwargs)

    monkeypatch.setattr(studio.store, "update_session_settings", slow_save)
    for n, tokens in enumerate((77, 78, 79), start=2):
        page.fill(NUMBER, str(tokens))
        page.press(NUMBER, "Enter")
        page.click("#fallback-toggle input")  # and a toggle, clicked just as fast
        send_at_once(page, f"sent at {tokens} tokens")  # no wait in between
        page.wait_for_function(f"document.querySelectorAll('#chat .reply-footer').length >= {n}", timeout=20_000)
        call = engine.calls[-1]
        session = studio.store.list_sessions(limit=1)[0]
        asked = [m for m in studio.store.get_messages(session["id"]) if m["role"] == "user"][-1]
        assert asked["content"] == f"sent at {tokens} tokens"
        assert call["sampling"].max_new_tokens == asked["settings"]["max_new_tokens"] == tokens
        checked = page.locator("#fallback-toggle input").is_checked()
        assert call["fallback"].enabled == asked["settings"]["fallback"] == checked
