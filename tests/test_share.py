"""The shared replay's builder (ui.share.replay, ui.share.page, ui.share.gif) and `sessions share`:
the page contract, exact final text, escaping, the Content-Security-Policy, the size bound, the
race from a stored Compare, the GIF, and the command line (the browser checks: tests/e2e/test_share.py)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
from html.parser import HTMLParser

import pytest
from PIL import Image

from app.cli import main
from engine.config import EngineConfig, FallbackConfig, SamplingConfig
from engine.prompts import heal_code_prompt
from engine.runtime import Engine
from storage import SessionStore
from tests.fake_engine import DEFAULT_TEXT
from tests.share_helpers import record_events, store_fake_reply
from tests.xss_corpus import corpus
from ui.share.gif import HOLD_MS, MAX_WIDTH, replay_gif
from ui.share.page import PAGE_BUDGET, replay_html
from ui.share.replay import ShareError, ShareReply, frame_tokens, load_share, replay_document
from ui.teach.steps import build_steps, reply_numbers

EVIL = '</script><script>window.__xss=1</script><img src=x onerror=alert(1)> & "quotes" \u2028 <!-- -->'


class Page(HTMLParser):
    """The parts of a page the checks read: tags with their attributes, and each script's text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self.styles: list[str] = []
        self._open: tuple[str, dict] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "style"):
            self._open = (tag, dict(attrs))

    def handle_data(self, data):
        if self._open is not None:
            tag, attrs = self._open
            (self.scripts.append((attrs, data)) if tag == "script" else self.styles.append(data))
            self._open = None

    def first(self, tag: str, **attrs) -> dict:
        return next(a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in attrs.items()))

    def data(self) -> dict:
        return json.loads(next(text for attrs, text in self.scripts if attrs.get("type") == "application/json"))


@pytest.fixture
def store(tmp_path):
    with SessionStore(tmp_path / "sessions.db") as store:
        yield store


def kept_text(doc: dict) -> str:
    return "".join(t[0] for f in doc["frames"] for t in f["tok"] if t[1] in ("accepted", "bonus"))


# ============================================================================ the page contract


def test_page_carries_the_contract_and_its_final_frame_reads_the_stored_reply(store):
    session_id, reply_id = store_fake_reply(store)
    page_text = replay_html(load_share(store, session_id))
    page = Page(page_text)
    root = page.first("main", id="replay")
    cycles = store.get_cycles(reply_id)
    assert "data-dflash-replay" in root and root["data-cycles"] == str(len(cycles)) and root["data-cycle"] == "0"
    doc = page.data()
    assert len(doc["frames"]) == len(cycles) + 1  # frame 0 is the prefill, then one frame per stored cycle
    assert {t[1] for f in doc["frames"] for t in f["tok"]} == {"accepted", "bonus", "rejected"}
    assert kept_text(doc) == store.get_message(reply_id)["content"] == DEFAULT_TEXT
    # each frame shows one stored cycle: its slots' verdicts and tokens, its caption
    for frame, cycle in zip(doc["frames"][1:], cycles):
        assert [s[1] for s in frame["slots"]] == [s["verdict"] for s in cycle["slots"]]
        assert [t[0] for t in frame["tok"] if t[1] == "rejected"] == cycle["rejected_pieces"]
        assert frame["tau"] == cycle["tau"] and frame["cap"].startswith("The draft filled all")
    assert [t for t, _ in page.tags].count("svg") == 1 and page_text.count('class="bar"') == len(cycles)


def test_the_default_reply_is_the_last_and_others_are_picked_by_number(store):
    session_id, first = store_fake_reply(store, text="def one():\n    return 1\n", compare=False)
    store.add_message(session_id, "user", "and two?")
    second = store.start_reply(session_id, model="fake-coder")
    store.update_message(second, content="def two(): return 2", status="complete")
    assert load_share(store, session_id).message["id"] == second
    # replies are numbered 1, 2, … among the replies, whatever the user messages between them
    assert load_share(store, session_id, reply=1).message["id"] == first
    assert load_share(store, session_id, reply=2).message["id"] == second
    assert load_share(store, session_id, reply=1).reply_number == 1
    assert "Reply 2 by <b" in replay_html(load_share(store, session_id, reply=2))
    with pytest.raises(ShareError, match="has no reply 3"):
        load_share(store, session_id, reply=3)
    with pytest.raises(ShareError, match="session 99 does not exist"):
        load_share(store, 99)
    empty = store.create_session("nothing yet")
    with pytest.raises(ShareError, match="has no reply to share"):
        load_share(store, empty)


def test_a_reply_cut_by_a_stop_string_still_reads_exactly_as_stored():
    cycles = [{"index": 1, "block_size": 4, "accepted": 2, "emitted_pieces": ["de", "f f", "(x"],
               "rejected_pieces": ["oo"]},
              {"index": 2, "block_size": 4, "accepted": 3, "emitted_pieces": ["):", " STOP", " more", "!"],
               "rejected_pieces": []}]
    frames = frame_tokens("\ndef f(x):", cycles)  # "\n" came from prefill; " STOP" was the stop string
    kept = "".join(t.text for f in frames for t in f if t.origin != "rejected")
    assert kept == "\ndef f(x):"
    assert [t.text for t in frames[1] if t.origin == "rejected"] == ["oo"]
    # text the cycles do not account for is shown too, as the target's, at the end
    frames = frame_tokens("\ndef f(x): pass", cycles[:1])
    assert "".join(t.text for f in frames for t in f if t.origin != "rejected") == "\ndef f(x): pass"
    assert frames[-1][-1].extra


def test_the_token_count_in_each_frame_is_the_model_tokens_teach_and_the_stats_count():
    """A kept token with no text (the end-of-text token that ends the reply) still took the target's
    work: the replay counts it as Teach and the stats do, and plain decoding needs one pass per token."""
    cycles = [{"index": 1, "block_size": 4, "accepted": 2, "emitted_pieces": ["de", "f f", "(x"],
               "rejected_pieces": ["oo"]},
              {"index": 2, "block_size": 4, "accepted": 2, "emitted_pieces": ["):", "\n", "<|end|>"],
               "rejected_pieces": []}]
    message = {"id": 1, "seq": 2, "content": "\ndef f(x):\n", "new_tokens": 7, "settings": {}, "status": "complete"}
    doc = replay_document(ShareReply("a reply", "fake-coder", message, "write f", cycles, None))
    numbers = reply_numbers(build_steps(message["content"], cycles))
    assert [f["n"] for f in doc["frames"]] == [1, 4, 7] and numbers.new_tokens == 7 == message["new_tokens"]


# ============================================================================ safety


def test_every_text_is_escaped_and_no_text_can_close_the_data_block(store):
    payloads = [EVIL, *corpus()[:60]]
    text = "\n".join(payloads)
    session_id, _ = store_fake_reply(store, title=" ".join(payloads[:8]), model=EVIL, prompt=text, text=text)
    page_text = replay_html(load_share(store, session_id))
    page = Page(page_text)
    # the only elements are ours: exactly two scripts (the data block and the page's code), no images, no iframes
    assert [t for t, _ in page.tags].count("script") == 2
    assert not {t for t, _ in page.tags} & {"img", "iframe", "svg:image", "object", "embed", "link", "base", "a"}
    assert not any(name.startswith("on") for _, attrs in page.tags for name in attrs)
    data_block = next(text for attrs, text in page.scripts if attrs.get("type") == "application/json")
    assert "<" not in data_block and ">" not in data_block and "&" not in data_block
    doc = page.data()
    assert doc["text"] == text and doc["prompt"].startswith(EVIL) and doc["model"] == EVIL
    assert html_text_of(page_text, "rp-title") == " ".join(payloads[:8])
    assert html_text_of(page_text, "rp-model") == EVIL


def html_text_of(page_text: str, element_id: str) -> str:
    import html

    match = re.search(rf'id="{element_id}">(.*?)</', page_text, re.S)
    return html.unescape(match.group(1))


def test_the_content_security_policy_forbids_every_fetch_and_allows_only_the_page_own_code(store):
    session_id, _ = store_fake_reply(store)
    page = Page(replay_html(load_share(store, session_id)))
    policy = page.first("meta", **{"http-equiv": "Content-Security-Policy"})["content"]
    directives = dict((d.split()[0], d.split()[1:]) for d in policy.split(";") if d.strip())
    assert directives["default-src"] == ["'none'"]
    for name in ("connect-src", "img-src", "font-src", "media-src", "object-src", "frame-src", "base-uri", "form-action"):
        assert directives[name] == ["'none'"], name

    def digest(text: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"

    code = next(text for attrs, text in page.scripts if "type" not in attrs)
    assert directives["script-src"] == [digest(code)]  # no 'unsafe-inline': an injected script would not run
    assert directives["style-src"] == [digest(page.styles[0])]
    assert page.tags[0][0] == "html" and page.tags[2][0] == "meta"  # the policy comes before anything it governs


# ============================================================================ size, race, GIF


def test_a_300_token_reply_stays_under_1_MB_even_with_one_token_per_cycle(store):
    words = " ".join(f"w{i}" for i in range(151))  # 301 tokens (words and spaces): the prefill's, then 300 cycles
    session_id, reply_id = store_fake_reply(store, text=words, accept=(0,), block=16)
    assert len(store.get_cycles(reply_id)) == 300
    page_text = replay_html(load_share(store, session_id))
    assert len(page_text.encode()) < 1_000_000 and len(page_text.encode()) < PAGE_BUDGET
    assert kept_text(Page(page_text).data()) == words


def test_compare_is_kept_with_the_reply_and_the_page_races_it(store):
    session_id, reply_id = store_fake_reply(store)
    record = store.get_comparison(reply_id)
    assert record["identical"] is True and record["plain"]["text"] == DEFAULT_TEXT
    doc = replay_document(load_share(store, session_id))
    race = doc["race"]
    assert race["identical"] and race["same_as_plain"]
    plain, fast = race["plain"]["steps"], race["dflash"]["steps"]
    assert "".join(s[2] for s in plain) == "".join(s[2] for s in fast) == DEFAULT_TEXT
    assert [s[1] for s in plain] == list(range(1, len(plain) + 1))  # plain decoding: one token per step
    assert all(a[0] <= b[0] for a, b in zip(plain, plain[1:]))  # the clock only goes forward
    # each lane runs on its own run's measured clock, as Compare stored it (whoever is faster wins)
    for lane, run in ((plain, record["plain"]), (fast, record["dflash"])):
        assert [s[0] for s in lane] == [round(step[0], 2) for step in run["steps"]]
    tokens = 1 + sum(int(c["tau"]) for c in store.get_cycles(reply_id))  # the prefill's token, then each cycle's
    assert plain[-1][1] == fast[-1][1] == tokens  # both lanes end on the reply's own token count
    assert "Compare's back-to-back runs" in doc["speed_source"]  # both times measured at the same moment
    assert doc["frames"][-1]["speed"] > 1
    page = Page(replay_html(load_share(store, session_id)))
    assert page.first("section", id="rp-race")["data-identical"] == "true"
    store.delete_session(session_id)  # the comparison goes with its reply
    assert store.database.execute("SELECT count(*) FROM comparisons").fetchone()[0] == 0


def test_without_a_comparison_the_page_says_how_to_get_one(store):
    session_id, _ = store_fake_reply(store, compare=False)
    doc = replay_document(load_share(store, session_id))
    assert doc["race"] is None and "estimate" in doc["speed_source"]
    assert 'data-race="none"' in replay_html(load_share(store, session_id))


def test_the_gif_plays_every_cycle_and_holds_the_last_frame(store):
    session_id, reply_id = store_fake_reply(store)
    doc = replay_document(load_share(store, session_id))
    data = replay_gif(doc)
    image = Image.open(io.BytesIO(data))
    assert image.format == "GIF" and image.width <= MAX_WIDTH and len(data) <= 8 * 1024 * 1024
    assert image.n_frames == len(store.get_cycles(reply_id)) + 1
    image.seek(image.n_frames - 1)
    assert image.info["duration"] == HOLD_MS
    # too big for the bound: every other cycle, the last one kept
    smaller = Image.open(io.BytesIO(replay_gif(doc, max_bytes=len(data) - 1)))
    assert smaller.n_frames < image.n_frames
    smaller.seek(smaller.n_frames - 1)
    assert smaller.info["duration"] == HOLD_MS


# ============================================================================ the command line


def run(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_sessions_share_writes_the_page_and_the_gif(capsys, tmp_path):
    path = tmp_path / "sessions.db"
    with SessionStore(path) as store:
        session_id, _ = store_fake_reply(store)
    out, gif = tmp_path / "out" / "replay.html", tmp_path / "replay.gif"
    code, err = run(capsys, "sessions", "share", session_id, "--db", path, "-o", out, "--gif", gif)
    assert code == 0 and "wrote the replay of reply 1" in err and "wrote the GIF" in err
    assert 'data-dflash-replay="1"' in out.read_text() and Image.open(gif).format == "GIF"
    assert run(capsys, "sessions", "share", session_id, "--db", path) == (
        2, "dflash-studio: error: say where to write the replay: -o FILE.html and/or --gif FILE.gif\n")
    assert run(capsys, "sessions", "share", session_id, "--db", path, "--reply", 2, "-o", out) == (
        2, f"dflash-studio: error: session {session_id} has no reply 2 (see `dflash-studio sessions show {session_id}`)\n")
    assert run(capsys, "sessions", "share", 7, "--db", path, "-o", out)[1] == \
        "dflash-studio: error: session 7 does not exist\n"
    missing = tmp_path / "none.db"
    assert run(capsys, "sessions", "share", 1, "--db", missing, "-o", out) == (
        2, f"dflash-studio: error: session 1 does not exist ({missing} does not exist)\n")
    assert not missing.exists()


@pytest.mark.slow
def test_sessions_share_race_runs_on_the_pair_that_made_the_reply(capsys, tmp_path):
    """A reply of the speed-demo pair races on that pair, not on the default one (which answers
    another text, so the race said 'different output' and replaced the stored comparison)."""
    from engine.shipped import SHIPPED_PAIRS, pair_dirs

    fast = next(pair for pair in SHIPPED_PAIRS if pair.name == "tiny-coder-fast")
    target, draft = pair_dirs(fast)
    path = tmp_path / "sessions.db"
    code_prompt = "def gcd(a, b):\n"
    engine = Engine.load(EngineConfig(target=str(target), draft=str(draft)))
    try:
        with SessionStore(path) as store:
            session_id = store.create_session("gcd", model=fast.name)
            store.add_message(session_id, "user", code_prompt, kind="complete")
            settings = {"temperature": 0.0, "max_new_tokens": 24, "fallback": False, "engine": "local",
                        "model": fast.name}
            reply = store.start_reply(session_id, model=fast.name, settings=settings, kind="complete")
            ids = engine.encode(heal_code_prompt(code_prompt), raw=True)
            record_events(store, reply, engine.generate(ids, SamplingConfig(max_new_tokens=24), FallbackConfig()))
    finally:
        engine.close()
    code, err = run(capsys, "sessions", "share", session_id, "--db", path, "-o", tmp_path / "race.html", "--race")
    assert code == 0 and "raced: identical output" in err and "on tiny-coder-fast" in err, err


@pytest.mark.slow
def test_sessions_share_race_runs_compare_on_the_embedded_model(capsys, tmp_path):
    path = tmp_path / "sessions.db"
    code_prompt = "def gcd(a, b):\n"
    engine = Engine.load(EngineConfig())
    try:
        with SessionStore(path) as store:
            session_id = store.create_session("gcd", model=engine.name)
            store.add_message(session_id, "user", code_prompt, kind="complete")
            settings = {"temperature": 0.0, "max_new_tokens": 40, "fallback": False, "engine": "local"}
            reply = store.start_reply(session_id, model=engine.name, settings=settings, kind="complete")
            ids = engine.encode(heal_code_prompt(code_prompt), raw=True)
            record_events(store, reply, engine.generate(ids, SamplingConfig(max_new_tokens=40), FallbackConfig()))
            content = store.get_message(reply)["content"]
    finally:
        engine.close()
    out = tmp_path / "race.html"
    code, err = run(capsys, "sessions", "share", session_id, "--db", path, "-o", out, "--race")
    assert code == 0 and "raced: identical output" in err, err
    race = Page(out.read_text()).data()["race"]
    assert race["identical"] and "".join(s[2] for s in race["plain"]["steps"]) == content
    with SessionStore(path, recover=False) as store:
        assert store.get_comparison(reply)["identical"] is True


def test_the_teach_share_button_never_offers_a_half_written_page(store, tmp_path, monkeypatch):
    """Teach rewrites the reply's page whenever the reply or its comparison changes, into one
    folder every tab shares: a rewrite that fails midway (a full disk) must leave the page a
    download reads whole, and no stray file behind."""
    from pathlib import Path
    from types import SimpleNamespace

    from ui.share.buttons import share_file

    _, message_id = store_fake_reply(store)
    folder = tmp_path / "share"
    folder.mkdir()
    share_file(SimpleNamespace(store=store), folder, message_id)
    [page] = folder.iterdir()
    whole = page.read_text(encoding="utf-8")

    def half_then_full_disk(self, text, *args, **kwargs):
        with open(self, "w", encoding="utf-8") as out:
            out.write(text[: len(text) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_full_disk)
    with pytest.raises(OSError):
        share_file(SimpleNamespace(store=store), folder, message_id)
    assert list(folder.iterdir()) == [page] and page.read_text(encoding="utf-8") == whole


def test_the_gif_counts_tokens_and_passes_in_words_that_agree(store):
    from ui.share.gif import frame_figures

    session_id, reply_id = store_fake_reply(store)
    frames = replay_document(load_share(store, session_id))["frames"]
    assert frame_figures(frames[0], 0) == "1 token so far, from the prefill pass (plain decoding starts the same way)"
    taus = [int(c["tau"]) for c in store.get_cycles(reply_id)]
    words = frame_figures(frames[1], 1)
    assert words.startswith(f"{1 + taus[0]} tokens in 1 DFlash cycle (a target pass each) after the prefill; "
                            f"plain decoding: {taus[0]} passes")
    last = frame_figures(frames[-1], len(taus))
    assert f"{1 + sum(taus)} tokens in {len(taus)} DFlash cycles" in last and f"plain decoding: {sum(taus)} passes" in last
