"""pass@1 on requests with unit tests (training.pass1, `train eval --pass1`): the held-out
set, the sandbox that runs a reply's code, strict and lenient matching, the stop rule and the
command on a shipped pair."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from app.cli import main as cli
from training import draft_prompts, request_data
from app.cmd_train import format_pass1_pair, pass1_set_names
from engine.errors import InvalidRequestError
from engine.events import Finished
from training.pass1 import (EDITS_B_FILE, EDITS_FILE, PASS1_B_FILE, PASS1_C_FILE, PASS1_FILE, PairReplies, SandboxLimits, Pass1Task, chats,
                                   check_reply, cut_after_first_definition, pair_replies, pick_function, read_tasks,
                                   reply_code, run_tests, score_pair, standalone)
from training.task_families import all_tasks

ROOT = Path(__file__).resolve().parents[1]
PASS1 = ROOT / "assets" / "prompts" / PASS1_FILE
REQUEST_PAIR = ROOT / "assets" / "models" / "tiny-coder-requests"


@pytest.fixture(scope="module")
def tasks():
    return read_tasks(PASS1)


# ---------------------------------------------------------------- the set


def test_the_set_is_simple_requests_with_tests_and_chats_of_three(tasks):
    assert 30 <= len(tasks) <= 60 and len({t.name for t in tasks}) == len(tasks)
    for task in tasks:
        assert task.entry_point.isidentifier() and len(task.tests) >= 2, task.name
        assert all("candidate(" in test for test in task.tests), task.name
        assert "\n" not in task.prompt and "def " not in task.prompt, task.name  # a one-line request in words
    conversations = chats(tasks)
    assert len(conversations) >= 10 and all(len(chat) == 3 for chat in conversations)


def test_every_reference_solution_passes_and_a_do_nothing_reply_fails_every_task(tasks):
    for task in tasks:
        assert check_reply(task, task.solution, lenient=False).passed, task.name
        wrong = f"def {task.entry_point}(*args):\n    return None\n"
        outcome = check_reply(task, wrong, lenient=False)
        assert not outcome.passed and ("AssertionError" in outcome.outcome or "TypeError" in outcome.outcome), task.name


def test_no_request_is_a_training_request_and_the_draft_guard_knows_the_set(tasks):
    """Held out like the other evaluation sets: no request is any phrasing of a task the request
    target was trained on (its topics may be common tasks: the report splits them), and draft
    training drops prompts that share a request's key words (EvalGuard over EVAL_SETS)."""
    def norm(text: str) -> str:
        return text.lower().strip().rstrip(".?!").strip()

    phrasings = {norm(request_data.phrase(t.request, template)) for t in all_tasks()
                 for template in request_data.PHRASINGS + request_data.CLASS_PHRASINGS}
    assert not [t.name for t in tasks if norm(t.prompt) in phrasings]
    assert PASS1_FILE in draft_prompts.EVAL_SETS
    guard = draft_prompts.EvalGuard.from_prompts(draft_prompts.eval_prompt_texts())
    assert not any(guard.admits(t.prompt) for t in tasks)


# ---------------------------------------------------------------- matching and the stop rule


def test_strict_needs_the_name_lenient_takes_the_only_function():
    renamed = "def backwards(text):\n    return text[::-1]\n"
    assert pick_function(renamed, "reverse_string", lenient=False) is None
    assert pick_function(renamed, "reverse_string", lenient=True) == "backwards"
    two = renamed + "\n\ndef helper(x):\n    return x\n"
    assert pick_function(two, "reverse_string", lenient=True) is None  # which one? neither
    assert pick_function(two + "\ndef reverse_string(s):\n    return s\n", "reverse_string", lenient=False) == "reverse_string"
    assert pick_function("def broken(:\n", "broken", lenient=True) is None
    task = Pass1Task("t", "Reverse a string.", "reverse_string", ("assert candidate('ab') == 'ba'",))
    assert not check_reply(task, renamed, lenient=False).passed
    assert check_reply(task, renamed, lenient=True).passed


def test_reply_code_takes_a_fenced_block_and_the_stop_rule_cuts_after_the_first_definition():
    assert reply_code("Here:\n```python\ndef f():\n    return 1\n```\nDone.") == "def f():\n    return 1\n"
    assert reply_code("def f():\n    return 1") == "def f():\n    return 1"
    reply = "def f(x):\n    y = x\n\n    return y\n\nprint(f(2))\ndef g(:\n"
    assert cut_after_first_definition(reply) == "def f(x):\n    y = x\n\n    return y\n"
    assert reply.startswith(cut_after_first_definition(reply))  # a prefix: what stopping there would give
    decorated = "import math\n\ndef f(x):\n    return math.sqrt(x)\nf(4)"
    assert cut_after_first_definition(decorated) == "import math\n\ndef f(x):\n    return math.sqrt(x)\n"
    assert cut_after_first_definition("no code at all") == "no code at all"
    task = Pass1Task("t", "Square root.", "f", ("assert candidate(4) == 2",))
    assert not check_reply(task, decorated + "(\n", lenient=False).passed  # the trailing junk does not parse
    assert check_reply(task, cut_after_first_definition(decorated + "(\n"), lenient=False).passed


# ---------------------------------------------------------------- the sandbox


def test_the_sandbox_stops_loops_and_memory_hogs_and_has_no_network_stdin_or_main():
    limits = SandboxLimits(timeout_s=6.0, cpu_s=1, memory_mb=512)
    start = time.time()
    loop = run_tests("def f(x):\n    while True:\n        pass\n", "f", ["assert candidate(1)"], limits)
    assert not loop.passed and time.time() - start < 6.0
    hog = run_tests("def f(x):\n    return bytearray(2 * 1024 ** 3)\n", "f", ["assert candidate(1)"], limits)
    assert not hog.passed and "MemoryError" in hog.outcome
    net = run_tests("import socket\ndef f(x):\n    return x\n", "f", ["assert candidate(1)"], limits)
    assert not net.passed and "socket" in net.outcome
    stdin = run_tests("name = input()\ndef f(x):\n    return x\n", "f", ["assert candidate(1)"], limits)
    assert not stdin.passed and "EOFError" in stdin.outcome
    main = 'def f(x):\n    return x\nif __name__ == "__main__":\n    raise SystemExit(3)\n'
    assert run_tests(main, "f", ["assert candidate(1) == 1"], limits).passed
    exits = run_tests("import sys\nsys.exit(0)\ndef f(x):\n    return x\n", "f", ["assert candidate(1)"], limits)
    assert not exits.passed


def test_the_sandbox_writes_only_in_its_own_temporary_directory():
    code = ("import os\ndef f(name):\n    with open(name, 'w') as fh:\n        fh.write('x')\n"
            "    return os.getcwd()\n")
    run = run_tests(code, "f", [f"assert candidate('out-pass1.txt') != {str(Path.cwd())!r}",
                                "import os\nassert os.path.exists('out-pass1.txt')"])
    assert run.passed, run.outcome
    assert not (Path.cwd() / "out-pass1.txt").exists()
    big = run_tests("def f(x):\n    open('big', 'w').write('x' * 5_000_000)\n", "f", ["candidate(1)"],
                    SandboxLimits(file_mb=1))
    assert not big.passed  # the file size limit


# ---------------------------------------------------------------- scoring


def test_score_pair_counts_alone_and_follow_ups_strict_and_lenient(tasks):
    first, second, third = chats(tasks)[0]
    replies = PairReplies(
        alone={t.name: (t.solution, 20) for t in tasks},
        followups=[[(second.name, second.solution.replace(f"def {second.entry_point}(", "def renamed("), 20),
                    (third.name, "def oops(:\n", 5)]],
    )
    report = score_pair(tasks, replies, log=lambda _line: None)
    n = len(tasks)
    assert report["alone"] == {"n": n, "strict": n, "lenient": n, "cut_strict": n, "cut_lenient": n}
    assert report["followups"] == {"n": 2, "strict": 0, "lenient": 1, "cut_strict": 0, "cut_lenient": 1}
    assert report["followups_by_turn"]["2"]["lenient"] == 1 and report["followups_by_turn"]["3"]["lenient"] == 0
    assert report["followup_requests_alone"]["strict"] == 2
    trained, other = report["alone_trained_topic"], report["alone_other_topic"]
    assert trained["n"] + other["n"] == n and trained["n"] > 0 and other["n"] > 0


# ---------------------------------------------------------------- the second set and the edit chats

SECOND = ROOT / "assets" / "prompts" / PASS1_B_FILE
EDITS = ROOT / "assets" / "prompts" / EDITS_FILE


def _norm(text: str) -> str:
    return " ".join(text.lower().strip().rstrip(".?!").split())


def assert_52_one_line_requests(rows, prefix: str) -> None:
    assert len(rows) == 52 and len({t.name for t in rows}) == 52
    assert all(t.name.startswith(prefix) and not t.edit and t.chat is None for t in rows)
    for task in rows:
        assert task.entry_point.isidentifier() and 2 <= len(task.tests) <= 6, task.name
        assert all("candidate(" in test for test in task.tests), task.name
        assert "\n" not in task.prompt and "def " not in task.prompt, task.name


def test_the_second_set_is_52_new_one_line_requests(tasks):
    second = read_tasks(SECOND)
    assert_52_one_line_requests(second, "p2_")
    assert not {_norm(t.prompt) for t in second} & {_norm(t.prompt) for t in tasks}  # written apart
    assert not {t.entry_point for t in second} & {t.entry_point for t in tasks}  # other tasks, not rewordings


def test_the_third_set_is_52_one_line_requests_on_functions_no_other_set_asks_for(tasks):
    third = read_tasks(ROOT / "assets" / "prompts" / PASS1_C_FILE)
    assert_52_one_line_requests(third, "p3_")
    assert len({t.entry_point for t in third}) == 52
    others = [row for name in (PASS1_FILE, PASS1_B_FILE, EDITS_FILE, EDITS_B_FILE)
              for row in read_tasks(ROOT / "assets" / "prompts" / name)]
    assert not {t.entry_point for t in third} & {t.entry_point for t in others}
    assert not {_norm(t.prompt) for t in third} & {_norm(t.prompt) for t in others}


@pytest.mark.parametrize("set_file", [PASS1_B_FILE, PASS1_C_FILE, EDITS_FILE, EDITS_B_FILE])
def test_no_new_request_is_a_training_request(set_file):
    """Held out like the first set: no request of the new sets is a phrasing the request target trained on."""
    phrasings = {_norm(request_data.phrase(t.request, template)) for t in all_tasks()
                 for template in request_data.PHRASINGS + request_data.CLASS_PHRASINGS}
    assert not [t.name for t in read_tasks(ROOT / "assets" / "prompts" / set_file) if _norm(t.prompt) in phrasings]


@pytest.mark.parametrize("set_file", [EDITS_FILE, EDITS_B_FILE])
def test_the_edit_chats_edit_the_function_of_the_turn_before(set_file):
    edits = read_tasks(ROOT / "assets" / "prompts" / set_file)
    conversations = chats(edits)
    assert len(conversations) == 20 and all(2 <= len(chat) <= 3 for chat in conversations)
    assert sum(len(chat) for chat in conversations) == len(edits)  # every row belongs to a chat
    for chat in conversations:
        assert not chat[0].edit and all(task.edit for task in chat[1:]), chat[0].chat
        for before, after in zip(chat, chat[1:]):
            # the name changes only where the request gives the new one ("call it X instead")
            assert after.entry_point == before.entry_point or after.entry_point in after.prompt, after.name
        for task in chat:
            assert "\n" not in task.prompt and "def " not in task.prompt and len(task.tests) >= 2, task.name
    assert any(t.entry_point != chat[0].entry_point for chat in conversations for t in chat)  # renames


@pytest.mark.parametrize("set_file", [PASS1_B_FILE, PASS1_C_FILE, EDITS_FILE, EDITS_B_FILE])
def test_every_new_reference_solution_passes_its_own_tests_and_a_do_nothing_reply_fails(set_file):
    for task in read_tasks(ROOT / "assets" / "prompts" / set_file):
        run = run_tests(task.solution, task.entry_point, task.tests)
        assert run.passed, (task.name, run.outcome)
        wrong = run_tests(f"def {task.entry_point}(*args, **kwargs):\n    return None\n", task.entry_point, task.tests)
        assert not wrong.passed and ("AssertionError" in wrong.outcome or "TypeError" in wrong.outcome), task.name


@pytest.mark.parametrize("set_file", [EDITS_FILE, EDITS_B_FILE])
def test_an_edit_fails_the_function_as_it_was_before_the_edit(set_file):
    """Each edit's tests check the new behaviour: the previous turn's solution fails them (a
    rename alone passes leniently, where the only function is taken whatever its name)."""
    for chat in chats(read_tasks(ROOT / "assets" / "prompts" / set_file)):
        for before, after in zip(chat, chat[1:]):
            old = Pass1Task(after.name, after.prompt, after.entry_point, after.tests)
            assert not check_reply(old, before.solution, lenient=False).passed, after.name
            if after.entry_point == before.entry_point:
                assert not check_reply(old, before.solution, lenient=True).passed, after.name


def test_an_edit_row_must_follow_a_turn_of_its_chat(tmp_path):
    row = {"name": "e", "prompt": "Now make it ignore case.", "entry_point": "f", "tests": ["assert candidate(1)"]}
    other = {**row, "name": "o", "prompt": "Write a function f."}
    path = tmp_path / "set.jsonl"
    for rows in ([{**row, "edit": True}], [other, {**row, "edit": True}], [{**row, "edit": True, "chat": "c1"}],
                 [{**other, "chat": "c2"}, {**row, "edit": True, "chat": "c1"}]):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(InvalidRequestError, match="edits the previous turn"):
            read_tasks(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in [{**other, "chat": "c1"}, {**row, "edit": True, "chat": "c1"}]))
    assert [t.edit for t in read_tasks(path)] == [False, True]


class ScriptedEngine:
    """Stands in for a pair: answers each request with the reply ``answer`` gives for its
    conversation, and records every conversation it was asked to answer."""

    def __init__(self, answer):
        self.answer, self.asked = answer, []

    def encode(self, messages):
        self.asked.append(list(messages))
        return [len(self.asked) - 1]

    def generate(self, ids, sampling, _stop, slot_details=False, speculative=True):
        text = self.answer(self.asked[ids[0]])
        yield Finished("stop", (1, 2, 3), text, (2,), 3, 0.0, 0.0, 0.0, 1)


def test_edits_are_asked_and_judged_only_in_their_chat_and_an_ignored_edit_fails():
    edits = read_tasks(EDITS)
    by_prompt = {task.prompt: task for task in edits}
    right = ScriptedEngine(lambda messages: by_prompt[messages[-1]["content"]].solution)
    replies = pair_replies(right, edits, log=lambda _line: None)
    alone_asked = {m[0]["content"] for m in right.asked if len(m) == 1}
    assert alone_asked == {t.prompt for t in edits if not t.edit}  # no edit is ever sent as a new chat
    for messages in right.asked:
        if by_prompt[messages[-1]["content"]].edit:  # an edit comes after the turns of its chat, replies included
            assert len(messages) >= 3 and [m["role"] for m in messages[-3:]] == ["user", "assistant", "user"]
    report = score_pair(edits, replies, log=lambda _line: None)
    by_name = {task.name: task for task in edits}
    assert all(by_name[r["name"]].edit == (r["turn"] > 1) for r in report["replies"])  # edits judged in turn 2+ only
    n_edits = sum(t.edit for t in edits)
    assert report["edit_followups"] and report["alone"]["n"] == len(edits) - n_edits
    assert report["followups"]["strict"] == report["followups"]["n"] == n_edits  # the sandbox ran every solution
    assert report["whole_chats"]["strict"] == report["whole_chats"]["n"] == 20

    def ignores_the_edit(messages):  # answers every turn with the chat's first solution
        return by_prompt[messages[0]["content"]].solution

    report = score_pair(edits, pair_replies(ScriptedEngine(ignores_the_edit), edits, log=lambda _line: None),
                        log=lambda _line: None)
    assert report["followups"]["strict"] == 0 and report["whole_chats"]["lenient"] == 0
    assert report["alone"]["strict"] == len(edits) - n_edits


def test_pass1_sets_option_chooses_the_shipped_sets_and_refuses_unknown_names(capsys):
    from app.cmd_train import pass1_sets

    chosen = pass1_sets(argparse.Namespace(prompts=None, pass1_sets=None))
    assert [path.name for _name, path in chosen] == [PASS1_FILE, PASS1_B_FILE, PASS1_C_FILE, EDITS_FILE, EDITS_B_FILE]
    assert all(path.is_file() for _name, path in chosen)
    only = pass1_sets(argparse.Namespace(prompts=None, pass1_sets=pass1_set_names("edits, requests_b")))
    assert [path.name for _name, path in only] == [EDITS_FILE, PASS1_B_FILE]
    with pytest.raises(SystemExit):
        cli(["train", "eval", "--pass1", "--pass1-sets", "requests,nonsense"])
    assert "nonsense" in capsys.readouterr().err


def test_the_printed_summary_gives_strict_before_lenient_for_every_set(tasks):
    requests, edits = tasks[:6], [t for t in read_tasks(EDITS) if t.chat in {"e01", "e02", "e03"}]
    reports = []
    for name, set_tasks in (("requests", requests), ("edits", edits)):
        replies = PairReplies(alone={t.name: (t.solution, 9) for t in standalone(set_tasks)},
                              followups=[[(t.name, "def nothing(:\n", 4) for t in chat[1:]] for chat in chats(set_tasks)])
        reports.append({"pair": "p", "set": name, "prompts": name, "block_size": 8, "max_new_tokens": 9,
                        "generation_seconds": 1.0, **score_pair(set_tasks, replies, log=lambda _line: None)})
    text = format_pass1_pair(reports)
    figures = [line for line in text.splitlines() if "strict" in line and "lenient" in line]
    assert len(figures) >= 6 and all(line.index("strict") < line.index("lenient") for line in figures)
    # every request alone passed (its own solution), no follow-up or edit did (none parses)
    n_alone, n_follow = len(standalone(requests)), len(requests) - len(chats(requests))
    n_open, n_edits = len(standalone(edits)), sum(t.edit for t in edits)
    headline = text.splitlines()[0]
    assert f"requests: alone {n_alone}/{n_alone} / {n_alone}/{n_alone}, follow-ups 0/{n_follow} / 0/{n_follow}" in headline
    assert f"edits: alone {n_open}/{n_open} / {n_open}/{n_open}, edits 0/{n_edits} / 0/{n_edits}" in headline


@pytest.mark.skipif(not (REQUEST_PAIR / "draft").is_dir(), reason="the request pair is not shipped here")
def test_train_eval_pass1_on_the_request_pair(tmp_path, tasks, capsys):
    """The command end to end on two requests of one chat (a real pair, short replies): the
    report counts what the replies' outcomes say, and DFlash's greedy replies equal plain decoding's."""
    prompts = tmp_path / "two.jsonl"
    rows = [json.loads(line) for line in PASS1.read_text().splitlines()[:2]]
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "report.json"
    assert cli(["train", "eval", "--pass1", "--target", str(REQUEST_PAIR / "target"), "--draft",
                str(REQUEST_PAIR / "draft"), "--prompts", str(prompts), "--max-new-tokens", "48",
                "--compare-plain", "--device", "cpu", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])[0]
    assert summary["pair"] == "tiny-coder" and summary["block_size"] > 1  # the menu's name for this folder
    assert summary["identical"] == "3/3"  # two requests alone and one follow-up
    report = json.loads(out.read_text())[0]
    alone = [r for r in report["replies"] if r["turn"] == 1]
    # each stored reply run again through the sandbox here: the report's verdicts and its tally agree with it
    by_name = {task.name: task for task in tasks}
    for mode in ("strict", "lenient"):
        runs = [check_reply(by_name[r["name"]], r["reply"], lenient=mode == "lenient") for r in alone]
        assert [r[mode] for r in alone] == [run.outcome for run in runs]
        assert summary["alone"][mode] == sum(run.passed for run in runs)
    assert summary["followups"]["n"] == 1 and report["replies"][-1]["turn"] == 2


@pytest.mark.parametrize("set_file", [EDITS_FILE, EDITS_B_FILE])
def test_no_edit_of_a_held_out_chat_is_a_sentence_the_training_edits_say(set_file):
    """The edit turns are held out from the training follow-ups' own sentences (a template with a
    function's own names in it, "Call it X instead.", may still match: those are judged on
    functions the training never edited)."""
    from training import followups

    said = {_norm(ask) for edit in followups.EDITS for ask in edit.followups if "{" not in ask}
    said |= {_norm(ask) for ask in followups.DOCSTRING_FOLLOWUPS}
    asked = [t for t in read_tasks(ROOT / "assets" / "prompts" / set_file) if t.edit]
    assert asked and not [t.name for t in asked if _norm(t.prompt) in said]


@pytest.mark.parametrize("content, says", [
    ("not json\n", "pass.jsonl:1: each line must be a JSON object"),
    ('{"prompt": "Write f."}\n', "missing 'name', 'entry_point', 'tests'"),
    ('{"name": "a", "prompt": "p", "entry_point": "f", "tests": "assert candidate(1)"}\n',
     "'tests' must be a non-empty list of strings"),
    ('{"name": "a", "prompt": "p", "entry_point": "f(x)", "tests": ["assert candidate(1)"]}\n', "is not a Python name"),
    ("[1, 2]\n", "a line holds list, not an object"),
    ("\n\n", "holds no request"),
])
def test_a_malformed_set_is_refused_in_one_line_before_any_model_loads(tmp_path, capsys, content, says):
    path = tmp_path / "pass.jsonl"
    path.write_text(content)
    assert cli(["train", "eval", "--pass1", "--prompts", str(path), "--target", str(tmp_path / "no-such-target")]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_train_eval_names_a_missing_set_or_target_in_one_line(tmp_path, capsys):
    assert cli(["train", "eval", "--pass1", "--prompts", str(tmp_path / "none.jsonl")]) == 2
    assert cli(["train", "eval", "--target", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("dflash-studio: error: cannot read the pass@1 set") and "none.jsonl" in err[0]
    assert err[1] == f"dflash-studio: error: target not found: {tmp_path / 'none'} (no such directory)"


def test_train_eval_scores_the_shipped_target_on_a_chat_request_and_a_code_prefix(tmp_path, capsys):
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text(json.dumps({"name": "rev", "prompt": "Write a function that reverses a string."}) + "\n"
                       + json.dumps({"name": "mean", "prompt": "def mean(values):\n", "raw": True}) + "\n")
    assert cli(["train", "eval", "--target", str(REQUEST_PAIR / "target"), "--prompts", str(prompts),
                "--max-new-tokens", "48", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["chat_requests"] == 1 and summary["code_prefixes"] == 1
    assert summary["chat_parse_define_pct"] == 100.0 and summary["loops"] == 0  # the shipped target writes a function
