"""Gradio fires the first tab's select while a page loads. However late that answer comes, it
must not blank the figures of the session the reload restored."""

from __future__ import annotations

import time

import pytest

import ui.chat.handlers as h
from tests.fake_engine import FakeEngine, fake_studio

from .conftest import launch, opened_page
from .test_browser import TOKENS, send, wait_replies

pytestmark = pytest.mark.e2e
LATE_S = 1.5  # how late the load-time tab select answers: well after the page's own load


@pytest.fixture(scope="module")
def late_tab_select_app(tmp_path_factory):
    original = h.tab_figures

    def late(*args, **kwargs):
        time.sleep(LATE_S)
        return original(*args, **kwargs)

    h.tab_figures = late  # read once, when the page's events are wired
    try:
        studio = fake_studio(FakeEngine(delay_s=0.01), db_path=tmp_path_factory.mktemp("race") / "sessions.db")
    finally:
        h.tab_figures = original
    studio.host.start().result(timeout=10)
    url = launch(studio)
    yield studio, url
    studio.close()


def test_a_reloaded_session_keeps_its_token_view_when_the_first_tab_select_answers_late(browser, late_tab_select_app):
    _, url = late_tab_select_app
    with opened_page(browser, url) as page:
        send(page, "a question")
        wait_replies(page, 1)
        page.reload()
        page.wait_for_selector("#chat-input textarea:not([disabled])")
        page.wait_for_function("document.querySelector('#chat').innerText.includes('a question')")
        page.wait_for_function(f"document.querySelectorAll('{TOKENS}').length > 0")
        page.wait_for_timeout(LATE_S * 1000 + 1500)  # the late answer has come by now
        assert page.locator(TOKENS).count() > 0
        page.click("#complete-tab-button")  # a tab picked by the user still draws its own figures
        page.wait_for_function(f"document.querySelectorAll('{TOKENS}').length == 0", timeout=LATE_S * 1000 + 10_000)
