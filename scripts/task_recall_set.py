"""How well does a target answer the tasks it was trained on? A pass@1 set made of training tasks.

    python3 scripts/task_recall_set.py OUT.jsonl [--count 60] [--seed 0] [--since REV] [--until REV]
    dflash-studio train eval --pass1 --no-followups --prompts OUT.jsonl --target T --draft D

Each row is one of the tested extra tasks (``training/data/extra_tasks.txt``) asked in one of its
own wordings, wrapped as "Write a function that ...", with the task's own asserts as its tests.
``--since REV`` keeps only the tasks added after git revision REV, ``--until REV`` only those
there at REV: the tasks a target was trained on, or the ones added after its data was built.
Set beside the held-out sets, the figure separates what the target learnt from what it
generalises: the held-out sets never ask a task under its trained name, so they cannot show
what more training tasks buy.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def defined_name(code: str) -> str | None:
    match = re.match(r"def (\w+)\(", code)
    return match.group(1) if match else None


def recall_rows(tested, count: int, seed: int, skip: frozenset[str] = frozenset(),
                only: frozenset[str] | None = None) -> list[dict]:
    """pass@1 rows (``training.pass1`` format) for ``count`` function tasks drawn at random, one
    wording each, the tests calling ``candidate`` in place of the task's name."""
    from training.request_data import phrase

    by_name: dict[str, list] = {}
    for item in tested:
        name = defined_name(item.task.code)
        if name and name not in skip and (only is None or name in only):
            by_name.setdefault(name, []).append(item)
    rng = random.Random(seed)
    rows = []
    for name in rng.sample(sorted(by_name), len(by_name)):
        if len(rows) == count:
            break
        item = rng.choice(by_name[name])
        tests = [re.sub(rf"\b{name}\b", "candidate", test) for test in item.tests]
        if not all("candidate(" in test for test in tests):  # a test that never calls it checks nothing
            continue
        rows.append({"name": f"recall_{name}", "kind": "chat",
                     "prompt": phrase(item.task.request, "Write a function that {third}."),
                     "entry_point": name, "tests": tests, "solution": item.task.code + "\n"})
    return rows


def names_at(revision: str) -> frozenset[str]:
    """The extra tasks' function names at a git revision."""
    text = subprocess.run(["git", "show", f"{revision}:training/data/extra_tasks.txt"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    return frozenset(re.findall(r"^def (\w+)\(", text, re.M))


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from training.task_data import tested_tasks

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--since", default=None, help="only the tasks added after this git revision")
    parser.add_argument("--until", default=None, help="only the tasks there at this git revision")
    args = parser.parse_args()
    skip = names_at(args.since) if args.since else frozenset()
    only = names_at(args.until) if args.until else None
    rows = recall_rows(tested_tasks(), args.count, args.seed, skip, only)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{len(rows)} tasks -> {args.out}")


if __name__ == "__main__":
    main()
