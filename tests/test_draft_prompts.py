"""`train draft --prompts requests-wide` (training.draft_prompts): prompts the
request -> code target never saw, none of which names what an evaluation set asks."""

from __future__ import annotations

import ast
import random
import textwrap

from training import draft_prompts
from training.draft_prompts import EvalGuard, documented_functions, wide_prompt_rows
from training.request_data import PACKAGES

MODULE = textwrap.dedent('''
    import math
    from os import path as os_path
    from typing import (
        Any,
    )

    def scale_rows(table, factor):
        """Return the table with every row multiplied by factor."""
        return [[x * factor for x in row] for row in table]

    def _private(x):
        """Return a private value."""
        return x

    def long_summary(x):
        """Return a value whose summary runs on
        into a second line."""
        return x

    def marked_up(x):
        """Return the :class:`Thing` of x."""
        return x

    def not_a_request(x):
        """The number of widgets."""
        return x

    class Store:
        def count_items(self):
            """Count the items kept in the store."""
            return len(self.items)
''')


def test_documented_functions_keep_one_line_request_summaries_of_public_functions_and_methods():
    found = documented_functions(MODULE)
    assert found == [("Return the table with every row multiplied by factor.", "def scale_rows(table, factor):"),
                     ("Count the items kept in the store.", "def count_items(self):")]


def test_the_guard_drops_what_an_evaluation_prompt_names_and_keeps_the_rest():
    guard = EvalGuard.from_prompts([
        "Rotate a list to the right by k positions.",
        'def transpose(matrix):\n    """Return the transpose of a matrix given as a list of rows."""\n',
        "Check whether a number is prime.",
    ])
    assert not guard.admits("Write a function that rotates a list by n positions.")  # two key words
    assert not guard.admits('def transpose(grid):\n    """Swap rows and columns."""\n')  # the same name
    assert not guard.admits("Return the primes below n.")  # the one key word "prime" has
    assert guard.admits("Write a function that returns the number of rows in a table.")
    assert guard.admits('def scale_rows(table, factor):\n    """Return the table scaled."""\n')


def test_the_real_guard_drops_every_evaluation_prompt():
    texts = draft_prompts.eval_prompt_texts()
    assert len(texts) >= 100  # the project's four sets (HumanEval's 164 join them when installed)
    guard = EvalGuard.from_prompts(texts)
    assert not any(guard.admits(t) for t in texts)


def test_every_held_out_prompt_file_is_guarded():
    """A prompt set added under assets/prompts is held out unless it is the shipped demo set."""
    shipped = {path.name for path in draft_prompts.PROMPTS_DIR.glob("*.jsonl")}
    assert shipped - {"code.jsonl"} == set(draft_prompts.EVAL_SETS)


def test_wide_rows_are_requests_and_docstring_prefixes_from_the_given_code(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "tests").mkdir(parents=True)
    (pkg / "mod.py").write_text(MODULE)
    (pkg / "tests" / "test_mod.py").write_text(MODULE.replace("scale_rows", "skipped_rows"))
    guard = EvalGuard.from_prompts(["Count the items in a store."])
    rows = []
    for seed in range(12):
        rows += wide_prompt_rows(seed, 10, log=lambda _: None, guard=guard, roots={"pkg": pkg})
    assert {r["kind"] for r in rows} == {"chat", "complete"}
    assert not any("skipped_rows" in r["prompt"] or "count_items" in r["prompt"] or "items kept" in r["prompt"]
                   for r in rows)  # tests/ are skipped, the guarded function never appears
    for row in rows:
        if row["kind"] == "complete":
            assert row["prompt"].startswith('def scale_rows(table, factor):\n    """Return the table')
            assert row["prompt"].endswith(('"""\n', '"""'))  # as written, or healed as the Complete tab sends it
        else:
            assert "multiplied by factor" in row["prompt"] and "def " not in row["prompt"]


def test_prompt_packages_are_none_the_target_was_trained_on():
    assert not set(draft_prompts.PROMPT_PACKAGES) & set(PACKAGES)
    assert draft_prompts.code_prefix("def f(x):", "Return x", healed=False) == 'def f(x):\n    """Return x."""\n'
    assert draft_prompts.code_prefix("def f(x):", "Return x.", healed=True) == 'def f(x):\n    """Return x."""'


def test_documented_keeps_one_line_imports_and_the_class_line_of_methods():
    found = {d.signature: d for d in draft_prompts.documented(MODULE)}
    assert found["def scale_rows(table, factor):"].imports == ("import math", "from os import path as os_path")
    assert found["def scale_rows(table, factor):"].class_line == ""
    assert found["def count_items(self):"].class_line == "class Store:"


def test_each_prefix_shape_is_the_code_a_user_would_paste():
    fn = draft_prompts.Documented("Return x doubled", "def double(x):", ("import math", "import os"), "class Box:")
    rng = random.Random(0)
    assert draft_prompts.shaped_prefix(fn, "signature", False, rng) == "def double(x):\n"
    assert draft_prompts.shaped_prefix(fn, "signature", True, rng) == "def double(x):"  # healed
    assert draft_prompts.shaped_prefix(fn, "method", False, rng) == (
        'class Box:\n    def double(x):\n        """Return x doubled."""\n')
    for seed in range(20):
        text = draft_prompts.shaped_prefix(fn, "imports", False, random.Random(seed))
        head, _, rest = text.partition("\n\n\n")
        assert head and set(head.splitlines()) <= {"import math", "import os"}
        assert rest in ("def double(x):\n", 'def double(x):\n    """Return x doubled."""\n')
        ast.parse(text + "    pass\n" if rest.endswith(":\n") else text)
    bare = fn._replace(imports=(), class_line="")  # a shape it has no parts for: def + docstring
    for shape in ("imports", "method"):
        assert draft_prompts.shaped_prefix(bare, shape, False, rng) == 'def double(x):\n    """Return x doubled."""\n'


def test_code_wide_mixes_every_shape_and_requests_wide_only_docstring_prefixes(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    funcs = "\n".join(f'def f{i}(x):\n    """Return the value number {i} of x."""\n    return x\n' for i in range(40))
    (pkg / "mod.py").write_text("import math\n\n" + funcs + "\nclass Box:\n" + textwrap.indent(
        funcs.replace("def f", "def m").replace("the value", "the item"), "    "))
    (pkg / "more.py").write_text(textwrap.indent(funcs.replace("def f", "def g").replace("the value", "the part"), ""))
    guard = EvalGuard.from_prompts(["Count the items in a store."])
    wide = [row for seed in range(8) for row in wide_prompt_rows(seed, 36, log=lambda _: None, guard=guard,
                                                                  roots={"pkg": pkg}, mix=draft_prompts.CODE_WIDE)]
    prefixes = [r["prompt"] for r in wide if r["kind"] == "complete"]
    assert len(prefixes) > len(wide) / 2  # code-wide is mostly code
    assert any(p.startswith("import math\n\n\ndef ") for p in prefixes)
    assert any(p.startswith("class Box:\n    def m") for p in prefixes)
    assert any('"""' not in p and p.startswith("def ") for p in prefixes)  # a bare signature
    plain = wide_prompt_rows(1, 36, log=lambda _: None, guard=guard, roots={"pkg": pkg})
    assert all(r["prompt"].startswith("def ") and '"""' in r["prompt"] for r in plain if r["kind"] == "complete")
