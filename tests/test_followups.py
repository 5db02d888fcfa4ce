"""The tiny coder's follow-up data says only what its code does: each edit is run and checked
against the behaviour its request asks for."""

import random

import pytest

from training import followups
from training.followups import Function, edge_case_chats, followup_chats, named_chats
from training.request_data import PHRASINGS, phrase, task_requests, third_person
from training.task_data import extra_tasks
from training.task_families import Task, all_tasks

SCALAR, LIST_IN, TEXT = 7, [4, 1, 3], "Level Up"


def function_tasks():
    return [t for t in all_tasks() + extra_tasks() if t.code.startswith("def ")]


def defined(code: str):
    space: dict = {}
    exec(code, space)
    fn = Function.parse(code)
    return space[fn.name], fn


def sample_args(fn: Function):
    values = {**{p: SCALAR for p in followups.NUMBER_PARAMS}, **{p: list(LIST_IN) for p in followups.LIST_PARAMS},
              **{p: TEXT for p in followups.TEXT_PARAMS}}
    return [values.get(p, 2) for p in fn.plain_params]


def runs_on_samples(code: str) -> bool:
    old, fn = defined(code)
    try:
        return old(*sample_args(fn)) == old(*sample_args(fn))  # and gives one answer (no random draws)
    except Exception:
        return False


def rewrites(rewrite):
    """(original, edited) solutions of every function task the rewrite fits (and that runs, with one
    answer, on the sample arguments)."""
    out = []
    for task in function_tasks():
        fn = Function.parse(task.code)
        if fn is not None and (code := rewrite(fn)) and runs_on_samples(task.code):
            out.append((task.code, code))
    return out


def test_negative_guard_raises_for_negatives_and_keeps_everything_else():
    pairs = rewrites(followups.negative_guard)
    assert len(pairs) > 20
    for before, after in pairs:
        old, fn = defined(before)
        new, _ = defined(after)
        with pytest.raises(ValueError):
            new(-3, *sample_args(fn)[1:])
        args = sample_args(fn)
        assert new(*args) == old(*args), after


@pytest.mark.parametrize("result", ["None", "0", "raise"])
def test_empty_guards_answer_an_empty_list_as_the_request_says_and_keep_the_rest(result):
    pairs = rewrites(followups.empty_guard(result))
    assert pairs
    for before, after in pairs:
        old, fn = defined(before)
        new, _ = defined(after)
        args = sample_args(fn)
        assert new(*args) == old(*args), after
        if result == "raise":
            with pytest.raises(ValueError):
                new([], *args[1:])
        else:
            assert new([], *args[1:]) == {"None": None, "0": 0}[result], after


def test_whole_list_keeps_the_name_and_maps_the_old_function():
    pairs = rewrites(followups.whole_list)
    assert len(pairs) > 20
    for before, after in pairs:
        old, fn = defined(before)
        new, new_fn = defined(after)
        assert new_fn.name == fn.name
        inputs = [TEXT, "abc"] if fn.plain_params[0] in followups.TEXT_PARAMS else [SCALAR, 2, 9]
        assert new(inputs) == [old(x) for x in inputs], after


def test_ignore_case_lowers_the_text_first():
    pairs = rewrites(followups.ignore_case)
    assert pairs
    for before, after in pairs:
        old, fn = defined(before)
        new, _ = defined(after)
        args = sample_args(fn)
        assert new(*[a.upper() if isinstance(a, str) else a for a in args]) == old(*[a.lower() if isinstance(a, str) else a for a in args])


def test_follow_up_chats_answer_every_turn_with_the_previous_function_edited():
    chats = followup_chats(function_tasks(), random.Random(0), lambda t, r: task_requests(t, 1, r)[0])
    assert len(chats) > 500
    for messages in chats:
        assert [m["role"] for m in messages] == ["user", "assistant"] * (len(messages) // 2)
        replies = [Function.parse(m["content"]) for m in messages[1::2]]
        asked = messages[-2]["content"]
        if not any(word in asked for word in ("Rename", "Call it", "name the function")):
            assert replies[-1].name == replies[-2].name, messages
        assert replies[-1] != replies[-2]
        defined(messages[-1]["content"])  # it runs


def test_stated_edge_cases_and_names_are_answered_as_stated():
    tasks = function_tasks()
    rng = random.Random(1)
    stated = edge_case_chats(tasks, rng, lambda t, clause, r: phrase(f"{t.request}, {clause}", PHRASINGS[2]))
    raising = [m for m in stated if "raise ValueError" in m[0]["content"]]
    assert raising and all("raise ValueError" in m[1]["content"] for m in raising)
    for user, reply in named_chats(tasks, rng, third_person):
        name = Function.parse(reply["content"]).name
        assert name in user["content"] and name.isidentifier()


def test_an_edit_that_does_not_fit_is_skipped():
    listing = Task("sort a list", "def sort_list(items):\n    return sorted(items)", "test")
    fn = Function.parse(listing.code)
    assert followups.empty_guard("None")(fn) is None  # an empty list already sorts to []
    assert followups.negative_guard(fn) is None
    assert Function.parse("class Stack:\n    pass") is None
