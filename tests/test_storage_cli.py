"""`dflash-studio sessions ...` through the real entry point, ``app.cli.main``."""

from __future__ import annotations

import io
import json

import pytest

from app.cli import main
from storage import SessionStore
from tests.storage_helpers import make_cycle


@pytest.fixture
def db_path(tmp_path, monkeypatch):
    monkeypatch.delenv("DFLASH_STUDIO_DB", raising=False)
    path = tmp_path / "sessions.db"
    with SessionStore(path) as store:
        first = store.create_session("Fibonacci", model="tiny-coder")
        store.add_message(first, "user", "write fib")
        reply = store.start_reply(first, model="tiny-coder")
        store.append_cycles(reply, [make_cycle(1, 8, 3), make_cycle(2, 8, 5)])
        store.update_message(reply, content="def fib(n): ...", status="complete", tokens_per_s=42.0)
        second = store.create_session("Quicksort")
        store.add_message(second, "user", "sort this")
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_shows_sessions_most_recent_first(capsys, db_path):
    code, out, err = run(capsys, "sessions", "list", "--db", str(db_path))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "UPDATED", "MSGS", "MODEL", "TITLE"]
    assert [line.split()[0] for line in lines[1:]] == ["2", "1"]
    assert lines[1].endswith("Quicksort") and " 1  -" in lines[1]
    assert lines[2].endswith("Fibonacci") and "tiny-coder" in lines[2]


def test_list_search_and_a_missing_database(capsys, db_path, tmp_path):
    found = run(capsys, "sessions", "list", "--db", str(db_path), "--search", "FIB")[1]
    assert [line.split()[0] for line in found.splitlines()[1:]] == ["1"]  # a title match: the title says it
    found = run(capsys, "sessions", "list", "--db", str(db_path), "--search", "sort this")[1].splitlines()
    assert found[1].split()[0] == "2" and found[2].strip() == "[sort] [this]"  # a message match, marked
    assert run(capsys, "sessions", "list", "--db", str(db_path), "--search", "zebra") == (
        0, "no sessions matching 'zebra'\n", "")
    missing = tmp_path / "nowhere" / "sessions.db"
    assert run(capsys, "sessions", "list", "--db", str(missing)) == (
        0, f"no sessions yet ({missing} does not exist)\n", "")
    assert not missing.parent.exists()  # reading creates nothing


def test_db_defaults_to_the_environment_variable(capsys, db_path, monkeypatch):
    monkeypatch.setenv("DFLASH_STUDIO_DB", str(db_path))
    code, out, _ = run(capsys, "sessions", "list")
    assert code == 0 and "Fibonacci" in out


def test_show_prints_messages_with_reply_stats(capsys, db_path):
    code, out, err = run(capsys, "sessions", "show", "1", "--db", str(db_path))
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == "session 1 · Fibonacci"
    assert "\nuser · complete\nwrite fib\n" in out
    assert "\nreply 1 · complete · 10 tokens in 2 cycles · mean τ 5.00 · 42.0 tok/s\ndef fib(n): ...\n" in out


def test_unknown_session_is_one_clear_line_and_exit_code_2(capsys, db_path):
    for command in (["show"], ["delete", "--yes"], ["export"]):
        assert run(capsys, "sessions", *command, "9", "--db", str(db_path)) == (
            2, "", "dflash-studio: error: session 9 does not exist\n")


def test_export_to_stdout_and_to_a_file_then_import_into_another_database(capsys, db_path, tmp_path):
    code, out, _ = run(capsys, "sessions", "export", "--db", str(db_path))
    assert code == 0
    everything = json.loads(out)
    assert [s["title"] for s in everything["sessions"]] == ["Fibonacci", "Quicksort"]
    assert len(everything["sessions"][0]["messages"][1]["cycles"]) == 2

    export_file = tmp_path / "out" / "fib.json"
    assert run(capsys, "sessions", "export", "1", "-o", str(export_file), "--db", str(db_path)) == (
        0, "", f"exported 1 session to {export_file}\n")
    assert [s["title"] for s in json.loads(export_file.read_text())["sessions"]] == ["Fibonacci"]

    other = tmp_path / "other.db"
    assert run(capsys, "sessions", "import", str(export_file), "--db", str(other)) == (
        0, f"imported 1 session from {export_file}: 1 new (+2 messages)\n", "")
    assert run(capsys, "sessions", "import", str(export_file), "--db", str(other)) == (
        0, f"imported 1 session from {export_file}: 1 already up to date\n", "")
    with SessionStore(other) as store:
        assert store.export_all()["sessions"] == json.loads(export_file.read_text())["sessions"]


def test_import_from_stdin(capsys, db_path, tmp_path, monkeypatch):
    with SessionStore(db_path, recover=False) as store:
        document = store.export_all()
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(document)))
    assert run(capsys, "sessions", "import", "-", "--db", str(tmp_path / "new.db"))[:2] == (
        0, "imported 2 sessions from stdin: 2 new (+3 messages)\n")


def test_exports_saved_by_windows_tools_import(capsys, db_path, tmp_path):
    """Notepad may add a UTF-8 byte-order mark; PowerShell 5's `>` writes UTF-16."""
    code, out, _ = run(capsys, "sessions", "export", "1", "--db", str(db_path))
    for name, data in (("bom.json", b"\xef\xbb\xbf" + out.encode()), ("utf16.json", out.encode("utf-16"))):
        (tmp_path / name).write_bytes(data)
        assert run(capsys, "sessions", "import", str(tmp_path / name), "--db", str(tmp_path / f"{name}.db"))[:2] == (
            0, f"imported 1 session from {tmp_path / name}: 1 new (+2 messages)\n"), name
    (tmp_path / "latin1.json").write_bytes('{"title": "caf\u00e9"}'.encode("latin-1"))
    code, out, err = run(capsys, "sessions", "import", str(tmp_path / "latin1.json"), "--db", str(db_path))
    assert (code, out) == (2, "") and "is not UTF-8" in err and "Traceback" not in err


def test_a_missing_or_unreadable_bench_prompt_file_is_one_clear_line(capsys):
    assert main(["bench", "--prompts", "no/such/prompts.jsonl", "--limit", "1"]) == 2
    assert "cannot read the prompt file no/such/prompts.jsonl" in capsys.readouterr().err


def test_bad_import_files_fail_clearly_and_import_nothing(capsys, db_path, tmp_path):
    not_json = tmp_path / "notes.txt"
    not_json.write_text("hello")
    code, out, err = run(capsys, "sessions", "import", str(not_json), "--db", str(db_path))
    assert (code, out) == (2, "") and err.startswith(f"dflash-studio: error: {not_json} is not JSON (")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"format": "dflash-studio-sessions", "version": 1, "sessions": [{"uuid": "x"}]}))
    assert run(capsys, "sessions", "import", str(wrong), "--db", str(db_path)) == (
        2, "", "dflash-studio: error: not a valid dflash-studio sessions export: sessions[0]: missing 'title'\n")
    code, _, err = run(capsys, "sessions", "import", str(tmp_path / "absent.json"), "--db", str(db_path))
    assert code == 2 and err == f"dflash-studio: error: No such file or directory: {tmp_path / 'absent.json'}\n"
    with SessionStore(db_path) as store:
        assert store.count_sessions() == 2


def test_delete_needs_confirmation_unless_yes(capsys, db_path):
    code, out, err = run(capsys, "sessions", "delete", "1", "--db", str(db_path))
    assert (code, out) == (2, "")
    assert err == (
        "dflash-studio: error: not deleting session 1 'Fibonacci' (2 messages) without confirmation; pass --yes\n"
    )
    assert run(capsys, "sessions", "delete", "1", "--yes", "--db", str(db_path)) == (
        0, "deleted session 1 'Fibonacci' (2 messages)\n", "")
    with SessionStore(db_path) as store:
        assert [s["id"] for s in store.list_sessions()] == [2]
        assert store.database["cycles"].count == 0


def test_delete_all_needs_confirmation_and_removes_every_session(capsys, db_path):
    code, _, err = run(capsys, "sessions", "delete", "--all", "--db", str(db_path))
    assert code == 2 and "not deleting all 2 sessions without confirmation" in err
    assert run(capsys, "sessions", "delete", "--all", "--yes", "--db", str(db_path)) == (0, "deleted all 2 sessions\n", "")
    with SessionStore(db_path) as store:
        assert store.count_sessions() == 0 and store.database["messages"].count == 0
    with pytest.raises(SystemExit):  # one of ID or --all is required
        run(capsys, "sessions", "delete", "--db", str(db_path))
    assert "one of the arguments ID --all is required" in capsys.readouterr().err


def test_cli_leaves_a_streaming_reply_alone(capsys, db_path):
    with SessionStore(db_path) as app_store:
        reply = app_store.start_reply(1)
    run(capsys, "sessions", "list", "--db", str(db_path))
    with SessionStore(db_path, recover=False) as store:
        assert store.get_message(reply)["status"] == "streaming"


def test_sessions_alone_prints_help(capsys):
    code, out, _ = run(capsys, "sessions")
    assert code == 1 and "list" in out and "import" in out


def test_list_never_cuts_a_model_name(capsys, tmp_path):
    path = tmp_path / "models.db"
    with SessionStore(path) as store:
        store.create_session("embedded", model="tiny-coder (embedded)")
        store.create_session("long", model="Qwen3-8B + z-lab/Qwen3-8B-DFlash-b16")
    out = run(capsys, "sessions", "list", "--db", str(path))[1]
    assert "tiny-coder (embedded) " in out and "Qwen3-8B + z-lab/Qwen3-8B-DFlash-b16  long" in out


def test_show_counts_a_replys_tokens_as_the_page_does(capsys, tmp_path):
    from tests.storage_helpers import make_cycle

    path = tmp_path / "tokens.db"
    with SessionStore(path) as store:
        session = store.create_session("count")
        store.add_message(session, "user", "q")
        reply = store.start_reply(session, model="m")
        cycles = [make_cycle(i, accepted=3) for i in range(1, 4)]  # 3 cycles of tau 4: 12 tokens
        with store.reply_writer(reply) as writer:
            for cycle in cycles:
                writer.add_cycle(cycle)
            writer.set_content("x" * 13)
            writer.finish("complete", stats={"new_tokens": 13, "tokens_per_s": 10.0})  # + the prefill token
    out = run(capsys, "sessions", "show", str(session), "--db", str(path))[1]
    assert "13 tokens in 3 cycles" in out  # the chat's footer says 13 too (the prefill token included)
    assert out.splitlines()[2].startswith("13 tokens in 3 cycles")  # and so does the session's total


def test_show_names_the_model_of_each_reply_another_model_made(capsys, tmp_path, monkeypatch):
    """A session whose model changed keeps the newer name; the older replies say who wrote them."""
    monkeypatch.delenv("DFLASH_STUDIO_DB", raising=False)
    path = tmp_path / "sessions.db"
    with SessionStore(path) as store:
        session = store.create_session("Vowels", model="tiny-coder")
        for model, text in (("tiny-coder", "def count_vowels(s): ..."), ("tiny-coder-fast", "class Tk: pass")):
            store.add_message(session, "user", "write it")
            reply = store.start_reply(session, model=model)
            store.update_message(reply, content=text, status="complete")
        store.update_session_model(session, "tiny-coder-fast")
    code, out, _ = run(capsys, "sessions", "show", str(session), "--db", str(path))
    assert code == 0 and "model tiny-coder-fast · 4 messages" in out
    assert "\nreply 1 · complete · by tiny-coder\ndef count_vowels(s): ...\n" in out
    assert "\nreply 2 · complete\nclass Tk: pass\n" in out
    listed = run(capsys, "sessions", "list", "--db", str(path))[1].splitlines()[1]
    assert "tiny-coder, tiny-coder-fast" in listed  # listed under both models that answered in it


def test_a_session_answered_by_many_models_is_listed_under_several(capsys, tmp_path):
    path = tmp_path / "sessions.db"
    with SessionStore(path) as store:
        session = store.create_session("API · completions", model="m4")
        for model in ("m1", "m2", "m3", "m4", "m2"):
            store.add_message(session, "user", "x")
            reply = store.start_reply(session, model=model)
            store.update_message(reply, content="y", status="complete")
        assert store.reply_models([session]) == {session: ["m1", "m2", "m3", "m4"]}
    listed = run(capsys, "sessions", "list", "--db", str(path))[1].splitlines()[1]
    assert "several models (4)" in listed and "m4" not in listed
