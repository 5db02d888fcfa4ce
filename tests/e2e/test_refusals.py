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



def send_while_the_check_is_held(page, text: str, typed_meanwhile: str) -> None:
    """Send ``text``, hold the check's request until the box holds ``typed_meanwhile``, then let
    it go: a certain race between the check and the send it chains (two events)."""
    held = []

    def hold_the_first_event(route):
        # only the check's own request carries the text: a timer's tick (the model header is
        # redrawn every second) must not be the one held
        if held or text not in (route.request.post_data or ""):
            route.continue_()
        else:
            held.append(route)

    page.route("**/gradio_api/queue/join*", hold_the_first_event)
    try:
        send(page, text)
        for _ in range(200):
            if held:
                break
            page.wait_for_timeout(50)
        assert held, "the check's request never left the page"
        page.fill("#chat-input textarea", typed_meanwhile)
        held[0].continue_()
        page.wait_for_function(f"document.querySelector('#chat').innerText.includes({text!r})")
    finally:
        page.unroute("**/gradio_api/queue/join*")


def test_text_typed_while_a_message_is_checked_is_neither_sent_instead_nor_lost(page, fake_app):
    """Enter runs the checks, then the send as a second event. The box may change in between (a
    script, a fast typist, a slow server): the checked message is what is sent, what was typed
    since stays in the box, and nothing shows an Error badge."""
    studio = fake_app[0]
    send_while_the_check_is_held(page, "first question", "a second thought, still being typed")
    wait_replies(page, 1)
    page.wait_for_timeout(500)  # anything the send would still change has arrived
    session_id = studio.store.list_sessions()[0]["id"]
    assert [m["content"] for m in studio.store.get_messages(session_id)][:1] == ["first question"]
    assert page.locator("#chat-input textarea").input_value() == "a second thought, still being typed"

    # the box emptied in between (the check would refuse that): the checked message is still sent
    send_while_the_check_is_held(page, "second question", "")
    wait_replies(page, 2)
    page.wait_for_timeout(500)
    users = [m["content"] for m in studio.store.get_messages(session_id) if m["role"] == "user"]
    assert users == ["first question", "second question"]
    for selector in WATCHED:
        assert "Error" not in page.locator(selector).inner_text(), selector
    assert not [t for t in toast_texts(page) if "empty" in t]
