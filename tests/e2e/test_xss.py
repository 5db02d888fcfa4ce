"""The XSS and exfiltration corpus (tests/xss_corpus.py, >= 300 payloads) in real Chromium, at
every place text reaches the page: what the user types (chat, session titles), what the model
writes (through the FakeEngine: chat and token view), and imported sessions (titles and
messages, rendered from the database). Nothing may run (no dialog, ``window.__xss`` unset) and
the browser may fetch nothing but the app's own origin."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.fake_engine import FakeEngine, FakeReply, fake_studio
from tests.figures import record_figure
from tests.xss_corpus import chunks, corpus

from .conftest import VIEWPORT, launch

pytestmark = pytest.mark.e2e

PAYLOADS = corpus()
PER_MESSAGE = 40


@pytest.fixture(scope="module")
def xss_app(tmp_path_factory):
    engine = FakeEngine(delay_s=0.0, context_window=10**7, default_reply=FakeReply("ok", accept=(7,)))
    studio = fake_studio(engine, db_path=tmp_path_factory.mktemp("xss") / "sessions.db")
    studio.host.start().result(timeout=10)
    url = launch(studio)
    yield studio, engine, url
    studio.close()


class Watch:
    """Dialogs, and every request the page makes to anything but the app itself."""

    def __init__(self, page, origin: str, figure: str):
        self.origin = origin.rstrip("/")
        self.figure = figure
        self.dialogs: list[str] = []
        self.foreign: list[str] = []
        self.places: list[str] = []  # where the page was checked
        self.ran: list[str] = []  # places where a payload's script set window.__xss
        page.on("dialog", self._dialog)
        page.on("request", self._request)

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def _request(self, request) -> None:
        url = request.url
        if not (url.startswith(self.origin + "/") or url == self.origin or url.startswith(("data:", "blob:"))):
            self.foreign.append(url)

    def check(self, page, where: str) -> None:
        """Count, record (the figure so far), then assert: a run cut short still says what it saw."""
        self.places.append(where)
        if page.evaluate("window.__xss") is not None:
            self.ran.append(where)
        record_figure(self.figure, payloads=len(PAYLOADS), places=len(self.places), dialogs=len(self.dialogs),
                      scripts_ran=len(self.ran), foreign_requests=len(self.foreign))
        assert self.dialogs == [], f"{where}: a payload opened a dialog: {self.dialogs[:3]}"
        assert self.ran == [], f"{where}: a payload ran script"
        assert self.foreign == [], f"{where}: the page fetched {self.foreign[:5]}"


def import_document(payloads: list[str]) -> dict:
    """Sessions titled with payloads, and one session whose messages hold them all."""
    now = "2026-12-01T00:00:00+00:00"
    sessions = [{"uuid": uuid.uuid4().hex, "title": " ".join(group), "created_at": now, "updated_at": now,
                 "model": "fake-coder", "settings": {}, "messages": [
                     {"seq": 1, "role": "user", "content": "hi", "status": "complete", "kind": "chat",
                      "created_at": now, "updated_at": now}]}
                for group in chunks(payloads, 4)]
    messages = []
    for i, group in enumerate(chunks(payloads, 20)):
        messages.append({"seq": i + 1, "role": "user" if i % 2 == 0 else "assistant", "content": "\n\n".join(group),
                         "status": "complete", "kind": "chat", "created_at": now, "updated_at": now})
    sessions.append({"uuid": uuid.uuid4().hex, "title": "all payloads", "created_at": now, "updated_at": "2027-01-01T00:00:00+00:00",
                     "model": "fake-coder", "settings": {}, "messages": messages})
    return {"format": "dflash-studio-sessions", "version": 1, "exported_at": now, "sessions": sessions}


def stored_messages(studio, role: str, ended: bool = False) -> list[dict]:
    return [m for s in studio.store.list_sessions() for m in studio.store.get_messages(s["id"])
            if m["role"] == role and not (ended and m["status"] == "streaming")]


def page_state(page) -> str:
    """What a failure message needs to say where a message got stuck: the input box, the toasts."""
    box = page.input_value("#chat-input textarea", timeout=5_000)
    toasts = page.locator(".toast-body").all_inner_texts()
    return f"input box holds {len(box)} chars; toasts: {toasts[:3]}"


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def send_and_wait_reply(page, studio, text: str, n: int) -> None:
    """Send ``text`` as the ``n``-th message and wait until its reply is stored as ended (the
    store, not the page: a cut ``$$`` in a reply may hide its footer).

    On a slow CI machine the fourth reply was once never stored, and the test could not
    tell whether the message had reached the server. Now it waits for the message first: a user
    whose Enter did nothing presses it again; so does this test, once, and only when the server
    provably has not got the message and the text is still in the box. Every failure says where
    it stuck (the input box, the toasts)."""
    page.fill("#chat-input textarea", text)
    page.press("#chat-input textarea", "Enter")
    if not wait_until(lambda: len(stored_messages(studio, "user")) >= n, 30.0):
        state = page_state(page)
        print(f"message {n} did not reach the server within 30 s ({state}); pressing Enter again", flush=True)
        assert page.input_value("#chat-input textarea") == text, f"message {n} was neither sent nor kept: {state}"
        page.press("#chat-input textarea", "Enter")
        assert wait_until(lambda: len(stored_messages(studio, "user")) >= n, 60.0), \
            f"message {n} did not reach the server after a second Enter ({page_state(page)})"
    assert wait_until(lambda: len(stored_messages(studio, "assistant", ended=True)) >= n, 120.0), \
        f"the reply to message {n} did not end within 120 s ({page_state(page)})"


def open_page(browser, url, figure: str):
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(60_000)
    watch = Watch(page, url, figure)
    page.add_init_script("delete window.__xss")
    page.goto(url)
    page.wait_for_selector("#chat-input textarea:not([disabled])")
    return context, page, watch


def test_typed_text_and_model_output_never_run_or_fetch(browser, xss_app):
    studio, engine, url = xss_app
    context, page, watch = open_page(browser, url, "xss_typed")
    try:
        groups = chunks(PAYLOADS, PER_MESSAGE)
        for n, group in enumerate(groups, start=1):
            reply = "\n\n".join(reversed(group))
            engine.enqueue(FakeReply(reply, accept=(7,), fallback_at={}))
            send_and_wait_reply(page, studio, "\n\n".join(group), n)
            page.wait_for_function(f"document.querySelectorAll('#chat .message').length >= {2 * n}")
            time.sleep(0.5)
            watch.check(page, f"message {n}")
        page.click(f"#chat .message-row >> nth={-1}")  # the last reply's tokens in the token view
        time.sleep(1.0)
        assert page.locator("#token-view .tok").count() > 100
        watch.check(page, "token view")
        assert len(PAYLOADS) >= 300 and len(groups) * PER_MESSAGE >= len(PAYLOADS)
    finally:
        context.close()


def test_imported_titles_and_messages_never_run_or_fetch(browser, xss_app, tmp_path):
    studio, _, url = xss_app
    context, page, watch = open_page(browser, url, "xss_imported")
    try:
        path = tmp_path / "hostile.json"
        path.write_text(json.dumps(import_document(PAYLOADS)), encoding="utf-8")
        with page.expect_file_chooser() as chooser:
            page.click("#import-session")
        chooser.value.set_files(str(path))
        page.wait_for_function("document.querySelector('#session-list').innerText.includes('all payloads')",
                               timeout=60_000)
        time.sleep(1.0)
        watch.check(page, "imported titles in the session list")
        page.get_by_text("all payloads", exact=True).click()
        page.wait_for_function("document.querySelectorAll('#chat .message').length >= 10", timeout=60_000)
        time.sleep(1.0)
        watch.check(page, "imported messages in the chat")
        page.reload()  # the history again, from the database, in a fresh page
        page.wait_for_selector("#chat-input textarea:not([disabled])")
        time.sleep(1.0)
        watch.check(page, "the reloaded page")
    finally:
        context.close()
