"""The model that answers, as the page says it (handlers, no browser): the header names the pair,
not its folder; sessions stored under the names older versions used open on the pair they meant,
keep their stored name, answer and compare on it; each model is sent only its own turns of a
session. FakeEngines stand in for the shipped pairs."""

from __future__ import annotations

import re

import pytest

from app.config import AppConfig
from app.wiring import ModelChoice, available_models, build_context
from service.settings import Settings
from storage import SessionStore
from tests.fake_engine import FakeEngine
from ui.chat import handlers as h
from ui.chat import models as m
from ui.teach import tab as teach

SETTINGS = Settings(block_size=8, temperature=0.0, top_p=1.0, max_new_tokens=64, fallback=False, show_rejected=True)


def context_for(catalog, engines):
    ctx = build_context(AppConfig(open_browser=False, flush_interval_s=0.2), store=SessionStore(),
                        loader=lambda choice, progress: engines[choice.key], catalog=catalog)
    ctx.engines.start().result(timeout=10)
    return ctx


@pytest.fixture
def shipped():
    catalog = available_models(AppConfig())
    engines = {choice.key: FakeEngine(name=choice.key) for choice in catalog}
    ctx = context_for(catalog, engines)
    yield ctx, engines
    ctx.engines.shutdown()


def test_the_header_names_the_pair_and_what_it_is_for_not_its_folder():
    engine = FakeEngine(name="target")  # an engine names itself after the folder it was loaded from
    ctx = context_for([ModelChoice("mypair", "/m/mypair/target", "/m/mypair/draft", hint="answers simple requests")],
                      {"mypair": engine})
    header = m.model_status_html(ctx)
    assert "<b>mypair</b>" in header and "answers simple requests" in header and "<b>target</b>" not in header
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", header)).strip()
    assert text == "● mypair — answers simple requests · cpu · float32 · block 8"  # what it is for · how it runs
    ctx.engines.shutdown()


@pytest.mark.parametrize("path", ["eager (compiling: 1 of 4 passes…)", "compiled"])
def test_the_header_says_which_path_answers(path, monkeypatch):
    """The local engine's info names the path that answers now; the header shows it after how
    the pair runs (it changes from 'eager (compiling: 1 of 4 passes…)' to 'compiled' once the passes are built)."""
    engine = FakeEngine(name="target")
    monkeypatch.setattr(engine, "info", lambda: dict(FakeEngine.info(engine), path=path))
    ctx = context_for([ModelChoice("mypair", "/m/mypair/target", "/m/mypair/draft")], {"mypair": engine})
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", m.model_status_html(ctx))).strip()
    assert text == f"● mypair cpu · float32 · block 8 · {path}"
    ctx.engines.shutdown()


def test_a_session_stored_under_an_older_name_opens_answers_and_compares_on_the_pair_it_meant(shipped):
    ctx, engines = shipped
    assert ctx.engines.current_key == "tiny-coder"  # the default: the answering pair
    old = {"block_size": 8, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 64, "fallback": False,
           "show_rejected": True, "model": "tiny-coder (embedded)"}
    session = ctx.store.create_session("an old one", model="tiny-coder (embedded)", settings=old)
    ctx.store.add_message(session, "user", "write f", settings=old)
    reply = ctx.store.start_reply(session, model="tiny-coder", settings=old)  # the fast pair's engine name then
    with ctx.store.reply_writer(reply) as writer:
        writer.set_content("def f(): pass")
        writer.finish("complete")

    view = h.session_view(ctx, session)
    assert view["model"].value == "tiny-coder-fast" and 'data-model="tiny-coder-fast"' in view["model_status"]
    assert ctx.store.get_session(session)["model"] == "tiny-coder (embedded)"  # its stored name stays
    assert "model-change" not in " ".join(row["content"] for row in view["chat"])  # one pair, two names

    sent = h.submit_prompt(ctx, session, "and g", SETTINGS)
    list(h.respond(ctx, sent["reply_request"]))
    assert len(engines["tiny-coder-fast"].calls) == 1 and not engines["tiny-coder"].calls
    rows, _ = h.chat_history(ctx, session)
    assert "model-change" not in " ".join(row["content"] for row in rows)
    assert ctx.store.get_session(session)["model"] == "tiny-coder (embedded)"

    ctx.engines.switch("tiny-coder").result(timeout=10)
    results = list(teach.compare(ctx, reply))
    assert len(engines["tiny-coder-fast"].calls) >= 3  # plain and DFlash reruns on the reply's own pair
    assert "does not offer" not in str(results[-1]["compare_result"])


def test_each_model_is_sent_only_its_own_turns():
    def message(i, role, content, model=None):
        return {"id": i, "role": role, "kind": "chat", "content": content, "model": model or "",
                "settings": {"model": model} if model else {}}

    messages = [message(1, "user", "write add"), message(2, "assistant", "class Tk: pass", "tiny-coder-fast"),
                message(3, "user", "write is_even"), message(4, "assistant", "def is_even(n): ...", "tiny-coder"),
                message(5, "user", "and is_odd")]

    class Host:
        catalog = {}

        @staticmethod
        def resolve(name):
            return {"tiny-coder (embedded)": "tiny-coder-fast"}.get(name, name or None)

    ctx = type("Ctx", (), {"engines": Host()})()
    assert m.prompt_for_model(ctx, messages, "tiny-coder") == [
        {"role": "user", "content": "write is_even"}, {"role": "assistant", "content": "def is_even(n): ..."},
        {"role": "user", "content": "and is_odd"}]
    assert [x["content"] for x in m.prompt_for_model(ctx, messages, "tiny-coder-fast")] == [
        "write add", "class Tk: pass", "and is_odd"]
    notices = m.reply_notices(ctx, messages, next_model="tiny-coder-fast")
    assert set(notices) == {4, None}
    assert "tiny-coder-fast → <b>tiny-coder</b>" in notices[4] and "1 earlier turn " in notices[4]
    assert "tiny-coder → <b>tiny-coder-fast</b>" in notices[None]


def test_the_rebuild_script_ends_with_the_default_pair():
    """scripts/rebuild_tiny_coder.sh builds the speed demo first, then the default pair into its
    folder, and its last command runs the default (no --target), as the app does; a bench with no
    --target before that would measure a pair not yet rebuilt."""
    from pathlib import Path

    from engine.shipped import DEFAULT_PAIR, SHIPPED_PAIRS

    script = (Path(__file__).resolve().parents[1] / "scripts" / "rebuild_tiny_coder.sh").read_text().replace("\\\n", " ")
    commands = [line.split("#")[0].split() for line in script.splitlines() if line.strip().startswith("dflash-studio ")]
    copies = [line.split()[-1] for line in script.splitlines() if line.startswith("cp ")]
    assert copies[-1].startswith(f"assets/models/{DEFAULT_PAIR.folder}/")
    assert {f"assets/models/{pair.folder}/target/" for pair in SHIPPED_PAIRS} <= set(copies)
    assert commands[-1][:2] == ["dflash-studio", "bench"] and "--target" not in commands[-1]
    assert all("--target" in command for command in commands[:-1] if command[1] == "bench")


def test_the_header_shows_the_speed_measured_in_the_model_card_and_the_readme_agrees(shipped):
    """One source for a shipped pair's speed (engine.shipped): the header shows it, its model card
    gives the same range with two decimals, the README the default's rounded."""
    from pathlib import Path

    from engine.shipped import DEFAULT_PAIR, SHIPPED_PAIRS, assets_dir

    ctx, _ = shipped
    for pair in SHIPPED_PAIRS:
        card = (assets_dir() / "models" / pair.folder / "README.md").read_text()
        assert f"τ {pair.tau[0]:.2f}–{pair.tau[1]:.2f}" in card and f"{pair.speedup[0]:.2f}–{pair.speedup[1]:.2f}×" in card
        assert pair.speed() in m.model_status_html(ctx, pair.name)
    assert "τ 2.8–3.3, 1.5–1.8× plain decoding (bench)" in m.model_status_html(ctx)  # the default, loaded
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert f"{DEFAULT_PAIR.speedup[0]:.1f}–{DEFAULT_PAIR.speedup[1]:.1f}×" in readme


def test_a_send_while_a_picked_model_loads_asks_for_the_picked_model():
    """The header says "ready" the moment the worker has loaded a picked model, before the pick
    returns: a Send from the pick on must ask for the new model, with the notice, and not for the
    session's old one (the worker would load the old one back to answer it)."""
    import threading

    loading, release = threading.Event(), threading.Event()
    engines = {"coder": FakeEngine(name="coder"), "fast": FakeEngine(name="fast")}

    def loader(choice, progress):
        if choice.key == "fast":
            loading.set()
            release.wait(timeout=10)
        return engines[choice.key]

    ctx = build_context(AppConfig(open_browser=False, flush_interval_s=0.2), store=SessionStore(), loader=loader,
                        catalog=[ModelChoice("coder", None, None), ModelChoice("fast", None, None)])
    ctx.engines.start().result(timeout=10)
    try:
        first = h.submit_prompt(ctx, None, "write add", SETTINGS)
        list(h.respond(ctx, first["reply_request"]))
        session = first["session"]
        picking = threading.Thread(target=h.pick_model, args=(ctx, "fast", session))
        picking.start()
        assert loading.wait(timeout=10)
        accepted = h.check_send(ctx, session, "write is_even", SETTINGS)
        assert accepted.model == "fast" and "coder → <b>fast</b>" in accepted.notice
        release.set()
        picking.join(timeout=10)
        list(h.respond(ctx, h.submit_prompt(ctx, session, "write is_even", SETTINGS, accepted)["reply_request"]))
        assert len(engines["fast"].calls) == 1 and len(engines["coder"].calls) == 1
        assert ctx.engines.current_key == "fast"
    finally:
        release.set()
        ctx.engines.shutdown()


def test_a_refused_pick_leaves_the_session_on_its_model_and_keeps_a_setting_changed_meanwhile():
    import threading

    from engine.errors import IncompatibleDraftError

    loading, release = threading.Event(), threading.Event()
    coder = FakeEngine(name="coder")

    def loader(choice, progress):
        if choice.key == "bad":
            loading.set()
            release.wait(timeout=10)
            raise IncompatibleDraftError("draft does not fit the target: hidden size 64 ≠ target's 128")
        return coder

    ctx = build_context(AppConfig(open_browser=False, flush_interval_s=0.2), store=SessionStore(), loader=loader,
                        catalog=[ModelChoice("coder", None, None), ModelChoice("bad", "t", "d")])
    ctx.engines.start().result(timeout=10)
    try:
        sent = h.submit_prompt(ctx, None, "write add", SETTINGS)
        list(h.respond(ctx, sent["reply_request"]))
        session = sent["session"]
        before = ctx.store.get_session(session)
        outcome = {}
        picking = threading.Thread(target=lambda: outcome.update(h.pick_model(ctx, "bad", session)))
        picking.start()
        assert loading.wait(timeout=10)
        assert ctx.store.get_session(session)["settings"]["model"] == "bad"  # the session's model while it loads
        h.change_settings(ctx, session, 4, 0.0, 1.0, 64, False, True)  # changed during the load
        release.set()
        picking.join(timeout=10)
        after = ctx.store.get_session(session)
        assert outcome["model"].value == "coder" and after["model"] == before["model"]
        assert after["settings"] == {**before["settings"], "block_size": 4}
        assert h.check_send(ctx, session, "write is_even", SETTINGS).model == "coder"
    finally:
        release.set()
        ctx.engines.shutdown()
