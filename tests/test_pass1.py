"""pass@1 on requests with unit tests (engine.training.pass1, `train eval --pass1`): the held-out
set, the sandbox that runs a reply's code, strict and lenient matching, the stop rule and the
command on a shipped pair."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from app.cli import main as cli
from engine.training import draft_prompts, request_data
from engine.training.pass1 import (PASS1_FILE, PairReplies, SandboxLimits, Pass1Task, chats, check_reply,
                                   cut_after_first_definition, pick_function, read_tasks, reply_code, run_tests,
                                   score_pair)
from engine.training.task_families import all_tasks

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
