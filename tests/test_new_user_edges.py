"""The rough edges a new user hits first, outside the page: the empty-prompt rule, the context
window's messages in the CLI, a model that cannot load at `serve`, `generate --bogus`, deleting
with a reader next to us, importing a newer export, and MiMo attention-sink drafts with broken weights."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time

import pytest
import torch

from app.cli import main
from engine.errors import CONTEXT_FULL, EMPTY_PROMPT, CheckpointError, EmptyPromptError, check_prompt_text
from storage import SessionStore
from tests.tiny_models import save_tiny_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


# ----------------------------------------------------------------------------- prompts
@pytest.mark.parametrize("text", ["", "   ", "\n\t \r\n", None, "\u3000"])
def test_the_empty_prompt_rule(text):
    with pytest.raises(EmptyPromptError) as caught:
        check_prompt_text(text)
    assert str(caught.value) == EMPTY_PROMPT
    assert check_prompt_text(" x ") == " x "


@pytest.mark.parametrize("argv", [["generate", ""], ["generate", "   "], ["generate", "--raw", ""],
                                  ["generate", "--raw", " \n "]])
def test_generate_refuses_an_empty_prompt_with_the_shared_message(argv, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"dflash-studio: error: {EMPTY_PROMPT}"


def test_an_over_long_prompt_gets_advice_that_fits_the_cli(pair, capsys):
    target, draft = pair[0], pair[1]
    long_prompt = "def f(x): return x + 1\n" * 400  # far past the tiny target's 512 positions
    assert main(["generate", "--target", str(target), "--draft", str(draft), "--raw", long_prompt]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dflash-studio: error: the prompt is ") and "context window is 512 tokens" in err
    assert err.endswith("Shorten the prompt.") and "session" not in err
    assert len(err.splitlines()) == 1


def test_measuring_costs_past_the_context_window_is_refused_in_one_line(pair, capsys):
    target, draft = pair[0], pair[1]
    argv = ["bench", "--costs", "--no-compile", "--target", str(target), "--draft", str(draft)]
    assert main([*argv, "--context", "100000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("dflash-studio: error: a context of 100000 tokens and a verify of 16 are past this model's "
                   "context window of 512 tokens: measure at a shorter context")
    assert main([*argv, "--context", "496", "--json"]) == 0  # 496 + 16 fills the window exactly
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["context"] == 496


def test_the_app_measures_a_short_window_models_costs_within_its_window(tmp_path):
    from engine.config import EngineConfig
    from engine.runtime import Engine

    target, draft = save_tiny_pair(tmp_path)[:2]
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 100}))
    engine = Engine.load(EngineConfig(target=str(target), draft=str(draft), device="cpu", compile=False))
    assert engine.models.context_window == 100
    costs = engine.measure_costs()  # 128 tokens of context would not fit: it measures at 100 - 16
    assert costs.context == 84 and costs.verify_ms[1] > 0


def test_a_reply_cut_by_the_context_window_says_so_in_the_cli(pair, capsys):
    target, draft = pair[0], pair[1]
    prompt = "x = 1\n" * 75  # 450 tokens: leaves 61 positions of the 512
    argv = ["generate", "--target", str(target), "--draft", str(draft), "--raw", "--max-new-tokens", "4000"]
    assert main([*argv, "--json", prompt]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    if result["finish_reason"] == "length":  # the tiny random target did not stop by itself
        assert result["prompt_tokens"] + result["tokens"] == 511
        assert result["finish_note"] == CONTEXT_FULL
        assert main([*argv, prompt]) == 0
        assert f"finish: length ({CONTEXT_FULL})" in capsys.readouterr().err
    else:
        assert result["finish_reason"] == "stop" and result["finish_note"] == ""
    assert main([*argv[:-1], "5", "--json", "x = 1\n"]) == 0
    short = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert short["finish_note"] == ""  # max_new_tokens, not the window


# ----------------------------------------------------------------------------- the command line
def test_serve_with_a_model_that_cannot_load_exits_2_with_one_line(tmp_path, capsys):
    code = main(["serve", "--target", str(tmp_path / "nonexistent"), "--no-browser", "--db", str(tmp_path / "s.db")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f"dflash-studio: error: target not found: {tmp_path / 'nonexistent'} (no such directory)"


def test_a_wrong_option_shows_the_usage_of_its_own_command(capsys):
    for argv, usage in ((["generate", "--bogus", "x"], "usage: dflash-studio generate"),
                        (["sessions", "list", "--bogus"], "usage: dflash-studio sessions list")):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and err.startswith(usage) and "unrecognized arguments: --bogus" in err


# ----------------------------------------------------------------------------- delete with a reader
SECRET = "TOPSECRET-deleted-text-4471"


def file_bytes(path) -> bytes:
    data = path.read_bytes()
    wal = path.with_name(path.name + "-wal")
    return data + (wal.read_bytes() if wal.exists() else b"")


@pytest.mark.parametrize("command", [["serve", "--no-browser", "--port", "1"], ["sessions", "list"]])
def test_a_database_path_that_is_a_directory_is_refused_in_one_line(tmp_path, capsys, command):
    assert main([*command, "--db", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"dflash-studio: error: cannot open the session database {tmp_path}: it is a directory "
                   f"(give a file in it, such as {tmp_path / 'sessions.db'})")
    assert list(tmp_path.iterdir()) == []  # nothing written there


def test_a_database_path_sqlite_cannot_open_is_a_store_error(tmp_path):
    from storage.errors import StoreError

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match=f"cannot open the session database {blocker / 'sessions.db'}"):
        SessionStore(blocker / "sessions.db")  # its folder would have to be a file


def test_delete_wipes_the_text_once_a_reader_lets_go(tmp_path):
    path = tmp_path / "s.db"
    store = SessionStore(path)
    keep = store.create_session("keep")
    doomed = store.create_session("doomed")
    store.add_message(doomed, "user", SECRET * 20)
    store.add_message(keep, "user", "hello")
    reader = sqlite3.connect(str(path), check_same_thread=False)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM messages").fetchone()[0] == 2  # holds a snapshot with the text
    threading.Timer(1.0, reader.rollback).start()  # the CLI next to the app finishes its read a second later
    started = time.monotonic()
    assert store.delete_session(doomed) is True
    assert time.monotonic() - started >= 0.9  # it waited for the reader instead of giving up
    assert store.wipe_pending is False and SECRET.encode() not in file_bytes(path)
    reader.close()
    store.close()


def test_delete_reports_a_pending_wipe_and_finishes_it_later(tmp_path):
    path = tmp_path / "s.db"
    store = SessionStore(path)
    doomed = store.create_session("doomed")
    store.add_message(doomed, "user", SECRET * 20)
    other = store.create_session("other")
    reader = sqlite3.connect(str(path))
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM messages").fetchone()
    import storage.store as store_module

    store_module.FORGET_RETRY_S, saved = 0.2, store_module.FORGET_RETRY_S
    try:
        assert store.delete_session(doomed) is False  # the reader still holds the old pages
        assert store.wipe_pending is True
        assert SECRET.encode() in file_bytes(path)  # what the ignored checkpoint result used to hide
        reader.rollback()
        store.delete_session(other)
        assert store.wipe_pending is False and SECRET.encode() not in file_bytes(path)
    finally:
        store_module.FORGET_RETRY_S = saved
        reader.close()
        store.close()


def test_sessions_delete_says_when_a_reader_delays_the_wipe(tmp_path, capsys, monkeypatch):
    import storage.store as store_module

    path = tmp_path / "s.db"
    with SessionStore(path) as store:
        doomed = store.create_session("doomed")
        store.add_message(doomed, "user", SECRET)
    reader = sqlite3.connect(str(path))
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM messages").fetchone()
    monkeypatch.setattr(store_module, "FORGET_RETRY_S", 0.2)
    assert main(["sessions", "delete", str(doomed), "--yes", "--db", str(path)]) == 0
    captured = capsys.readouterr()
    assert "deleted session" in captured.out and "write-ahead log" in captured.err
    reader.close()


# ----------------------------------------------------------------------------- import a newer export
def test_importing_a_newer_export_adds_its_new_messages(tmp_path, capsys):
    laptop = SessionStore(tmp_path / "laptop.db")
    session = laptop.create_session("shared")
    laptop.add_message(session, "user", "first question")
    laptop.add_message(session, "assistant", "first answer")
    old_export = laptop.export_session(session)
    desktop = SessionStore(tmp_path / "desktop.db")
    [first] = desktop.import_document(old_export)
    assert (first.outcome, first.added) == ("created", 2)
    desktop.rename_session(first.session_id, "renamed here")  # local changes stay
    laptop.add_message(session, "user", "second question")
    laptop.add_message(session, "assistant", "second answer")
    newer = laptop.export_session(session)
    [merged] = desktop.import_document(newer)
    assert (merged.session_id, merged.outcome, merged.added) == (first.session_id, "merged", 2)
    contents = [m["content"] for m in desktop.get_messages(first.session_id)]
    assert contents == ["first question", "first answer", "second question", "second answer"]
    assert desktop.get_session(first.session_id)["title"] == "renamed here"
    [again] = desktop.import_document(newer)
    assert (again.outcome, again.added) == ("unchanged", 0) and desktop.count_sessions() == 1
    path = tmp_path / "newer.json"
    path.write_text(json.dumps(laptop.export_session(session)))
    laptop.add_message(session, "user", "third")
    path.write_text(json.dumps(laptop.export_session(session)))
    assert main(["sessions", "import", str(path), "--db", str(tmp_path / "desktop.db")]) == 0
    assert "1 updated (+1 message)" in capsys.readouterr().out


def test_a_diverged_session_is_imported_as_a_copy_losing_nothing(tmp_path):
    laptop = SessionStore(tmp_path / "laptop.db")
    session = laptop.create_session("shared")
    laptop.add_message(session, "user", "question")
    desktop = SessionStore(tmp_path / "desktop.db")
    [mine] = desktop.import_document(laptop.export_session(session))
    desktop.add_message(mine.session_id, "assistant", "desktop's answer")
    time.sleep(0.01)
    laptop.add_message(session, "assistant", "laptop's answer")
    [copy] = desktop.import_document(laptop.export_session(session))
    assert copy.outcome == "copied" and copy.session_id != mine.session_id
    assert desktop.get_messages(mine.session_id)[-1]["content"] == "desktop's answer"
    assert desktop.get_messages(copy.session_id)[-1]["content"] == "laptop's answer"
    assert desktop.get_session(copy.session_id)["title"] == "shared (imported copy)"


# ----------------------------------------------------------------------------- MiMo drafts
@pytest.mark.parametrize("extra", [
    {"dflash_config": {"attention_sink_bias": True}},
    {"attention_sink_bias": True, "attention_value_scale": 2.0},
])
def test_a_sink_config_without_its_sink_weights_names_the_missing_tensor(pair, tmp_path, extra):
    """MiMo's sinks are supported (tests/test_draft_forms.py); a config that asks for them with
    weights that lack them is a broken checkpoint, refused with the tensor's name."""
    from engine.draft import load_draft

    mimo = tmp_path / "mimo-dflash"
    shutil.copytree(pair[1], mimo)
    config = json.loads((mimo / "config.json").read_text())
    for key, value in extra.items():
        if isinstance(value, dict):
            config.setdefault(key, {}).update(value)
        else:
            config[key] = value
    (mimo / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="missing .*attention_sink_bias"):
        load_draft(mimo)
    config_plain = json.loads((pair[1] / "config.json").read_text())
    config_plain.setdefault("dflash_config", {}).update({"attention_sink_bias": False, "attention_value_scale": 1.0})
    plain = tmp_path / "plain"
    shutil.copytree(pair[1], plain)
    (plain / "config.json").write_text(json.dumps(config_plain))
    assert load_draft(plain) is not None  # the extras switched off are the plain format


def test_sink_weights_without_a_sink_config_are_refused(pair, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from engine.draft import load_draft

    sink = tmp_path / "sink"
    shutil.copytree(pair[1], sink)
    state = load_file(str(sink / "model.safetensors"))
    state["layers.0.self_attn.attention_sink_bias"] = torch.zeros(4)
    save_file(state, str(sink / "model.safetensors"))
    with pytest.raises(CheckpointError, match="unexpected .*attention_sink_bias"):
        load_draft(sink)


# ----------------------------------------------------------------------------- the same words in the page and the API
def test_the_page_says_the_context_window_is_full_live_and_after_a_reload():
    from engine.events import Finished, event_to_dict
    from ui.chat.render import assistant_markdown
    from ui.chat.trace import ReplyTrace

    store = SessionStore()
    session = store.create_session("s")
    store.add_message(session, "user", "q")
    finished = Finished(reason="length", token_ids=(1, 2), text="ab", acceptance_lengths=(2,), prompt_tokens=509,
                        prefill_ms=1.0, decode_ms=1.0, total_ms=2.0, cycles=1, context_full=True)
    reply = store.start_reply(session, model="m", settings={}, kind="chat")
    with store.reply_writer(reply) as writer:
        writer.set_content("ab")
        writer.finish("complete", stats=event_to_dict(finished))
    stored = store.get_message(reply)
    assert stored["finish_reason"] == "context_full"
    live = ReplyTrace()
    live.finished = event_to_dict(finished)
    reloaded = ReplyTrace.from_stored(stored["content"], store.get_cycles(reply), stored)
    for trace in (live, reloaded):
        assert CONTEXT_FULL in assistant_markdown("ab", "complete", trace)
    plain = ReplyTrace()
    plain.finished = event_to_dict(Finished(reason="length", token_ids=(1,), text="a", acceptance_lengths=(1,),
                                            prompt_tokens=3, prefill_ms=1.0, decode_ms=1.0, total_ms=2.0, cycles=1))
    assert CONTEXT_FULL not in assistant_markdown("a", "complete", plain)


def test_the_api_refuses_an_empty_prompt_with_the_shared_message():
    import httpx

    from tests.fake_engine import FakeEngine, fake_studio
    from tests.test_network import free_port

    studio = fake_studio(FakeEngine())
    studio.host.start().result(timeout=10)
    studio.demo.launch(**studio.launch_kwargs(server_port=free_port(), prevent_thread_lock=True, quiet=True,
                                              inbrowser=False))
    base = studio.demo.local_url.rstrip("/")
    try:
        with httpx.Client(timeout=30) as http:
            for route, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "  "}]}),
                                ("/v1/chat/completions", {"messages": [{"role": "system", "content": "hi"}]}),
                                ("/v1/completions", {"prompt": ""}), ("/v1/completions", {"prompt": "\n\t"})):
                response = http.post(base + route, json={"model": "fake-coder", **body})
                assert response.status_code == 400, (route, body, response.text)
                error = response.json()["error"]
                assert error["message"] == EMPTY_PROMPT and error["code"] == "empty_prompt"
            ok = http.post(base + "/v1/completions", json={"model": "fake-coder", "prompt": "def f():", "max_tokens": 5})
            assert ok.status_code == 200 and ok.json()["dflash"]["finish_note"] == ""
    finally:
        studio.close()


def test_session_analytics_number_replies_1_2_3_and_plot_them_in_order():
    from tests.storage_helpers import make_cycle
    from ui.teach.analytics import session_analytics, table_rows, tau_over_time_chart

    store = SessionStore()
    session = store.create_session("analytics")
    for n in range(3):
        store.add_message(session, "user", f"q{n}")
        reply = store.start_reply(session, model="m")
        with store.reply_writer(reply) as writer:
            writer.add_cycle(make_cycle(1, accepted=n + 1))
            writer.set_content("def f(): pass")
            writer.finish("complete", stats={"new_tokens": n + 3})
    data = session_analytics(store, session)
    assert [row[0] for row in table_rows(data)] == [1, 2, 3]  # not the message indexes 2, 4, 6
    figure = tau_over_time_chart(data)
    assert sorted({x for trace in figure["data"] for x in trace["x"]}) == [1, 2, 3]
    assert figure["layout"]["xaxis"]["title"]["text"] == "reply (in order)"


def test_every_stat_in_the_strip_says_what_it_means():
    import re

    from ui.chat.render import stats_html

    page = stats_html(None)
    cells = re.findall(r'data-stat="([^"]+)" title="([^"]*)"', page)
    assert len(cells) == 7 and all(help_text for _, help_text in cells)
    fallback = dict(cells)["fallback"]
    assert "full: drafting whole blocks" in fallback and "reduced:" in fallback and "off:" in fallback


def test_the_compare_table_has_no_empty_column():
    import re

    from ui.teach.compare import Comparison, Run
    from ui.teach.render import compare_html

    stored, plain = Run("stored reply", "ab", (1, 2), 10.0, cycles=1, mean_tau=2.0), Run("plain", "ab", (1, 2), 5.0, cycles=2)
    page = compare_html(Comparison(stored, plain, None, 0.0))
    headers = re.findall(r"<th>([^<]*)</th>", page)
    assert "" not in headers and len(headers) == 5
    assert all(len(re.findall(r"<td>", row)) == 5 for row in re.findall(r"<tr><td>.*?</tr>", page))
    failed = compare_html(Comparison(stored, Run("plain", error="out of memory"), None, 0.0))
    assert "<th>error</th>" in failed and "out of memory" in failed


def test_a_device_torch_cannot_use_is_one_clear_line(capsys):
    import torch

    devices = ["foo"] + ([] if torch.cuda.is_available() else ["cuda"])
    for device in devices:
        assert main(["generate", "--device", device, "--max-new-tokens", "4", "hi"]) == 2, device
        err = capsys.readouterr().err
        assert err.startswith("dflash-studio: error: --device ") and device in err and "Traceback" not in err, err


def test_a_long_prompt_is_tokenized_without_the_tokenizers_length_warning():
    import logging

    from engine.loading import load_target
    from engine.shipped import DEFAULT_PAIR, pair_dirs

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        _, tokenizer = load_target(pair_dirs(DEFAULT_PAIR)[0], torch.device("cpu"), torch.float32)
        ids = tokenizer("def f(x): return x + 1\n" * 400)["input_ids"]  # past the tokenizer file's 1024
    finally:
        logger.removeHandler(handler)
    assert len(ids) > 1024
    assert not [r for r in records if "sequence length is longer" in r.getMessage()]


@pytest.mark.parametrize("argv, says", [
    (["bench", "--repeat", "0"], "bench: error: argument --repeat: must be at least 1 (got 0)"),
    (["bench", "--costs", "--context", "-5"], "bench: error: argument --context: must be at least 1 (got -5)"),
    (["bench", "--limit", "0"], "argument --limit: must be at least 1 (got 0)"),
    (["generate", "--threads", "-1", "hi"], "generate: error: argument --threads: must be at least 1 (got -1)"),
    (["serve", "--threads", "two"], "argument --threads: 'two' is not an integer"),
])
def test_a_count_out_of_range_is_refused_by_its_option(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_bench_save_runs_needs_replay_and_a_folder_to_write_in(tmp_path, capsys):
    assert main(["bench", "--save-runs", str(tmp_path / "runs.json")]) == 2
    assert main(["bench", "--replay", "--save-runs", str(tmp_path / "no" / "runs.json")]) == 2
    assert main(["bench", "--replay", "--save-runs", str(tmp_path)]) == 2
    first, second, third = capsys.readouterr().err.strip().splitlines()
    assert first == "dflash-studio: error: --save-runs writes what --replay records: add --replay, or leave --save-runs out"
    assert second == f"dflash-studio: error: --save-runs {tmp_path / 'no' / 'runs.json'}: no such folder to write it in"
    assert third == (f"dflash-studio: error: --save-runs {tmp_path} is a directory; give a file, such as "
                     f"{tmp_path / 'runs.json'}")
