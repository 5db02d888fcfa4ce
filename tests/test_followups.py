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
        if fn is not None and (code := rewrite(fn)) and "random" not in task.code and runs_on_samples(task.code):
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


def test_rounding_rounds_what_the_function_returned_to_two_places():
    pairs = rewrites(followups.round_result)
    assert len(pairs) > 20
    for before, after in pairs:
        old, fn = defined(before)
        new, new_fn = defined(after)
        args = sample_args(fn)
        assert new_fn.name == fn.name and new(*args) == round(old(*args), 2), after
    count = Function.parse("def count_uppercase(text):\n    return sum(1 for c in text if c.isupper())")
    assert followups.round_result(count) is None  # a count has no fraction to round ("upper" is not "per")
    pair = Function.parse("def polar_to_cartesian(radius, angle):\n    return (radius * 0.5, radius * 2)")
    built = Function.parse("def running_average(numbers):\n    averages = []\n    for n in numbers:\n"
                           "        averages.append(n / 2)\n    return averages")
    assert followups.round_result(pair) is None and followups.round_result(built) is None  # round() takes one number


def test_sorting_returns_the_same_items_in_order():
    pairs = rewrites(followups.sort_result)
    assert pairs
    for before, after in pairs:
        old, fn = defined(before)
        new, _ = defined(after)
        args = sample_args(fn)
        assert new(*args) == sorted(old(*args)), after


def test_stripping_answers_padded_text_as_the_old_function_answers_the_bare_text():
    pairs = rewrites(followups.strip_text)
    assert len(pairs) > 20
    for before, after in pairs:
        old, fn = defined(before)
        new, _ = defined(after)
        args = sample_args(fn)
        assert new(f"  {args[0]}\n", *args[1:]) == old(*args), after


def test_skipping_none_answers_as_if_the_none_items_were_not_there():
    pairs = rewrites(followups.skip_none)
    assert len(pairs) > 20
    for before, after in pairs:
        old, fn = defined(before)
        new, _ = defined(after)
        args = sample_args(fn)
        assert new([None] + args[0] + [None], *args[1:]) == old(*args), after


@pytest.mark.parametrize("kind, wrong", [("int", 2.5), ("number", "7"), ("list", (4, 1, 3)), ("str", 42)])
def test_type_checks_raise_type_error_for_the_wrong_type_and_keep_the_rest(kind, wrong):
    pairs = rewrites(followups.type_check(kind))
    assert pairs
    for before, after in pairs:
        old, fn = defined(before)
        new, _ = defined(after)
        args = sample_args(fn)
        assert new(*args) == old(*args), after
        with pytest.raises(TypeError):
            new(wrong, *args[1:])


def test_a_default_lets_the_last_argument_be_left_out():
    pairs = rewrites(followups.default_last)
    assert len(pairs) > 20
    for before, after in pairs:
        old, fn = defined(before)
        new, new_fn = defined(after)
        default = eval(followups.DEFAULTS[fn.plain_params[-1]])
        assert new_fn.plain_params == fn.plain_params
        assert new.__defaults__ == (default,), after


def test_an_edit_asks_with_the_function_own_parameter_names():
    fn = Function.parse("def repeat_text(text, times):\n    return text * times")
    edit = next(e for e in followups.EDITS if e.rewrite is followups.default_last)
    asks = {edit.ask(fn, random.Random(seed)) for seed in range(20)}
    assert asks and all("times" in a and "2" in a and "{" not in a for a in asks)


def test_edits_of_the_model_own_replies_answer_with_the_requested_function_edited():
    tasks = function_tasks()
    task = next(t for t in tasks if Function.parse(t.code).name == "is_even")
    task = next(t for t in tasks if t.request == task.request)  # the first task of that request answers
    wrong = "def even(x):\n    return x % 3 == 0"
    rows = [{"request": task.request, "user": "is a number even? write it", "reply": wrong}] * 30
    rows += [{"request": "no task asks this", "user": "?", "reply": "def f():\n    pass"}]
    chats = followups.own_reply_chats(tasks, rows, random.Random(0))
    assert len(chats) == 30  # the row with no task behind it is left out
    asked = Function.parse(task.code)
    edits_of_asked = {e.rewrite(asked) for e in followups.EDITS} | {followups.add_docstring(task.request)(asked)}
    for user, reply, ask, answer in chats:
        assert reply["content"] == wrong and ask["role"] == "user"
        _, fn = defined(answer["content"])
        if any(word in ask["content"] for word in ("Rename", "Call it", "name the function")):
            assert fn.body == asked.body and fn.name in ask["content"]
        else:  # the function asked for, edited, under its own name: nothing of the reply's
            assert answer["content"] in edits_of_asked and fn.name == asked.name


def test_only_the_edit_is_trained_on_in_a_chat_over_the_model_own_reply():
    from training.request_data import tokenize_chat_examples
    from training.tokenizer import load_tokenizer, render_chat

    tokenizer = load_tokenizer("assets/models/tiny-coder-requests/target")
    wrong = "def even(x):\n    return x % 3 == 0"
    chat = render_chat([{"role": "user", "content": "is a number even?"}, {"role": "assistant", "content": wrong},
                        {"role": "user", "content": "Add a docstring."},
                        {"role": "assistant", "content": 'def is_even(n):\n    """Even."""\n    return n % 2 == 0'}])
    stream = tokenize_chat_examples(tokenizer, [chat])
    trained = tokenizer.decode([t for t, m in zip(stream["ids"].tolist(), stream["mask"].tolist()) if m])
    assert "is_even" in trained and "even(x)" not in trained and "% 3" not in trained
