"""The shared replay in real Chromium, opened from file:// with every request that is not the file
itself blocked (and counted): the contract (root attributes, token origins, ArrowRight, End's
final text), the keyboard, Play, the theme, the race against plain decoding, and the XSS corpus
as message text, session title and model name: nothing runs, nothing is fetched.

Playwright's ``wait_for_function`` evaluates a string in the page, which the page's own
Content-Security-Policy forbids: the waits here read attributes through locators instead."""

from __future__ import annotations

import pytest

from storage import SessionStore
from tests.fake_engine import DEFAULT_TEXT
from tests.share_helpers import store_fake_reply
from tests.xss_corpus import chunks, corpus
from ui.share.replay import load_share
from ui.share.page import replay_html

from .conftest import VIEWPORT

pytestmark = pytest.mark.e2e

KEPT = "[...document.querySelectorAll('#rp-text [data-origin]')].filter(e => e.dataset.origin !== 'rejected')" \
       ".map(e => e.textContent).join('')"


class Offline:
    """A page whose every request but file:// ones is aborted; dialogs and aborted URLs are kept."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport=VIEWPORT)
        self.blocked: list[str] = []
        self.dialogs: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.set_default_timeout(15_000)
        self.page.on("request", self._request)
        self.page.on("dialog", self._dialog)

    def _route(self, route) -> None:
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort()

    def _request(self, request) -> None:
        if not request.url.startswith("file://") and request.url not in self.blocked:
            self.blocked.append(request.url)

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def open(self, path) -> None:
        self.page.goto(path.as_uri())
        self.page.locator("#replay[data-cycle='0']").wait_for(state="attached")

    def close(self) -> None:
        self.context.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A stored FakeEngine reply with Compare's result, shared as a page."""
    folder = tmp_path_factory.mktemp("share")
    with SessionStore(folder / "sessions.db") as store:
        session_id, reply_id = store_fake_reply(store)
        cycles = len(store.get_cycles(reply_id))
        content = store.get_message(reply_id)["content"]
        plain = store.get_comparison(reply_id)["plain"]["text"]
        path = folder / "replay.html"
        path.write_text(replay_html(load_share(store, session_id)), encoding="utf-8")
    return path, cycles, content, plain


@pytest.fixture
def offline(browser):
    offline = Offline(browser)
    yield offline
    offline.close()


def root(page, name: str) -> str:
    return page.get_attribute("#replay", name)


def test_contract_keyboard_and_final_frame_from_file_with_the_network_blocked(offline, shared):
    path, cycles, content, _ = shared
    offline.open(path)
    page = offline.page
    assert root(page, "data-dflash-replay") is not None and root(page, "data-cycles") == str(cycles)
    for k in range(1, 4):  # ArrowRight: one cycle each
        page.keyboard.press("ArrowRight")
        assert root(page, "data-cycle") == str(k)
        assert page.locator(f"#rp-text [data-cycle='{k}']").count() > 0
        assert page.locator(f"#rp-text [data-cycle='{k + 1}']").count() == 0  # later cycles are not shown yet
    page.keyboard.press("ArrowLeft")
    assert root(page, "data-cycle") == "2"
    page.keyboard.press("End")
    assert root(page, "data-cycle") == str(cycles)
    origins = page.evaluate("[...document.querySelectorAll('[data-origin]')].map(e => e.dataset.origin)")
    assert set(origins) == {"accepted", "bonus", "rejected"}
    assert page.evaluate(KEPT) == content == DEFAULT_TEXT
    assert page.locator(f"#rp-text [data-origin='rejected']:not([data-cycle='{cycles}'])").count() == 0
    assert page.locator(f"#rp-text [data-origin='rejected'][data-cycle='{cycles}']").count() > 0  # its own stay
    page.check("#rp-show-rejected")  # the box brings them back, struck through
    assert page.locator(f"#rp-text [data-origin='rejected']:not([data-cycle='{cycles}'])").count() > 0
    assert page.evaluate("getComputedStyle(document.querySelector('#rp-text [data-origin=rejected]'))"
                         ".textDecorationLine") == "line-through"
    page.uncheck("#rp-show-rejected")
    assert page.evaluate("getComputedStyle(document.querySelector('#rp-text [data-origin=accepted]'))"
                         ".textDecorationLine") == "underline"
    page.keyboard.press("Home")
    assert root(page, "data-cycle") == "0"
    assert page.evaluate(KEPT) == content[: len(page.evaluate(KEPT))]  # the prefill token starts the reply
    # the slider and the step buttons move it too; the block shows the stored verdicts
    page.click("#rp-next")
    assert root(page, "data-cycle") == "1" and page.locator("#rp-slots [data-verdict='anchor']").count() == 1
    page.locator("#rp-slider").fill(str(cycles - 1))
    assert root(page, "data-cycle") == str(cycles - 1)
    assert offline.blocked == [] and offline.dialogs == []


def test_space_plays_to_the_end_and_the_text_is_selectable(offline, shared):
    path, cycles, content, _ = shared
    offline.open(path)
    page = offline.page
    page.select_option("#rp-speed", "8")
    page.locator("body").press(" ")
    page.locator("#replay[data-playing='true']").wait_for()
    page.locator(f"#replay[data-cycle='{cycles}'][data-playing='false']").wait_for(timeout=30_000)
    assert page.evaluate(KEPT) == content
    page.keyboard.press(" ")  # at the end, Play starts again from the first frame
    page.locator("#replay[data-playing='true']").wait_for()
    page.keyboard.press(" ")
    page.locator("#replay[data-playing='false']").wait_for()
    selected = page.evaluate("(() => { const r = document.createRange(); r.selectNodeContents(document.getElementById"
                             "('rp-text')); getSelection().removeAllRanges(); getSelection().addRange(r); "
                             "return getSelection().toString(); })()")
    assert selected and content.startswith(selected.replace("\r", "")[:5])
    page.click("#rp-theme")
    assert page.get_attribute("html", "data-theme") == "light"
    page.click("#rp-theme")
    dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert page.get_attribute("html", "data-theme") == "dark" and dark != "rgb(255, 255, 255)"
    assert offline.blocked == []


def test_the_race_plays_both_runs_on_one_clock_and_says_the_output_is_identical(offline, shared):
    path, _, content, plain = shared
    offline.open(path)
    page = offline.page
    race = page.locator("#rp-race")
    assert race.get_attribute("data-identical") == "true" and "Identical output" in page.inner_text("#race-verdict")
    end = float(race.get_attribute("data-end-ms"))
    finish = page.evaluate("(() => { const d = JSON.parse(document.getElementById('replay-data').textContent);"
                           " const last = (s) => s[s.length - 1][0]; return [last(d.race.plain.steps),"
                           " last(d.race.dflash.steps)]; })()")
    first, later = ("plain", "dflash") if finish[0] < finish[1] else ("dflash", "plain")
    assert 0 < min(finish) < max(finish) == end  # the race ends on the later lane's last step
    # just after the first lane's last step: that lane is done, the other is not
    page.locator("#race-slider").fill(str(min(999, int(1000 * min(finish) / end) + 1)))
    assert page.get_attribute(f"#race-{first}", "data-done") == "true"
    assert page.get_attribute(f"#race-{later}", "data-done") == "false"
    assert page.inner_text(f"#race-{first} .lane-text") == content
    # played in real time (the FakeEngine's runs take a fraction of a second), both lanes finish
    page.click("#race-reset")
    assert race.get_attribute("data-race-state") == "ready" and page.inner_text("#race-plain .lane-text") == ""
    page.click("#race-play")
    page.locator("#rp-race[data-race-state='finished']").wait_for()
    assert page.inner_text("#race-plain .lane-text") == plain == content
    assert page.get_attribute("#race-plain", "data-done") == "true"
    assert offline.blocked == [] and offline.dialogs == []


def test_at_the_finish_both_lanes_count_every_token_even_off_the_rounding(offline, tmp_path):
    """A lane whose last step falls between two tenths of a millisecond (100.04 ms) still counts
    to N of N at the finish: the race ends on the lanes' own last steps."""
    with SessionStore(tmp_path / "sessions.db") as store:
        session_id, reply_id = store_fake_reply(store)
        record = store.get_comparison(reply_id)
        for step in record["plain"]["steps"]:
            step[0] += 0.04
        store.save_comparison(reply_id, record)
        tokens = 1 + sum(int(c["tau"]) for c in store.get_cycles(reply_id))
        path = tmp_path / "replay.html"
        path.write_text(replay_html(load_share(store, session_id)), encoding="utf-8")
    offline.open(path)
    page = offline.page
    page.click("#race-end")
    assert page.get_attribute("#rp-race", "data-race-state") == "finished"
    for lane in ("plain", "dflash"):
        assert page.inner_text(f"#race-{lane} .lane-count") == f"{tokens} of {tokens} tokens", lane
        assert page.get_attribute(f"#race-{lane}", "data-done") == "true", lane


def test_a_hidden_rejected_line_break_breaks_no_line(offline, tmp_path):
    """Rejected drafts of earlier cycles are off by default: one that was a line break leaves the
    reply's lines as the target wrote them; ticking the box shows it (struck through) again."""
    text = "def f(x):\n    return x\n"
    with SessionStore(tmp_path / "sessions.db") as store:
        session_id, reply_id = store_fake_reply(store, text=text, accept=(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
        cycles = store.get_cycles(reply_id)
        path = tmp_path / "replay.html"
        path.write_text(replay_html(load_share(store, session_id)), encoding="utf-8")
    def breaks(pieces) -> int:
        return sum(piece.count("\n") for piece in pieces)

    earlier = breaks(p for c in cycles[:-1] for p in c["rejected_pieces"])
    shown = breaks(cycles[-1]["rejected_pieces"])  # the cycle shown keeps its own rejected drafts
    assert earlier > 0  # the draft proposed line breaks the target refused
    offline.open(path)
    page = offline.page
    page.keyboard.press("End")
    assert not page.is_checked("#rp-show-rejected")
    assert page.inner_text("#rp-text").count("\n") == text.count("\n") + shown  # hidden ones break no line
    page.check("#rp-show-rejected")
    assert page.inner_text("#rp-text").count("\n") == text.count("\n") + shown + earlier


def test_the_xss_corpus_as_text_title_and_model_runs_nothing_and_fetches_nothing(browser, tmp_path):
    payloads = corpus()
    groups = chunks(payloads, 40)
    pages = []
    with SessionStore(tmp_path / "sessions.db") as store:
        for i, group in enumerate(groups):
            text = "\n".join(group)
            session_id, _ = store_fake_reply(store, title=" ".join(group), model=" ".join(group[:10]), prompt=text,
                                             text=text, compare=i == 0)
            path = tmp_path / f"xss-{i}.html"
            path.write_text(replay_html(load_share(store, session_id)), encoding="utf-8")
            pages.append((path, text, " ".join(group)))
    offline = Offline(browser)
    try:
        page = offline.page
        for path, text, title in pages:
            offline.open(path)
            page.keyboard.press("End")
            page.locator("#replay:not([data-cycle='0'])").wait_for()
            if page.locator("#race-end").count():
                page.click("#race-end")
            assert page.evaluate(KEPT) == text, path.name  # shown as text, exactly
            assert page.text_content("#rp-title") == title.strip().replace("\x00", "\ufffd")  # as text
            assert page.evaluate("window.__xss") is None, path.name
        assert offline.dialogs == [], offline.dialogs[:3]
        assert offline.blocked == [], offline.blocked[:5]
    finally:
        offline.close()
    assert sum(len(group) for group in groups) == len(payloads) >= 300


def test_the_watch_sees_a_fetch_and_a_script_when_a_page_makes_them(browser, tmp_path):
    # guards the checks above: a page that does fetch and run script is caught
    leaky = tmp_path / "leaky.html"
    leaky.write_text('<main id="replay" data-cycle="0"></main><img src="http://xss.test/leak">'
                     '<script>window.__xss = 1; alert(1)</script>', encoding="utf-8")
    offline = Offline(browser)
    try:
        offline.open(leaky)
        assert offline.page.evaluate("window.__xss") == 1 and offline.dialogs == ["1"]
        assert any(url.startswith("http://xss.test/") for url in offline.blocked)
    finally:
        offline.close()


def download(page, selector: str, folder, name: str, suggested: list | None = None):
    with page.expect_download() as info:
        page.click(selector)
    target = folder / name
    info.value.save_as(target)
    if suggested is not None:
        suggested.append(info.value.suggested_filename)
    return target


def test_teach_share_and_gif_buttons_download_the_replay_of_the_reply_shown(page, fake_app, tmp_path):
    studio, _, _ = fake_app
    page.fill("#chat-input textarea", "Write a Fibonacci function")
    page.press("#chat-input textarea", "Enter")
    page.wait_for_function("document.querySelectorAll('#chat .reply-footer').length >= 1", timeout=30_000)
    page.click("#teach-button")
    page.wait_for_selector("#teach-slots")
    session_id = studio.store.list_sessions(limit=1)[0]["id"]
    reply = studio.store.get_messages(session_id)[-1]
    page.wait_for_selector("#teach-share:not([disabled])")
    names: list[str] = []
    first = download(page, "#teach-share", tmp_path, "first.html", names).read_text(encoding="utf-8")
    assert f'data-cycles="{len(studio.store.get_cycles(reply["id"]))}"' in first and 'data-race="none"' in first
    # the session's first reply is reply 1, in the page and in the file's name
    assert "Reply 1 by" in first and names[0] == f"dflash-replay-session{session_id}-reply1.html"
    # after Compare, the file races plain decoding against DFlash
    page.click("#compare")
    page.wait_for_selector("#compare-result [data-identical]", timeout=30_000)
    assert studio.store.get_comparison(reply["id"])["identical"] is True
    for attempt in range(20):  # the button's file is rewritten when the comparison shows
        raced = download(page, "#teach-share", tmp_path, f"raced-{attempt}.html").read_text(encoding="utf-8")
        if 'data-race-state="ready"' in raced:
            break
        page.wait_for_timeout(250)
    assert 'data-identical="true"' in raced
    offline = Offline(page.context.browser)
    try:  # the downloaded page plays from file:// with nothing fetched
        offline.open(tmp_path / f"raced-{attempt}.html")
        offline.page.keyboard.press("End")
        assert offline.page.evaluate(KEPT) == reply["content"] and offline.blocked == []
    finally:
        offline.close()
    page.click("#teach-gif")
    page.wait_for_selector("#teach-gif-file", state="visible", timeout=60_000)
    gif = download(page, "#teach-gif-file", tmp_path, "replay.gif").read_bytes()
    assert gif[:6] == b"GIF89a" and len(gif) < 8 * 1024 * 1024
