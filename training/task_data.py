"""The tiny coder's task data kept as data files (``training/data/``), beside the task
families written as code:

- ``paraphrases.jsonl``: other wordings of a task's request, one object per line,
  ``{"request": <a task's request>, "paraphrases": [...]}``; each is an imperative that starts
  with a verb, so the request templates can conjugate it ("flip a string around" -> "Write a
  function that flips a string around.");
- ``extra_tasks.txt``: more everyday tasks in the written-task format (``> request`` lines, then
  the solution), each followed by ``# assert ...`` lines that test it (``tests/test_request_data.py``
  runs them)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .task_families import Task

DATA_DIR = Path(__file__).resolve().parent / "data"
PARAPHRASES = DATA_DIR / "paraphrases.jsonl"
EXTRA_TASKS = DATA_DIR / "extra_tasks.txt"
ASSERT_PREFIX = "# assert "


@dataclass(frozen=True)
class TestedTask:
    task: Task
    tests: tuple[str, ...]  # assert statements that call the solution by its name


def paraphrases(path: Path = PARAPHRASES) -> dict[str, list[str]]:
    """request -> its other wordings (empty when the file is absent)."""
    if not path.exists():
        return {}
    out: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            out.setdefault(row["request"], []).extend(p for p in row["paraphrases"] if p not in out.get(row["request"], []))
    return out


def tested_tasks(path: Path = EXTRA_TASKS) -> list[TestedTask]:
    """Every (request, solution) of the extra tasks with the solution's tests."""
    if not path.exists():
        return []
    out = []
    for entry in path.read_text(encoding="utf-8").strip().split("\n---\n"):
        lines = entry.strip("\n").splitlines()
        requests = [line[2:].strip() for line in lines if line.startswith("> ")]
        tests = tuple("assert " + line[len(ASSERT_PREFIX):].strip() for line in lines if line.startswith(ASSERT_PREFIX))
        code = "\n".join(line for line in lines if not line.startswith(("> ", ASSERT_PREFIX))).strip("\n")
        out += [TestedTask(Task(request, code, "extra"), tests) for request in requests]
    return out


def extra_tasks(path: Path = EXTRA_TASKS) -> list[Task]:
    return [t.task for t in tested_tasks(path)]
