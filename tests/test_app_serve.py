"""`dflash-studio serve`/`desktop`: options, the loopback rule, the model catalog, the engine
host's background loading, and sessions surviving a restart of the app."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from app.cli import build_parser, main
from service.settings import Settings
from app.config import ApiConfig, AppConfig, is_loopback, parse_auth
from app.wiring import EngineHost, ModelChoice, available_models
from engine.catalog import PUBLISHED_PAIRS
from engine.config import EngineConfig
from engine.errors import CheckpointError, InvalidRequestError
from tests.fake_engine import FakeEngine, fake_studio
from ui.chat import handlers as h

SETTINGS = Settings(block_size=8, temperature=0.0, top_p=1.0, max_new_tokens=256, fallback=True, show_rejected=True)


def test_serve_is_the_default_command_and_desktop_exists():
    parser = build_parser()
    args = parser.parse_args(["serve", "--port", "7999", "--no-browser", "--db", "x.db", "--models-dir", "m"])
    assert (args.port, args.no_browser, str(args.db), args.host) == (7999, True, "x.db", "127.0.0.1")
    assert parser.parse_args(["desktop"]).func.__name__ == "run_desktop"


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                            ("127.0.0.2", True), ("0.0.0.0", False), ("192.168.1.5", False)])
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


def test_a_non_loopback_host_is_refused_without_auth(capsys):
    with pytest.raises(InvalidRequestError, match="without authentication"):
        AppConfig(host="0.0.0.0").validate()
    AppConfig(host="0.0.0.0", auth=("me", "secret"), api=ApiConfig(key="api-key-1234")).validate()
    AppConfig(host="0.0.0.0", auth=("me", "secret"), api=ApiConfig(enabled=False)).validate()
    assert main(["serve", "--host", "0.0.0.0", "--no-browser"]) == 2  # nothing starts
    assert "refusing to listen on 0.0.0.0" in capsys.readouterr().err
    assert main(["--host", "0.0.0.0", "--auth", "nocolon"]) == 2
    assert parse_auth("me:pa:ss") == ("me", "pa:ss")


def test_a_port_in_use_is_one_clear_line_not_a_traceback(capsys, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port), "--no-browser", "--db", str(tmp_path / "s.db"),
                     "--allow-no-model"]) == 2
    for worker in threading.enumerate():  # the load it began ends on its own; the next test must not race its imports
        if worker.name.startswith("dflash-engine"):
            worker.join(timeout=120)
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err and "Traceback" not in err


PUBLISHED = [pair.name for pair in PUBLISHED_PAIRS]  # listed after the local pairs (engine.catalog)


def test_available_models_lists_the_command_line_pair_the_shipped_ones_and_models_dir(tmp_path):
    for name in ("qwen-8b", "mimo"):
        (tmp_path / name / "target").mkdir(parents=True)
        (tmp_path / name / "draft").mkdir()
    (tmp_path / "not-a-model").mkdir()
    config = AppConfig(engine=EngineConfig(target="/models/t", draft="/models/d"), models_dir=tmp_path)
    catalog = available_models(config, assets=tmp_path / "missing")
    assert [c.key for c in catalog] == ["t+d", "mimo", "qwen-8b", *PUBLISHED]
    assert catalog[1] == ModelChoice("mimo", str(tmp_path / "mimo" / "target"), str(tmp_path / "mimo" / "draft"),
                                     str(tmp_path / "mimo"))
    assert [c.key for c in available_models(AppConfig(), assets=tmp_path / "missing")] == ["tiny-coder", *PUBLISHED]


def test_a_pair_given_by_paths_gets_a_readable_name():
    """Not the folder ('target') nor 'target + draft': the pair's own folder, a hub id's name, or
    a shipped pair's name."""
    from engine.shipped import pair_name

    assert pair_name("/models/mypair/target", "/models/mypair/draft") == "mypair"
    assert pair_name("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16") == "Qwen3-8B-DFlash-b16"
    assert pair_name("XiaomiMiMo/MiMo-V2.5", "XiaomiMiMo/MiMo-V2.5/dflash") == "MiMo-V2.5"
    assert pair_name("runs/target/model", "runs/draft4/model") == "runs+draft4"
    assert pair_name("assets/models/tiny-coder-requests/target", "assets/models/tiny-coder-requests/draft") == "tiny-coder"
    assert pair_name("assets/models/tiny-coder/target", "assets/models/tiny-coder/draft") == "tiny-coder-fast"


def test_the_answering_pair_is_the_default_and_the_fast_pair_the_speed_demo():
    """A new user's first request gets the pair that answers; the menu says what each is for;
    ``--models-dir assets/models`` or the same pair given by paths lists each pair once, under its
    name; the names older versions stored (sessions) or answered to (the API) still mean the same pair."""
    from engine.loading import assets_dir, embedded_pair

    models = assets_dir() / "models"
    assert embedded_pair()[0] == models / "tiny-coder-requests" / "target"  # generate, bench, vLLM: the default
    catalog = available_models(AppConfig())
    assert [c.key for c in catalog] == ["tiny-coder", "tiny-coder-fast", *PUBLISHED]
    assert (catalog[0].target, catalog[0].draft) == (str(models / "tiny-coder-requests" / "target"),
                                                     str(models / "tiny-coder-requests" / "draft"))
    assert (catalog[1].target, catalog[1].draft) == (str(models / "tiny-coder" / "target"), str(models / "tiny-coder" / "draft"))
    given = AppConfig(engine=EngineConfig(target=str(models / "tiny-coder" / "target"), draft=str(models / "tiny-coder" / "draft")),
                      models_dir=models)
    assert [c.key for c in available_models(given)] == ["tiny-coder-fast", "tiny-coder", *PUBLISHED]  # the given pair starts
    host = EngineHost(available_models(AppConfig(models_dir=models)), loader=None)
    assert host.choices()[:2] == [("tiny-coder — answers simple requests", "tiny-coder"),
                                  ("tiny-coder-fast — speed demo, does not answer requests", "tiny-coder-fast")]
    for old, now in [("tiny-coder (embedded)", "tiny-coder-fast"), ("tiny-coder-embedded", "tiny-coder-fast"),
                     ("tiny-coder-requests", "tiny-coder"), ("tiny-coder-requests (answers requests)", "tiny-coder"),
                     ("tiny-coder-requests-answers-requests", "tiny-coder"), ("TINY-CODER-FAST", "tiny-coder-fast"),
                     ("gpt-4o", None)]:
        assert host.resolve(old) == now, old


def test_the_model_loads_in_the_background_with_progress_and_a_failure_keeps_the_old_one():
    engine = FakeEngine()
    halfway, release = threading.Event(), threading.Event()

    def loader(choice, progress):
        progress(0.5, "halfway")
        halfway.set()
        release.wait(timeout=10)  # the test looks at the status while the load is held halfway
        if choice.key == "bad":
            raise InvalidRequestError("draft does not fit the target: vocabulary 100 ≠ 96")
        return engine

    host = EngineHost([ModelChoice("good", None, None), ModelChoice("bad", "t", "d")], loader)
    future = host.start()
    assert halfway.wait(timeout=10)
    assert (host.status().state, host.status().message, host.engine) == ("loading", "halfway", None)
    release.set()
    assert future.result(timeout=5) is engine and host.status().state == "ready"
    with pytest.raises(InvalidRequestError):
        host.switch("bad").result(timeout=5)
    assert host.engine is engine and host.current_key == "good"
    assert host.status().state == "ready" and "vocabulary 100" in host.status().error
    assert host.submit(lambda e: e.name).result(timeout=5) == "fake-coder"
    assert host.status().error == ""  # the loaded model answered: the refusal no longer shows in the header
    host.shutdown()


def test_a_load_that_ends_after_shutdown_releases_its_engine():
    """Closing the app mid-load must not leave the loaded engine (a vLLM server it started) running."""
    closed, halfway, release = [], threading.Event(), threading.Event()

    class Closable(FakeEngine):
        def close(self):
            closed.append(self)

    engine = Closable()

    def loader(choice, progress):
        halfway.set()
        release.wait(timeout=10)
        return engine

    host = EngineHost([ModelChoice("good", None, None)], loader)
    future = host.start()
    assert halfway.wait(timeout=10)
    host.shutdown()  # returns at once: the load still runs
    assert closed == []
    release.set()
    with pytest.raises(CheckpointError, match="after the app closed"):
        future.result(timeout=5)
    assert closed == [engine] and host.engine is None


def test_sessions_survive_a_restart_of_the_app(tmp_path):
    db = tmp_path / "sessions.db"
    ctx = fake_studio(FakeEngine(), db_path=db, ui=False)
    ctx.engines.start().result(timeout=5)
    sent = h.submit_prompt(ctx, None, "remember me", SETTINGS)
    session_id = sent["session"]
    list(h.respond(ctx, sent["reply_request"]))
    ctx.engines.shutdown()
    ctx.store.close()

    ctx = fake_studio(FakeEngine(), db_path=db, ui=False)  # a new process, in effect
    view = h.on_load(ctx, None)
    assert view["session"] == session_id and view["title"] == "remember me"
    assert [r["role"] for r in view["chat"]] == ["user", "assistant"] and 'data-origin="accepted"' in view["token_view"]
    ctx.store.close()


def test_desktop_opens_chromium_in_app_mode_when_there_is_no_webview(monkeypatch):
    import app.cmd_serve as serve

    calls = []
    monkeypatch.setitem(__import__("sys").modules, "webview", None)  # import webview -> ImportError
    monkeypatch.setattr(serve.shutil, "which", lambda name: "/usr/bin/chromium" if name == "chromium" else None)
    monkeypatch.setattr(serve.subprocess, "run", lambda command, check: calls.append(command) or SimpleNamespace(returncode=0))
    serve.open_window("http://127.0.0.1:7860/")
    assert calls and calls[0][0] == "/usr/bin/chromium" and "--app=http://127.0.0.1:7860/" in calls[0]


def test_the_top_level_help_names_port_and_says_a_busy_7860_is_left(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "--port" in out and "7860" in out and "busy" in out and "next free port" in out


def test_without_port_the_app_moves_off_a_busy_7860(monkeypatch):
    """What the help and the README promise: no --port and 7860 taken, the app listens on the next free one."""
    import socket

    from tests.fake_engine import fake_studio

    monkeypatch.delenv("GRADIO_SERVER_PORT", raising=False)
    with socket.socket() as taken:
        try:
            taken.bind(("127.0.0.1", 7860))
            taken.listen()
        except OSError:
            pass  # something else holds 7860 already: the same case
        studio = fake_studio()
        try:
            studio.demo.launch(**studio.launch_kwargs(prevent_thread_lock=True, quiet=True, inbrowser=False))
            port = int(studio.demo.local_url.rstrip("/").rsplit(":", 1)[1])
            assert 7860 < port < 7960
        finally:
            studio.close()
