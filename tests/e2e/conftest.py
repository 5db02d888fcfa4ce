"""Playwright in Debian's Chromium (Playwright's own browser download needs the network, which the tests do not use)
against the app served on 127.0.0.1 with a FakeEngine (fast, scripted) or the embedded model."""

from __future__ import annotations

import os
import shutil
import socket
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.needs import missing

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

CHROMIUM = os.environ.get("DFLASH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
VIEWPORT = {"width": 1500, "height": 1000}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def opened_page(browser, url: str, timeout_ms: int = 20_000):
    """A page of its own (a new browser context), loaded and ready for input; closed after, pass or fail."""
    context = browser.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.set_default_timeout(timeout_ms)
        page.goto(url)
        page.wait_for_selector("#chat-input textarea:not([disabled])")
        yield page
    finally:
        context.close()


def launch(studio) -> str:
    studio.demo.launch(**studio.launch_kwargs(server_port=free_port(), prevent_thread_lock=True, quiet=True,
                                              inbrowser=False))
    return studio.demo.local_url


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright import sync_api
    except ImportError:
        missing("the playwright package is not installed (pip install -e '.[test]')")
    if not Path(CHROMIUM).exists():
        missing(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def fake_app(tmp_path_factory):
    """The app on a FakeEngine whose cycles take 30 ms, with a database in a temporary folder."""
    from tests.fake_engine import FakeEngine, fake_studio

    engine = FakeEngine(delay_s=0.03)
    studio = fake_studio(engine, db_path=tmp_path_factory.mktemp("e2e") / "sessions.db")
    studio.host.start().result(timeout=10)
    url = launch(studio)
    yield studio, engine, url
    studio.close()


@pytest.fixture(scope="module")
def shared_page(browser, fake_app):
    """One loaded page per module (loading Gradio's frontend costs seconds on a busy CPU)."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(fake_app[2])
    yield page
    context.close()


@pytest.fixture
def page(shared_page):
    """The module's page, back on an empty Chat tab with rejected drafts shown."""
    page = shared_page
    page.click("#chat-tab-button")
    page.wait_for_selector("#chat-input textarea:not([disabled])")  # the page has restored its session
    if page.locator("#chat .message").count():  # each test starts on an empty chat
        page.click("#new-session")
        page.wait_for_function("!document.querySelector('#chat .message')")
    if not page.locator("#show-rejected input").is_checked():  # after New session, which shows the defaults
        page.click("#show-rejected input")
    page.fill("#chat-input textarea", "")
    yield page
