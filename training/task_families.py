"""Simple programming tasks with their solutions: the request -> code half of the tiny coder's
fine-tuning data (docstring pairs from real code are the other half, see ``request_data``). The
tasks are data files in ``data/``: the tables the compositional families combine
(``task_tables.json``) and the hand-written tasks and classes (``written_tasks.txt``,
``written_classes.txt``); this module turns them into ``Task`` values. Each task is an imperative request ("count the vowels in a string") and a
short, complete function or class whose name carries the request's key words (``count_vowels``).

Families are compositional (an operation x a predicate / character class / unit), so the model
sees the same request words mapped to names and bodies in many combinations. None of the
held-out families in ``assets/prompts/heldout_requests.jsonl`` is generated here (a test checks
that no key word of a held-out request names a task here), and nothing is taken from public
benchmarks (HumanEval, MBPP): every task and solution was written for this project."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
TABLES = json.loads((DATA_DIR / "task_tables.json").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Task:
    request: str  # imperative, lower-case first word: "count the vowels in a string"
    code: str  # the solution: one def or class, no trailing newline
    family: str


def function(name: str, params: str, body: str, doc: str | None = None) -> str:
    """Source of ``def name(params):`` with an optional one-line docstring and a body whose
    lines are given without indentation (nested blocks indented by four spaces)."""
    lines = [f"def {name}({params}):"]
    if doc:
        lines.append(f'    """{doc}"""')
    lines += ["    " + line if line else "" for line in body.strip("\n").splitlines()]
    return "\n".join(lines)


def sentence(request: str) -> str:
    """'count the vowels in a string' -> 'Count the vowels in a string.' (a docstring)."""
    return request[:1].upper() + request[1:].rstrip(".") + "."


# ---------------------------------------------------------------- characters in a string

# key: (plural phrase, singular phrase, test on a character c, imports)
CHAR_CLASSES = {k: tuple(v) for k, v in TABLES["char_classes"].items()}


def char_class_tasks() -> list[Task]:
    out = []
    for key, (plural, single, test) in CHAR_CLASSES.items():
        one = single.replace(" letter", "").replace(" mark", "")
        specs = [
            (f"count the {plural} in a string", f"count_{key}", "text",
             f"return sum(1 for c in text if {test})"),
            (f"remove the {plural} from a string", f"remove_{key}", "text",
             f'return "".join(c for c in text if not ({test}))'),
            (f"return only the {plural} of a string", f"only_{key}", "text",
             f'return "".join(c for c in text if {test})'),
            (f"check whether a string contains any {plural}", f"has_{key}", "text",
             f"return any({test} for c in text)"),
            (f"check whether a string contains only {plural}", f"all_{key}", "text",
             f"return bool(text) and all({test} for c in text)"),
            (f"find the position of the first {single} in a string", f"first_{one.replace(' ', '_')}_index", "text",
             f"for i, c in enumerate(text):\n    if {test}:\n        return i\nreturn -1"),
            (f"check whether a character is a {single}", f"is_{one.replace(' ', '_')}", "c", f"return {test}"),
        ]
        for request, name, params, body in specs:
            out.append(Task(request, function(name, params, body), "chars"))
            out.append(Task(request, function(name, params, body, sentence(request)), "chars"))
    return out


# ---------------------------------------------------------------- numbers and predicates

# key: (adjective for "a number is ...", plural noun phrase, test on n)
PREDICATES = {k: tuple(v) for k, v in TABLES["predicates"].items()}


def predicate_tasks() -> list[Task]:
    out = []
    for key, (adjective, plural, test) in PREDICATES.items():
        noun = key if key.startswith(("multiple", "single")) else key
        specs = [
            (f"check whether a number is {adjective}", f"is_{noun}", "n", f"return {test}"),
            (f"return the {plural} from a list", f"get_{noun}_numbers", "numbers",
             f"return [n for n in numbers if {test}]"),
            (f"filter the {plural} out of a list", f"filter_{noun}", "numbers",
             f"return [n for n in numbers if {test}]"),
            (f"count the {plural} in a list", f"count_{noun}", "numbers",
             f"return sum(1 for n in numbers if {test})"),
            (f"remove the {plural} from a list", f"remove_{noun}", "numbers",
             f"return [n for n in numbers if not ({test})]"),
            (f"return the sum of the {plural} in a list", f"sum_{noun}", "numbers",
             f"return sum(n for n in numbers if {test})"),
            (f"check whether a list contains any {plural}", f"has_{noun}", "numbers",
             f"return any({test} for n in numbers)"),
            (f"check whether all numbers in a list are {plural}", f"all_{noun}", "numbers",
             f"return all({test} for n in numbers)"),
            (f"return the first of the {plural} in a list, or None", f"first_{noun}", "numbers",
             f"for n in numbers:\n    if {test}:\n        return n\nreturn None"),
            (f"return the largest of the {plural} in a list", f"max_{noun}", "numbers",
             f"return max((n for n in numbers if {test}), default=None)"),
        ]
        for request, name, params, body in specs:
            out.append(Task(request, function(name, params, body), "numbers"))
            out.append(Task(request, function(name, params, body, sentence(request)), "numbers"))
    return out


# key: (phrase for one value, expression on x)
TRANSFORMS = {k: tuple(v) for k, v in TABLES["transforms"].items()}


def transform_tasks() -> list[Task]:
    out = []
    for key, (phrase, expr) in TRANSFORMS.items():
        of = "" if phrase in ("double", "half") else " of"
        specs = [
            (f"return {phrase}{of} a number", key, "x", f"return {expr}"),
            (f"return {phrase}{of} every number in a list", f"{key}_all", "numbers",
             f"return [{expr} for x in numbers]"),
            (f"return the sum of {phrase}{of} the numbers in a list", f"sum_of_{key}s", "numbers",
             f"return sum({expr} for x in numbers)"),
        ]
        for request, name, params, body in specs:
            out.append(Task(request, function(name, params, body), "transforms"))
            out.append(Task(request, function(name, params, body, sentence(request)), "transforms"))
    return out


# from, to, factor (value_to = value_from * factor) or an expression
CONVERSIONS = [tuple(row) for row in TABLES["conversions"]]


def conversion_tasks() -> list[Task]:
    out = []
    for src, dst, expr in CONVERSIONS:
        for request in (f"convert {src} to {dst}", f"convert a value in {src} to {dst}",
                        f"convert a temperature from {src} to {dst}" if src in ("celsius", "fahrenheit", "kelvin")
                        else f"convert a distance or amount from {src} to {dst}"):
            out.append(Task(request, function(f"{src}_to_{dst}", src, f"return {expr}", sentence(request)), "convert"))
        out.append(Task(f"convert a list of values from {src} to {dst}",
                        function(f"{src}_list_to_{dst}", "values", f"return [{expr.replace(src, 'v')} for v in values]"),
                        "convert"))
    return out


# ---------------------------------------------------------------- hand-written tasks

WRITTEN_TASKS = DATA_DIR / "written_tasks.txt"
WRITTEN_CLASSES = DATA_DIR / "written_classes.txt"


def parse_written(path: Path, family: str) -> list[Task]:
    """The tasks of a written-task file: entries separated by lines of '---'; request lines start
    with '> ', the rest is the solution."""
    out = []
    for entry in path.read_text(encoding="utf-8").strip().split("\n---\n"):
        lines = entry.strip("\n").splitlines()
        requests = [line[2:].strip() for line in lines if line.startswith("> ")]
        code = "\n".join(line for line in lines if not line.startswith("> ")).strip("\n")
        for request in requests:
            out.append(Task(request, code, family))
    return out


def all_tasks() -> list[Task]:
    return (char_class_tasks() + predicate_tasks() + transform_tasks() + conversion_tasks()
            + parse_written(WRITTEN_TASKS, "written") + parse_written(WRITTEN_CLASSES, "classes"))
