"""The Teach tab in a real browser: replay a stored reply cycle by cycle with the verdicts of
the stored cycles, compare it with plain decoding (identical for a greedy reply), play, and see
the session analytics. On the FakeEngine, and on a real engine: the embedded tiny coder when it
is there (else a tiny random pair, which takes the same code path)."""

from __future__ import annotations

import os

import pytest

from tests.fake_engine import FakeReply

from .conftest import ARTIFACTS, VIEWPORT, launch

pytestmark = pytest.mark.e2e

SLOTS = "#teach-slots .ts-slot"


@pytest.fixture
def page(shared_page):
    """The module's page (conftest's shared_page), back on the Chat tab with an empty chat (the
    tests leave it on Teach)."""
    page = shared_page
    page.click("#chat-tab-button")
    page.wait_for_selector("#chat-input textarea:not([disabled])")  # the page has restored its session
    if page.locator("#chat .message").count():
        page.click("#new-session")
        page.wait_for_function("!document.querySelector('#chat .message')")
    return page


def send(page, text: str) -> None:
    page.fill("#chat-input textarea", text)
    page.press("#chat-input textarea", "Enter")


def wait_replies(page, n: int, timeout_ms: int = 30_000) -> None:
    page.wait_for_function(f"document.querySelectorAll('#chat .reply-footer').length >= {n}", timeout=timeout_ms)


def expected_verdicts(cycle: dict) -> list[str]:
    verdicts = ["anchor"] + [slot["verdict"] for slot in cycle["slots"]]
    if cycle["bonus"] is not None and len(cycle["emitted"]) == cycle["accepted"] + 1:
        verdicts.append("bonus")
    return verdicts


def shown_verdicts(page) -> list[str]:
    return page.eval_on_selector_all(SLOTS, "els => els.map(e => e.dataset.verdict)")


def wait_cycle(page, k: int) -> None:
    page.wait_for_selector(f"#teach-slots[data-cycle='{k}']")


CLEAR_OF_CARET = """(selector) => {
    const root = document.querySelector(selector), input = root.querySelector('input');
    const caret = root.querySelector('.icon-wrap');
    const style = getComputedStyle(input);
    const textEnd = input.getBoundingClientRect().right - parseFloat(style.paddingRight);
    return !!caret && textEnd <= caret.getBoundingClientRect().left + 1 && style.textOverflow === 'ellipsis';
}"""


def open_teach(page) -> None:
    page.click("#teach-button")
    page.wait_for_selector("#teach-slots")


def check_replay(page, store, message_id: int, limit: int = 6) -> int:
    """Step with Next through the first cycles (and back with Prev), checking every slot."""
    cycles = store.get_cycles(message_id)
    assert cycles, "the reply should have stored cycles"
    wait_cycle(page, 1)
    for k, cycle in enumerate(cycles[:limit], start=1):
        wait_cycle(page, k)
        assert shown_verdicts(page) == expected_verdicts(cycle), f"cycle {k}"
        texts = page.eval_on_selector_all(f"{SLOTS}[data-verdict='accepted'] .ts-tok", "els => els.length")
        assert texts == sum(1 for s in cycle["slots"] if s["verdict"] == "accepted")
        if k < min(limit, len(cycles)):
            page.click("#teach-next")
    if len(cycles) > 1:
        last = min(limit, len(cycles))
        page.click("#teach-prev")
        wait_cycle(page, last - 1)
        assert shown_verdicts(page) == expected_verdicts(cycles[last - 2])
    return len(cycles)


def test_a_stored_reply_replays_cycle_by_cycle_and_compares_identical(page, fake_app):
    studio, engine, _ = fake_app
    engine.enqueue(FakeReply(accept=(3, 0, 7, 2, 5), fallback_at={4: (4, "reduced", "τ 2.5 over 4 cycles; block 8 → 4")}))
    send(page, "Write a Fibonacci function")
    wait_replies(page, 1)
    open_teach(page)
    session_id = studio.store.list_sessions(limit=1)[0]["id"]
    reply = studio.store.get_messages(session_id)[-1]
    n = check_replay(page, studio.store, reply["id"])
    assert page.locator("#teach-cycle").inner_text().count(f"of {n}") == 1
    for picker in ("#teach-session", "#teach-reply"):  # long choices end before the caret, with an ellipsis
        assert page.evaluate(CLEAR_OF_CARET, picker), picker
    # every piece of a step is there
    for part in ("#teach-caption", "#teach-context .tt-anchor", "#teach-block .tb-cell[data-role='mask']",
                 "#teach-heatmap table", "#teach-text", "#teach-cache", "#teach-numbers"):
        assert page.locator(part).count() >= 1, part
    assert "new context feature" in page.locator("#teach-cache").inner_text()
    assert f"DFlash used {n}" in page.locator("#teach-numbers").inner_text()
    # the comparison with plain decoding (the FakeEngine's plain run gives the same text)
    page.click("#compare")
    page.wait_for_selector("#compare-result [data-identical]", timeout=30_000)
    result = page.locator("#compare-result").inner_text()
    assert "identical" in result and "×" in result and "different" not in result
    page.wait_for_selector("#compare-chart .js-plotly-plot")
    assert engine.calls[-2]["sampling"].block_size == 1  # the plain run
    # Play moves on by itself
    page.click("#teach-play")
    page.wait_for_function("Number(document.querySelector('#teach-slots').dataset.cycle) >= 3", timeout=20_000)
    page.click("#teach-play")  # pause: the button says Play again and the cycle stays put
    page.wait_for_function("document.querySelector('#teach-play').innerText.includes('Play')")
    paused_at = page.get_attribute("#teach-slots", "data-cycle")
    for _ in range(3):  # a tick already on its way may still land (late on a loaded machine): let it settle
        page.wait_for_timeout(1000)
        now = page.get_attribute("#teach-slots", "data-cycle")
        if now == paused_at:
            break
        paused_at = now
    page.wait_for_timeout(2000)
    assert page.get_attribute("#teach-slots", "data-cycle") == paused_at
    # session analytics: one reply in the table, charts drawn, export gives CSV + PNGs
    page.wait_for_selector("#analytics-tau-hist .js-plotly-plot")
    assert page.locator("#analytics-table tbody tr").count() >= 1
    page.click("#analytics-export")
    # the PNGs come from kaleido driving Chromium: seconds on an idle machine, more on a loaded one
    page.wait_for_selector("#analytics-files a, #analytics-files .file-preview", timeout=120_000)
    names = page.locator("#analytics-files").inner_text()
    assert ".csv" in names and ".png" in names
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "teach-tab.png"), full_page=True)


def test_the_replay_follows_the_newest_reply_and_escapes_model_text(page, fake_app):
    studio, engine, _ = fake_app
    engine.enqueue(FakeReply('<img src=x onerror="window.hacked=1"> <b>bold</b> done.\n', accept=(2, 1), fallback_at={}))
    send(page, "something else")
    wait_replies(page, 1)
    open_teach(page)
    session_id = studio.store.list_sessions(limit=1)[0]["id"]
    reply = studio.store.get_messages(session_id)[-1]
    check_replay(page, studio.store, reply["id"], limit=3)
    assert page.locator("#teach-step img, #teach-step b").count() == 0
    assert "<img" in page.locator("#teach-text").inner_text() or "onerror" in page.locator("#teach-step").inner_text()
    assert page.evaluate("window.hacked === undefined")


def test_the_tab_opens_on_the_session_the_chat_shows(page, fake_app):
    studio, engine, _ = fake_app
    first = studio.store.list_sessions(limit=1)[0]
    page.click("#new-session")
    send(page, "A brand new session")
    wait_replies(page, 1)
    newest = studio.store.list_sessions(limit=1)[0]
    assert newest["id"] != first["id"]
    page.click(f"#session-list label:has-text('{first['title'][:20]}')")  # back to the older session in the chat
    page.wait_for_function("!document.querySelector('#chat').innerText.includes('A brand new session')")
    open_teach(page)
    reply = studio.store.get_messages(first["id"])[-1]
    wait_cycle(page, 1)
    assert first["title"][:20] in page.locator("#teach-session input").input_value()
    assert shown_verdicts(page) == expected_verdicts(studio.store.get_cycles(reply["id"])[0])
    page.click("#teach-refresh")  # "Latest": the most recently updated session
    page.wait_for_function("document.querySelector('#teach-session input').value.includes('A brand new')")


def test_after_complete_the_teach_tab_shows_no_panel_of_another_tab(page, fake_app):
    """The reply figures under the tabs belong to Chat and Complete: Teach draws its own reply,
    so Complete's (empty) panel must not sit under it; back on Chat they show again."""
    page.click("#complete-tab-button")
    page.wait_for_selector("#token-view", state="visible")
    page.click("#teach-button")  # the tab itself: a page with no reply yet draws no slots
    page.wait_for_selector("#teach", state="visible")
    page.wait_for_selector("#reply-figures", state="hidden")
    assert not page.is_visible("#token-view") and not page.is_visible("#stats")
    page.click("#complete-tab-button")
    page.wait_for_selector("#token-view", state="visible")
    page.click("#chat-tab-button")
    page.wait_for_selector("#stats", state="visible")


# ---------------------------------------------------------------------------- a real engine


@pytest.fixture(scope="module")
def real_app(tmp_path_factory):
    """The app on the embedded tiny coder when it is present, else on a tiny random pair."""
    from app.config import AppConfig
    from app.wiring import build_studio
    from engine.config import EngineConfig
    from engine.loading import embedded_pair
    from storage import SessionStore

    root = tmp_path_factory.mktemp("real")
    target, draft = embedded_pair()
    if target.is_dir() and draft.is_dir() and not os.environ.get("DFLASH_TEACH_TINY_PAIR"):
        engine_config, label = EngineConfig(device="cpu"), "embedded"
    else:
        from tests.tiny_models import save_tiny_pair

        target_dir, draft_dir, *_ = save_tiny_pair(root / "pair", block_size=4)
        engine_config, label = EngineConfig(target=str(target_dir), draft=str(draft_dir), device="cpu"), "tiny random"
    config = AppConfig(engine=engine_config, open_browser=False, max_new_tokens=24, flush_interval_s=0.2, fallback=False)
    studio = build_studio(config, store=SessionStore(root / "sessions.db"))
    studio.host.start().result(timeout=120)
    url = launch(studio)
    yield studio, url, label
    studio.close()


@pytest.mark.slow
def test_on_a_real_engine_the_replay_matches_the_stored_cycles_and_greedy_is_identical(browser, real_app):
    studio, url, label = real_app
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(30_000)
    try:
        page.goto(url)
        page.wait_for_selector("#chat-input textarea:not([disabled])")
        send(page, "def fibonacci(n):")
        wait_replies(page, 1, timeout_ms=60_000)
        open_teach(page)
        session_id = studio.store.list_sessions(limit=1)[0]["id"]
        reply = studio.store.get_messages(session_id)[-1]
        assert reply["settings"]["temperature"] == 0.0
        check_replay(page, studio.store, reply["id"], limit=5)
        page.click("#compare")
        page.wait_for_selector("#compare-result [data-identical]", timeout=60_000)
        result = page.locator("#compare-result").inner_text()
        assert "identical" in result and "different" not in result, f"{label}: {result}"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"teach-{label.replace(' ', '-')}.png"), full_page=True)
    finally:
        context.close()
