"""What the page says is true, in Chromium: a new session starts from the defaults (an API request
does not change them), rejected drafts are on demand, the Complete tab's example is a placeholder
and each tab shows its own figures, fallback labels keep apart, Compare's chart keeps its lines."""

from __future__ import annotations

import openai
import pytest

from tests.fake_engine import FakeReply

from .conftest import ARTIFACTS, opened_page
from .test_browser import send, wait_replies
from .test_teach import open_teach

pytestmark = pytest.mark.e2e
TOKENS = "#token-view .tok"


@pytest.fixture
def fresh_page(browser, fake_app):
    """A page of its own, as a new visitor sees it (the module fixture ticks show-rejected)."""
    with opened_page(browser, fake_app[2]) as page:
        page.click("#new-session")  # not the last test's session
        page.wait_for_function("!document.querySelector('#chat .message')")
        yield page


def slider_value(page, elem_id: str) -> float:
    return float(page.locator(f"#{elem_id} input[type='number']").input_value())


def test_a_new_session_starts_from_the_defaults_whatever_the_api_or_the_last_session_did(fresh_page, fake_app):
    page, (studio, engine, url) = fresh_page, fake_app
    default_tokens = slider_value(page, "max-new-tokens")
    assert "New sessions start with" in page.locator("#defaults-note").inner_text()
    client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="none", max_retries=0)
    client.completions.create(model="fake-coder", prompt="def add(a, b):", max_tokens=64, temperature=1.2)
    page.reload()
    page.wait_for_selector("#chat-input textarea:not([disabled])")
    # the API session is listed but not opened by itself: with no session made on the page, a new one
    page.wait_for_function(f"document.querySelector('#max-new-tokens input[type=number]').value == '{default_tokens:g}'")
    assert "API" not in page.locator("#session-title textarea, #session-title input").first.input_value()
    page.locator("#session-list label", has_text="API · completions").first.click()
    page.wait_for_function("document.querySelector('#max-new-tokens input[type=number]').value == '64'")  # its own
    page.click("#new-session")
    page.wait_for_function(f"document.querySelector('#max-new-tokens input[type=number]').value == '{default_tokens:g}'")
    assert slider_value(page, "temperature") == 0.0
    # Save as defaults: what new sessions start from from now on, until Reset
    page.fill("#max-new-tokens input[type='number']", "300")
    page.press("#max-new-tokens input[type='number']", "Enter")
    page.click("#save-defaults")
    page.wait_for_function("document.querySelector('#defaults-note').innerText.includes('300 new tokens')")
    assert studio.store.get_preference("new_session_settings")["max_new_tokens"] == 300
    send(page, "a session at 300")
    wait_replies(page, 1)
    page.fill("#max-new-tokens input[type='number']", "100")
    page.press("#max-new-tokens input[type='number']", "Enter")
    page.click("#new-session")
    page.wait_for_function("document.querySelector('#max-new-tokens input[type=number]').value == '300'")
    page.click("#reset-defaults")
    page.wait_for_function(f"document.querySelector('#max-new-tokens input[type=number]').value == '{default_tokens:g}'")
    assert studio.store.get_preference("new_session_settings") is None


def test_rejected_drafts_are_hidden_until_asked_for_and_then_stay_off_the_line(fresh_page, fake_app):
    page = fresh_page
    assert not page.locator("#show-rejected input").is_checked()
    send(page, "hidden drafts please")
    wait_replies(page, 1)
    rejected = page.locator(f"{TOKENS}[data-origin='rejected']")
    assert rejected.count() > 0 and not rejected.first.is_visible()
    text = page.evaluate("""() => { const body = document.querySelector('#token-view .tv-body');
        const marks = Array.from(body.querySelectorAll('.tv-fallback'));  // fallback markers sit above the line
        marks.forEach(m => { m.style.display = 'none'; });
        const text = body.innerText; marks.forEach(m => { m.style.display = ''; }); return text; }""")
    reply = fake_app[0].store.get_messages(fake_app[0].store.list_sessions(limit=1)[0]["id"])[-1]["content"]
    assert text == reply  # the code reads exactly as the target wrote it
    page.click("#show-rejected input")
    rejected.first.wait_for(state="visible")
    style = rejected.first.evaluate("el => [getComputedStyle(el).verticalAlign, parseFloat(getComputedStyle(el).fontSize)]")
    accepted_size = page.locator(f"{TOKENS}[data-origin='accepted']").first.evaluate(
        "el => parseFloat(getComputedStyle(el).fontSize)")
    assert style[0] == "super" and style[1] < accepted_size


def test_the_complete_tab_has_a_placeholder_and_its_own_figures(fresh_page, fake_app):
    page = fresh_page
    send(page, "a chat reply first")
    wait_replies(page, 1)
    assert page.locator(TOKENS).count() > 0
    page.click("#complete-tab-button")
    page.wait_for_function(f"document.querySelectorAll('{TOKENS}').length == 0")  # not the chat reply's tokens
    tokens = page.locator("#stats [data-stat='tokens'] .stat-value")
    for _ in range(40):  # the strip follows the tab: no tokens before a first completion
        if tokens.inner_text() == "0":
            break
        page.wait_for_timeout(250)
    assert tokens.inner_text() == "0"
    editor = page.locator("#code-editor .cm-content")
    assert editor.inner_text().strip() == ""  # the example is not text in the editor…
    placeholder = editor.evaluate("el => getComputedStyle(el, '::before').content")
    assert "def is_prime" in placeholder  # …but a placeholder drawn over it
    editor.click()
    page.keyboard.type("def merge_sorted(a, b):")
    page.wait_for_function("document.querySelector('#code-editor .cm-content').innerText.includes('merge_sorted')")
    assert editor.inner_text().strip() == "def merge_sorted(a, b):"
    assert editor.evaluate("el => getComputedStyle(el, '::before').content") in ("none", "normal")
    page.click("#complete")
    page.wait_for_function(f"document.querySelectorAll('{TOKENS}').length > 0")  # the completion's own tokens
    store = fake_app[0].store
    session = store.list_sessions(limit=1)[0]
    assert store.get_messages(session["id"])[-2]["content"] == "def merge_sorted(a, b):"  # only what was typed
    page.click("#chat-tab-button")  # back on Chat: the chat reply's figures again
    page.wait_for_function(f"document.querySelectorAll('{TOKENS}').length > 0")


OVERLAPS = """(sel) => {
  const boxes = Array.from(document.querySelectorAll(sel + ' .annotation')).map(a => a.getBoundingClientRect());
  let n = 0;
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i], b = boxes[j];
    if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom) n++;
  }
  return [boxes.length, n];
}"""


def test_fallback_labels_on_the_cycle_chart_never_overlap(page, fake_app):
    studio, engine, _ = fake_app
    changes = {i: (4 if i % 2 else 8, "reduced" if i % 2 else "full", f"change {i}") for i in range(2, 90, 3)}
    engine.enqueue(FakeReply(" ".join(f"w{i}" for i in range(300)), accept=(1, 2), fallback_at=changes, delay_s=0.0))
    send(page, "a long reply with many fallback changes")
    wait_replies(page, 1, timeout_ms=60_000)
    page.wait_for_selector("#acceptance-chart .annotation")
    labels, overlapping = page.evaluate(OVERLAPS, "#acceptance-chart")
    assert labels >= 2 and overlapping == 0
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#acceptance-chart").screenshot(path=str(ARTIFACTS / "fallback-labels.png"))


INSIDE = """(sel) => {
  const gd = document.querySelector(sel + ' .js-plotly-plot');
  const end = Math.max(...gd.data.flatMap(t => t.x)), top = Math.max(...gd.data.flatMap(t => t.y));
  const box = gd.getBoundingClientRect(), outer = document.querySelector(sel).getBoundingClientRect();
  // the lines end inside the plot, clear of its right and top edges, and the plot inside its box
  return [gd._fullLayout.xaxis.range[1] >= end * 1.02, gd._fullLayout.yaxis.range[1] >= top * 1.02,
          box.right <= outer.right + 1];
}"""


def test_the_compare_chart_keeps_its_lines_inside(page, fake_app):
    studio, engine, _ = fake_app
    for text in ("short one", " ".join(f"w{i}" for i in range(120))):
        engine.enqueue(FakeReply(text))
        send(page, f"compare {len(text)}")
        wait_replies(page, 1)
        open_teach(page)
        page.click("#teach-refresh")
        page.wait_for_timeout(500)
        page.click("#compare")
        page.wait_for_selector("#compare-result [data-identical]", timeout=30_000)
        page.wait_for_selector("#compare-chart .js-plotly-plot")
        page.wait_for_timeout(500)
        assert page.evaluate(INSIDE, "#compare-chart") == [True, True, True]
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator("#compare-chart").screenshot(path=str(ARTIFACTS / "compare-chart.png"))
        page.click("#chat-tab-button")
        page.click("#new-session")
