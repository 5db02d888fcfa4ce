"""A refused request leaves the page exactly as it was, with one clear message (no red Error
badges, the sessions list stays), in real Chromium."""

from __future__ import annotations

import re

import pytest

from engine.errors import EMPTY_PROMPT

from .test_browser import send, wait_replies

pytestmark = pytest.mark.e2e

WATCHED = ("#chat", "#session-list", "#session-title", "#chat-input", "#token-view")


# a lagging event's queue position or timer, not a change
PROGRESS = re.compile(r"^(processing \|.*|queue: \d+/\d+ \|.*|[\d.]+s|[\d.]+/[\d.]+s)$", re.M)


def snapshot(page) -> dict:
    return {selector: PROGRESS.sub("", page.locator(selector).inner_text()).strip() for selector in WATCHED} | {
        "input": page.locator("#chat-input textarea").input_value()}


def toast_texts(page) -> list[str]:
    return [t.strip() for t in page.locator(".toast-body").all_inner_texts()]


def refused(page, text: str, expected: str) -> None:
    before = snapshot(page)
    for close in page.locator(".toast-body .toast-close").all():
        close.click()
    page.fill("#chat-input textarea", text)
    before["input"] = text
    page.click("#send")
    page.wait_for_function(f"[...document.querySelectorAll('.toast-body')].some(t => t.innerText.includes({expected!r}))",
                           timeout=20_000)
    page.wait_for_timeout(800)  # anything the refusal would change has arrived by now
    after = snapshot(page)
    for selector in WATCHED:
        assert "Error" not in after[selector].replace(before[selector], ""), (selector, after[selector][:200])
    assert after == before
    assert len([t for t in toast_texts(page) if expected in t]) == 1


def test_an_empty_or_over_long_message_leaves_the_page_as_it_was(page, fake_app):
    send(page, "write a function")
    wait_replies(page, 1)
    assert page.locator("#session-list label").count() >= 1
    refused(page, "", EMPTY_PROMPT[:1].upper() + EMPTY_PROMPT[1:])
    refused(page, "   \n  ", EMPTY_PROMPT[:1].upper() + EMPTY_PROMPT[1:])
    refused(page, "word " * 5000, "context window")
    assert page.locator("#session-list label").count() >= 1  # the list never disappeared
    send(page, "and now a valid one")
    wait_replies(page, 2)
