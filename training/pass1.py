"""pass@1 on simple requests: does the greedy reply *work*? (`train eval --pass1`)

Each request of ``assets/prompts/requests_pass1.jsonl`` says what a function should do, as a
new user types it ("Write a function that checks if a number is prime."), and carries a few
``assert`` tests that call the function as ``candidate``. The model names the function itself,
so a reply is run two ways:

- **strict**: the function named ``entry_point`` must be defined at the top level;
- **lenient**: that function, or else the only top-level function the reply defines.

The reply's code runs in a child Python (``run_tests``): its own temporary directory, stdin
closed, limits on CPU time, memory, file size and open files (``resource.setrlimit``), a
wall-clock timeout, no network (a network namespace of its own where the system allows one,
and the socket modules refused either way), and ``__name__`` that is not ``"__main__"``.

Rows with the same ``chat`` id, in file order, also make **follow-ups**: the requests sent one
after another in one chat, each with the conversation so far (the model's own replies
included) through the chat template, as the app sends them. A row marked ``"edit": true``
changes the function of the turn before ("now make it raise ValueError for negatives", "call
it X instead"): its tests check the function as it should be after the edit, and it is only
ever judged as a follow-up, since an edit alone asks for nothing.

Five sets ship (``PASS1_SETS``): three of one-line requests (the second written apart from the
first, to see how far a figure on one holds on another; the third written by someone who had read
neither the training data nor the tasks added to it at the same time) and two of conversations
whose later turns edit the previous function (the second written apart from the training edits
and from the first set, after the first set's failures had been read)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

PASS1_FILE = "requests_pass1.jsonl"
PASS1_B_FILE = "requests_pass1_b.jsonl"
PASS1_C_FILE = "requests_pass1_c.jsonl"
EDITS_FILE = "followups_pass1.jsonl"
EDITS_B_FILE = "followups_pass1_b.jsonl"
# the sets `train eval --pass1` scores, by the name its --pass1-sets option takes
PASS1_SETS = {"requests": PASS1_FILE, "requests_b": PASS1_B_FILE, "requests_c": PASS1_C_FILE, "edits": EDITS_FILE,
              "edits_b": EDITS_B_FILE}
RESULT_MARK = "\x00pass1-result\x00"
# CLONE_NEWNET alone (root), else with CLONE_NEWUSER (an unprivileged user namespace)
_NEWNET, _NEWUSER = 0x40000000, 0x10000000


@dataclass(frozen=True)
class Pass1Task:
    name: str
    prompt: str
    entry_point: str
    tests: tuple[str, ...]
    solution: str = ""  # a reference solution: the tests are checked against it
    chat: str | None = None  # rows with the same id, in file order, are one chat's follow-ups
    edit: bool = False  # changes the previous turn's function: judged only as a follow-up


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock, the child's start included
    cpu_s: int = 5
    memory_mb: int = 1024
    file_mb: int = 1
    open_files: int = 64


@dataclass(frozen=True)
class TestRun:
    passed: bool
    outcome: str  # "passed", "does not parse", "no function to call", "timed out", or the first failure


ROW_FORMAT = ("each line must be a JSON object with 'name', 'prompt' and 'entry_point' strings and 'tests', "
              "a list of assert statements (optional: 'solution', 'chat', 'edit')")


def read_tasks(path: Path) -> list[Pass1Task]:
    """The rows of a set; an edit row must follow an earlier turn of its chat (it edits that turn's function)."""
    from engine.errors import InvalidRequestError

    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"cannot read the pass@1 set {path}: {exc}") from exc
    tasks = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                tasks.append(task_from_row(json.loads(line)))
            except (ValueError, TypeError) as exc:
                raise InvalidRequestError(f"{path}:{number}: {ROW_FORMAT} ({exc})") from exc
    if not tasks:
        raise InvalidRequestError(f"{path} holds no request: {ROW_FORMAT}")
    opened: set[str] = set()
    for task in tasks:
        if task.edit and (task.chat is None or task.chat not in opened):
            raise InvalidRequestError(f"{path}: {task.name} edits the previous turn's function, "
                                      "but no earlier row of its chat comes before it")
        if task.chat is not None:
            opened.add(task.chat)
    return tasks


def task_from_row(row) -> Pass1Task:
    """One row of a set, its fields checked (ValueError or TypeError naming the first wrong one)."""
    if not isinstance(row, dict):
        raise TypeError(f"a line holds {type(row).__name__}, not an object")
    missing = [key for key in ("name", "prompt", "entry_point", "tests") if key not in row]
    if missing:
        raise ValueError(f"missing {', '.join(map(repr, missing))}")
    for key in ("name", "prompt", "entry_point"):
        if not isinstance(row[key], str) or not row[key].strip():
            raise ValueError(f"{key!r} must be a non-empty string")
    if not row["entry_point"].isidentifier():
        raise ValueError(f"'entry_point' {row['entry_point']!r} is not a Python name")
    tests = row["tests"]
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError("'tests' must be a non-empty list of strings")
    chat = row.get("chat")
    if chat is not None and not isinstance(chat, str):
        raise ValueError("'chat' must be a string")
    return Pass1Task(row["name"], row["prompt"], row["entry_point"], tuple(tests), str(row.get("solution") or ""),
                     chat, bool(row.get("edit", False)))


def standalone(tasks: list[Pass1Task]) -> list[Pass1Task]:
    """The requests that make sense alone (a new chat): every row but the edits."""
    return [task for task in tasks if not task.edit]


def chats(tasks: list[Pass1Task]) -> list[list[Pass1Task]]:
    """The follow-up conversations: tasks grouped by ``chat`` id, in file order."""
    groups: dict[str, list[Pass1Task]] = {}
    for task in tasks:
        if task.chat:
            groups.setdefault(task.chat, []).append(task)
    return list(groups.values())


# ---------------------------------------------------------------- which code, which function


def reply_code(reply: str) -> str:
    """The code a reply holds: the first fenced block's body when it has one, else the reply."""
    if "```" not in reply:
        return reply
    body = reply.split("```", 2)[1]
    first, _, rest = body.partition("\n")
    return rest if first.strip().isidentifier() or not first.strip() else body


def top_level_functions(code: str) -> list[str] | None:
    """Names of the functions defined at the top level, in order; None when the code does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError):
        return None
    return [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def pick_function(code: str, entry_point: str, lenient: bool) -> str | None:
    """The function the tests call: ``entry_point`` if defined; leniently, else the only one."""
    names = top_level_functions(code)
    if not names:
        return None
    if entry_point in names:
        return entry_point
    return names[0] if lenient and len(names) == 1 else None


def cut_after_first_definition(reply: str) -> str:
    """The reply up to where its first top-level ``def``/``class`` ends: the first later line
    that starts at column 0 (not a decorator, not inside the definition's indented body).
    A stop rule: what greedy decoding would have returned had it stopped there, a prefix of
    the full reply, so greedy DFlash output stays identical to plain decoding."""
    lines = reply.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith(("def ", "async def ", "class "))), None)
    if start is None:
        return reply
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.strip() and not line[:1].isspace() and not line.startswith((")", "]", "}")):
            return "\n".join(lines[:i]).rstrip() + "\n"
    return reply


# ---------------------------------------------------------------- the sandbox

RUNNER = r"""
import io, json, sys
for name in ("socket", "_socket", "ssl", "_ssl"):
    sys.modules[name] = None  # no network, even where no namespace could be made
job = json.loads(sys.stdin.read())
out = sys.__stdout__
sys.stdout = sys.stderr = io.StringIO()
results, error = [], None
try:
    space = {"__name__": "reply", "__builtins__": __builtins__}
    exec(compile(job["code"], "reply.py", "exec"), space)
    candidate = space[job["function"]]
except BaseException as exc:
    error = "the reply's code failed: " + type(exc).__name__ + ": " + str(exc)[:200]
else:
    for test in job["tests"]:
        try:
            exec(compile(test, "test.py", "exec"), {"candidate": candidate})
            results.append("ok")
        except BaseException as exc:
            results.append(test + " -> " + type(exc).__name__ + ": " + str(exc)[:200])
out.write("\n" + MARK + json.dumps({"error": error, "results": results}) + "\n")
out.flush()
"""


def _limit_child(limits: SandboxLimits):
    """preexec_fn of the child: rlimits, then a network namespace of its own when allowed."""
    def apply() -> None:
        import ctypes
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))  # SIGXCPU, then SIGKILL
        memory = limits.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * 2**20,) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_NEWNET) != 0:
            libc.unshare(_NEWNET | _NEWUSER)  # refused too: the socket modules stay blocked

    return apply


def run_tests(code: str, function: str, tests: tuple[str, ...] | list[str],
              limits: SandboxLimits = SandboxLimits()) -> TestRun:
    """Run ``code`` and then each test with ``candidate`` bound to ``function``, in a child
    Python (see the module docstring); passed when every test passed."""
    job = json.dumps({"code": code, "function": function, "tests": list(tests)})
    with tempfile.TemporaryDirectory(prefix="pass1-") as work:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", RUNNER.replace("MARK", repr(RESULT_MARK))],
                                  input=job, capture_output=True, text=True, cwd=work,
                                  timeout=limits.timeout_s, preexec_fn=_limit_child(limits),
                                  env={"PATH": os.defpath, "HOME": work, "TMPDIR": work})
        except subprocess.TimeoutExpired:
            return TestRun(False, "timed out")
    marked = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if not marked:
        reason = "cpu time limit" if done.returncode == -24 else f"exit status {done.returncode}"
        return TestRun(False, f"the child ended without a result ({reason})")
    result = json.loads(marked[-1][len(RESULT_MARK):])
    if result["error"]:
        return TestRun(False, result["error"])
    failures = [r for r in result["results"] if r != "ok"]
    return TestRun(not failures, failures[0] if failures else "passed")


def check_reply(task: Pass1Task, reply: str, lenient: bool, limits: SandboxLimits = SandboxLimits()) -> TestRun:
    code = reply_code(reply)
    if top_level_functions(code) is None:
        return TestRun(False, "does not parse")
    function = pick_function(code, task.entry_point, lenient)
    if function is None:
        return TestRun(False, "no function to call")
    return run_tests(code, function, task.tests, limits)


@dataclass(frozen=True)
class ReplyVerdict:
    """One reply, run strict and lenient, as generated and cut after its first definition."""

    name: str
    turn: int  # 1 = the request alone (a new chat); 2, 3 … = a follow-up in a chat
    reply: str
    new_tokens: int
    strict: TestRun
    lenient: TestRun
    cut_strict: TestRun
    cut_lenient: TestRun


def judge(task: Pass1Task, reply: str, new_tokens: int, turn: int = 1,
          limits: SandboxLimits = SandboxLimits()) -> ReplyVerdict:
    runs: dict[tuple[str, bool], TestRun] = {}

    def run(text: str, lenient: bool) -> TestRun:
        code = reply_code(text)
        # the same function on the same code runs once (strict = lenient when the name matches)
        key = (code, lenient and pick_function(code, task.entry_point, True) != task.entry_point)
        if key not in runs:
            runs[key] = check_reply(task, text, lenient, limits)
        return runs[key]

    cut = cut_after_first_definition(reply)
    return ReplyVerdict(task.name, turn, reply, new_tokens, run(reply, False), run(reply, True),
                        run(cut, False), run(cut, True))


def tally(verdicts: list[ReplyVerdict]) -> dict:
    """Passed counts (strict, lenient; as generated and cut after the first definition)."""
    return {"n": len(verdicts),
            "strict": sum(v.strict.passed for v in verdicts), "lenient": sum(v.lenient.passed for v in verdicts),
            "cut_strict": sum(v.cut_strict.passed for v in verdicts),
            "cut_lenient": sum(v.cut_lenient.passed for v in verdicts)}


# ---------------------------------------------------------------- replies from a pair


@dataclass
class PairReplies:
    """Greedy replies of one pair: each request alone (edits excepted), and the follow-ups of each chat."""

    alone: dict[str, tuple[str, int]]  # task name -> (reply text, new tokens), standalone tasks only
    followups: list[list[tuple[str, str, int]]]  # per chat: (task name, reply, new tokens) for turns 2, 3 …
    identical: int | None = None  # replies equal to plain decoding's (with compare_plain)
    compared: int = 0
    taus: list[int] | None = None  # acceptance length of every cycle


def pair_replies(engine, tasks: list[Pass1Task], max_new_tokens: int = 160, followups: bool = True,
                 compare_plain: bool = False, log=print) -> PairReplies:
    """The pair's greedy replies (its draft's block size, no fallback: ``bench``'s settings),
    through the chat template; follow-ups carry the conversation so far, the model's replies
    as it returned them (``Finished.text``, what the app stores)."""
    from engine.config import SamplingConfig

    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0).validate()
    out = PairReplies({}, [], 0 if compare_plain else None, 0, [])

    def reply(messages: list[dict]) -> tuple[str, int]:
        ids = engine.encode(messages)
        finished = _finished(engine.generate(ids, sampling, None, slot_details=False))
        out.taus.extend(finished.acceptance_lengths)
        if compare_plain:
            plain = _finished(engine.generate(ids, sampling, None, slot_details=False, speculative=False))
            out.identical += plain.token_ids == finished.token_ids
            out.compared += 1
        return finished.text, finished.new_tokens

    for task in standalone(tasks):
        out.alone[task.name] = reply([{"role": "user", "content": task.prompt}])
        log(f"  alone     {task.name:22} {out.alone[task.name][1]:4d} tokens")
    for chat in chats(tasks) if followups else []:
        first = chat[0]
        messages = [{"role": "user", "content": first.prompt},
                    {"role": "assistant", "content": out.alone[first.name][0]}]  # the same prompt: the same reply
        turns = []
        for task in chat[1:]:
            messages.append({"role": "user", "content": task.prompt})
            text, tokens = reply(messages)
            messages.append({"role": "assistant", "content": text})
            turns.append((task.name, text, tokens))
            log(f"  follow-up {task.name:22} {tokens:4d} tokens (turn {len(messages) // 2})")
        out.followups.append(turns)
    return out


def _finished(events):
    from engine.events import Failed, Finished

    for event in events:
        if isinstance(event, Failed):
            raise RuntimeError(f"generation failed: {event.message}")
        if isinstance(event, Finished):
            return event
    raise RuntimeError("generation ended without a result")


def trained_names() -> set[str]:
    """Names of the functions the request target's task families train on (a request whose
    expected name is one of them asks for a common task the training data covers in other words)."""
    from .task_families import all_tasks

    return {name for task in all_tasks() for name in top_level_functions(task.code) or []}


def score_pair(tasks: list[Pass1Task], replies: PairReplies, limits: SandboxLimits = SandboxLimits(),
               log=print) -> dict:
    """pass@1 of the replies: alone (edits never), by follow-up turn, for the follow-ups'
    requests alone, and whole chats (the first turn alone and every follow-up passed)."""
    by_name = {task.name: task for task in tasks}
    alone = [judge(task, *replies.alone[task.name], 1, limits) for task in standalone(tasks)]
    for v in alone:
        log(f"{'pass' if v.lenient.passed else 'FAIL'} {v.name:22} strict={v.strict.outcome[:70]!r}")
    follow = [judge(by_name[name], text, tokens, turn, limits)
              for chat in replies.followups for turn, (name, text, tokens) in enumerate(chat, 2)]
    same_alone = [v for v in alone if v.name in {f.name for f in follow}]
    trained = trained_names()
    report = {
        "edit_followups": any(task.edit for task in tasks),
        "alone": tally(alone),
        "alone_trained_topic": tally([v for v in alone if by_name[v.name].entry_point in trained]),
        "alone_other_topic": tally([v for v in alone if by_name[v.name].entry_point not in trained]),
        "followups": tally(follow),
        "followups_by_turn": {str(t): tally([v for v in follow if v.turn == t]) for t in sorted({v.turn for v in follow})},
        "followup_requests_alone": tally(same_alone),
        "whole_chats": whole_chats(tasks, alone, follow),
        "mean_new_tokens": round(sum(v.new_tokens for v in alone) / max(1, len(alone)), 1),
        "mean_tau": round(sum(replies.taus) / len(replies.taus), 3) if replies.taus else None,
        "identical": None if replies.identical is None else f"{replies.identical}/{replies.compared}",
        "replies": [_verdict_row(v) for v in alone + follow],
    }
    return report


def whole_chats(tasks: list[Pass1Task], alone: list[ReplyVerdict], follow: list[ReplyVerdict]) -> dict:
    """Chats whose every turn passed, the first request alone and each follow-up (strict,
    lenient); only the chats that were followed up count."""
    first_turns = {v.name: v for v in alone}
    later_turns = {v.name: v for v in follow}
    whole = []
    for chat in chats(tasks):
        turns = [first_turns.get(chat[0].name)] + [later_turns.get(task.name) for task in chat[1:]]
        if len(turns) > 1 and all(turns):
            whole.append(turns)
    return {"n": len(whole), "strict": sum(all(v.strict.passed for v in turns) for turns in whole),
            "lenient": sum(all(v.lenient.passed for v in turns) for turns in whole)}


def _verdict_row(v: ReplyVerdict) -> dict:
    return {"name": v.name, "turn": v.turn, "new_tokens": v.new_tokens, "reply": v.reply,
            "strict": v.strict.outcome, "lenient": v.lenient.outcome,
            "cut_strict": v.cut_strict.outcome, "cut_lenient": v.cut_lenient.outcome}
