"""scripts/task_recall_set.py: a pass@1 set of training tasks, to measure what a target learnt."""

import json

from training.pass1 import read_tasks, run_tests
from training import task_data
from tests.script_loader import load_script


def test_every_row_asks_a_training_task_and_its_own_solution_passes_its_tests(tmp_path):
    script = load_script("task_recall_set")
    rows = script.recall_rows(task_data.tested_tasks(), 12, seed=1)
    assert len(rows) == 12 == len({r["entry_point"] for r in rows})
    assert rows == script.recall_rows(task_data.tested_tasks(), 12, seed=1)  # seeded
    path = tmp_path / "recall.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for task in read_tasks(path):
        assert task.prompt.startswith("Write a function that ") and task.prompt.endswith(".")
        assert all("candidate(" in test and f"{task.entry_point}(" not in test for test in task.tests)
        assert run_tests(task.solution, task.entry_point, task.tests).passed, task.name
        wrong = f"def {task.entry_point}(*args, **kwargs):\n    return None\n"
        assert not run_tests(wrong, task.entry_point, task.tests).passed, task.name


def test_tasks_named_before_a_revision_are_left_out():
    script = load_script("task_recall_set")
    every = {r["entry_point"] for r in script.recall_rows(task_data.tested_tasks(), 10_000, seed=0)}
    some = frozenset(sorted(every)[: len(every) // 2])
    rest = {r["entry_point"] for r in script.recall_rows(task_data.tested_tasks(), 10_000, seed=0, skip=some)}
    assert rest == every - some
    only = {r["entry_point"] for r in script.recall_rows(task_data.tested_tasks(), 10_000, seed=0, only=some)}
    assert only == set(some)
