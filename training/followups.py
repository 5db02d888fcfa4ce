"""Conversations for the tiny coder's request data beyond one request and one function:

- **follow-ups** that change the previous function: a second (and third) user turn such as "Now
  make it raise ValueError for negative numbers." answered by the same function, same name, with
  the new behaviour;
- **stated edge cases**: a request that says what to do with an empty list or a negative
  number ("..., or None if the list is empty") answered with the guard in place;
- **names as the request spells them**: "Write a function called vowel_total that ..." answered
  with ``def vowel_total``.

Every edit is a small, checked rewrite of a task's solution (``Edit.apply``), so the data can only
say what the code does. Tasks are ``task_families.Task`` values; a task an edit does not fit is
skipped for that edit."""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass
from typing import Callable

from .task_families import Task, sentence

NUMBER_PARAMS = {"n", "x", "number", "num", "value", "celsius", "fahrenheit", "kelvin", "kilometers", "miles",
                 "kilograms", "pounds", "meters", "feet", "inches", "centimeters", "liters", "gallons", "degrees",
                 "radians", "bytes", "age", "year", "amount", "radius", "side", "width", "height", "length"}
LIST_PARAMS = {"numbers", "items", "values", "words", "strings", "nums", "lst", "scores", "prices", "names"}
TEXT_PARAMS = {"text", "word", "sentence", "string", "s", "name"}
NUMBER_LISTS = {"numbers", "values", "nums", "scores", "prices"}
# whole-number parameters (a TypeError edit checks for int); the other NUMBER_PARAMS take floats too
INT_PARAMS = {"n", "number", "num", "age", "year", "bytes"}
# a default a user might give a trailing parameter, by its name
DEFAULTS = {"n": "3", "k": "2", "threshold": "0", "char": "' '", "fill": "' '", "letter": "'a'", "width": "10",
            "divisor": "2", "shift": "1", "multiple": "2", "window": "3", "tolerance": "1e-9", "suffix": "'!'",
            "prefix": "'> '", "default": "None", "attempts": "3", "height": "1", "sep": "' '",
            "separator": "', '", "limit": "10", "places": "2", "digits": "2", "times": "2", "count": "1"}
# words in a function's name that say it returns a number with a fraction (what a rounding edit fits)
FRACTION_WORDS = {"average", "mean", "median", "to", "convert", "area", "percent", "percentage", "ratio", "divide",
                  "speed", "bmi", "interest", "discount", "tax", "fraction", "distance", "volume", "circumference"}


@dataclass(frozen=True)
class Function:
    """A one-function solution cut into the pieces edits rewrite."""
    name: str
    params: list[str]
    doc: str | None  # the docstring line as written (indented), or None
    body: list[str]  # body lines, indented by four spaces

    @classmethod
    def parse(cls, code: str) -> "Function | None":
        lines = code.split("\n")
        head = re.fullmatch(r"def (\w+)\(([^)]*)\):", lines[0])
        if not head or any(line.startswith(("def ", "class ")) for line in lines[1:]):
            return None
        params = [p.strip() for p in head.group(2).split(",") if p.strip()]
        rest = lines[1:]
        doc = rest.pop(0) if rest and rest[0].strip().startswith('"""') else None
        return cls(head.group(1), params, doc, rest)

    def source(self, name: str | None = None, params: list[str] | None = None, body: list[str] | None = None,
               doc: str | None = None) -> str:
        lines = [f"def {name or self.name}({', '.join(params if params is not None else self.params)}):"]
        if doc or self.doc:
            lines.append(doc or self.doc)
        return "\n".join(lines + (body if body is not None else self.body))

    @property
    def plain_params(self) -> list[str]:
        return [p.split("=")[0].strip() for p in self.params]


def guard(fn: Function, condition: str, action: str) -> str:
    return fn.source(body=[f"    if {condition}:", f"        {action}"] + fn.body)


def negative_guard(fn: Function) -> str | None:
    p = fn.plain_params[0] if fn.plain_params else ""
    if p not in NUMBER_PARAMS or "raise" in "\n".join(fn.body):
        return None
    return guard(fn, f"{p} < 0", f'raise ValueError("{p} must not be negative")')


# what a function's name says it returns from a list, for the empty-list rewrites that fit it
ONE_VALUE_WORDS = ("max", "min", "largest", "smallest", "biggest", "first", "last", "average", "mean", "median",
                   "most", "least", "longest", "shortest", "second")
TOTAL_WORDS = ("sum", "count", "total", "product", "average", "mean", "number")


def returns_a_list(fn: Function) -> bool:
    body = "\n".join(fn.body)
    return any(f"return {start}" in body for start in ("[", "sorted(", "list(", "{", "set(", '"".join'))


def empty_guard(result: str) -> Callable[[Function], str | None]:
    """Guard a list function's empty input: ``return None`` where it returns one of the values,
    ``return 0`` where it returns a total, ``raise ValueError`` for either."""
    fits = {"None": ONE_VALUE_WORDS, "0": TOTAL_WORDS, "raise": ONE_VALUE_WORDS + TOTAL_WORDS}[result]

    def apply(fn: Function) -> str | None:
        p = fn.plain_params[0] if fn.plain_params else ""
        if (p not in LIST_PARAMS or len(fn.plain_params) > 2 or "if not " in "\n".join(fn.body)
                or returns_a_list(fn) or not any(w in fn.name for w in fits)):
            return None
        action = (f'raise ValueError("{p} must not be empty")' if result == "raise" else f"return {result}")
        return guard(fn, f"not {p}", action)
    return apply


def whole_list(fn: Function) -> str | None:
    """``def f(x): return EXPR`` -> ``def f(values): return [EXPR for x in values]``."""
    if len(fn.plain_params) != 1 or len(fn.body) != 1 or not fn.body[0].startswith("    return "):
        return None
    p = fn.plain_params[0]
    if p not in NUMBER_PARAMS and p not in TEXT_PARAMS:
        return None
    expr = fn.body[0][len("    return "):]
    many = "numbers" if p in ("n", "x", "number", "num") else "texts" if p in TEXT_PARAMS else "values"
    return fn.source(params=[many], body=[f"    return [{expr} for {p} in {many}]"])


def ignore_case(fn: Function) -> str | None:
    texts = [p for p in fn.plain_params if p in TEXT_PARAMS]
    if not texts or not fn.name.startswith(("is_", "has_", "count_", "contains", "starts", "ends")) \
            or ".lower()" in "\n".join(fn.body):
        return None
    return fn.source(body=[f"    {p} = {p}.lower()" for p in texts] + fn.body)


def add_docstring(request: str) -> Callable[[Function], str | None]:
    def apply(fn: Function) -> str | None:
        return None if fn.doc else fn.source(doc=f'    """{sentence(request)}"""')
    return apply


def single_return(fn: Function) -> str | None:
    """The expression of a body whose only ``return`` is its last line, at the function's level."""
    returns = [line for line in fn.body if line.strip().startswith("return")]
    last = fn.body[-1] if fn.body else ""
    return last[len("    return "):] if len(returns) == 1 and last.startswith("    return ") else None


def round_result(fn: Function) -> str | None:
    """``return EXPR`` -> ``return round(EXPR, 2)`` where the name says the result has a fraction."""
    expr = single_return(fn)
    p, words = (fn.plain_params or [""])[0], set(fn.name.lower().split("_"))
    # "x_to_y" converts a number; a list function's "to" ("move_zeros_to_end") says nothing of fractions
    says_fraction = bool((FRACTION_WORDS - {"to"}) & words) or ("to" in words and p in NUMBER_PARAMS - INT_PARAMS)
    if (expr is None or p not in NUMBER_PARAMS | NUMBER_LISTS or not says_fraction or "round(" in expr
            or "None" in expr or returns_a_list(fn) or returns_a_collection(fn, expr)):
        return None
    return fn.source(body=fn.body[:-1] + [f"    return round({expr}, 2)"])


def returns_a_collection(fn: Function, expr: str) -> bool:
    """A returned tuple, list, dict or set, written as one or built in a name (``return (x, y)``,
    ``return averages`` after ``averages.append(..)``): round() takes one number."""
    try:
        node = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.ListComp, ast.Dict, ast.DictComp, ast.Set, ast.SetComp)):
        return True
    body = "\n".join(fn.body)
    return isinstance(node, ast.Name) and bool(
        re.search(rf"\b{node.id}\s*=\s*[\[{{]|\b{node.id}\.(append|extend|add)\(", body))


def sort_result(fn: Function) -> str | None:
    """``return [..]`` -> ``return sorted([..])`` for a function that returns a list."""
    expr = single_return(fn)
    try:
        node = ast.parse(expr, mode="eval").body if expr else None
    except SyntaxError:
        node = None
    is_list = isinstance(node, (ast.List, ast.ListComp)) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "list")
    if not is_list or "sorted(" in expr:
        return None
    return fn.source(body=fn.body[:-1] + [f"    return sorted({expr})"])


def strip_text(fn: Function) -> str | None:
    """Strip a text parameter's surrounding whitespace before anything else."""
    p = fn.plain_params[0] if fn.plain_params else ""
    if p not in TEXT_PARAMS or ".strip()" in "\n".join(fn.body):
        return None
    return fn.source(body=[f"    {p} = {p}.strip()"] + fn.body)


def skip_none(fn: Function) -> str | None:
    """Drop the ``None`` items of a list parameter first."""
    p = fn.plain_params[0] if fn.plain_params else ""
    if p not in LIST_PARAMS or "None" in "\n".join(fn.body):
        return None
    return fn.source(body=[f"    {p} = [item for item in {p} if item is not None]"] + fn.body)


def type_check(kind: str) -> Callable[[Function], str | None]:
    """Raise TypeError unless the first parameter is of ``kind``: "int", "number", "list" or "str"."""
    fits = {"int": INT_PARAMS, "number": NUMBER_PARAMS - INT_PARAMS, "list": LIST_PARAMS, "str": TEXT_PARAMS}[kind]
    test = {"int": "int", "number": "(int, float)", "list": "list", "str": "str"}[kind]
    said = {"int": "an int", "number": "a number", "list": "a list", "str": "a string"}[kind]

    def apply(fn: Function) -> str | None:
        p = fn.plain_params[0] if fn.plain_params else ""
        if p not in fits or "isinstance" in "\n".join(fn.body):
            return None
        return guard(fn, f"not isinstance({p}, {test})", f'raise TypeError("{p} must be {said}")')
    return apply


def default_last(fn: Function) -> str | None:
    """Give the last of two or more parameters the default its name suggests (``DEFAULTS``)."""
    if len(fn.params) < 2 or "=" in fn.params[-1] or fn.plain_params[-1] not in DEFAULTS:
        return None
    return fn.source(params=fn.params[:-1] + [f"{fn.plain_params[-1]}={DEFAULTS[fn.plain_params[-1]]}"])


@dataclass(frozen=True)
class Edit:
    followups: tuple[str, ...]  # what a user types after the first reply
    clauses: tuple[str, ...]  # the same said inside the first request ("" if it cannot be)
    rewrite: Callable[[Function], str | None]

    def ask(self, fn: Function, rng: random.Random) -> str:
        """One of the follow-ups, with the function's own parameter names filled in."""
        last = fn.plain_params[-1] if fn.plain_params else ""
        return rng.choice(self.followups).format(p=fn.plain_params[0] if fn.plain_params else "input",
                                                 last=last, value=DEFAULTS.get(last, ""))


EDITS = (
    Edit(("Now make it raise ValueError for negative numbers.", "Make it raise a ValueError if the number is negative.",
          "It should raise ValueError when given a negative number.", "Change it so that negative input raises a ValueError.",
          "Also raise ValueError for negatives.", "now raise a ValueError if the input is negative",
          "Can you make it reject negative numbers with a ValueError?"),
         ("and raise ValueError for negative numbers", "raising a ValueError if the number is negative"),
         negative_guard),
    Edit(("Make it return None for an empty list.", "Now handle an empty list by returning None.",
          "If the list is empty it should return None.", "what about an empty list? return None then"),
         ("or None if the list is empty", "and return None for an empty list"),
         empty_guard("None")),
    Edit(("Make it return 0 for an empty list.", "Now return 0 when the list is empty.",
          "It should give 0 for an empty list."),
         ("and return 0 for an empty list", "or 0 if the list is empty"),
         empty_guard("0")),
    Edit(("Make it raise ValueError if the list is empty.", "Now raise a ValueError for an empty list.",
          "An empty list should raise ValueError."),
         ("and raise ValueError if the list is empty",),
         empty_guard("raise")),
    Edit(("Now make it work on a whole list.", "Change it to take a list and return a list of results.",
          "Make it convert a whole list.", "Now do it for every item in a list.", "can it take a list instead?"),
         (), whole_list),
    Edit(("Have it ignore case.", "Now make it case-insensitive.", "It should not care about upper or lower case."),
         ("ignoring case",), ignore_case),
    Edit(("Round what it returns to 2 decimal places.", "round it to 2 decimals", "Make it return the answer rounded to two decimals.",
          "Can you round the output to 2 places?"),
         ("rounded to 2 decimal places",), round_result),
    Edit(("Return the result sorted.", "sort the list before returning it", "Make the returned list sorted."),
         ("as a sorted list",), sort_result),
    Edit(("Strip the spaces around the {p} first.", "strip whitespace from the {p} first",
          "Make it ignore spaces at the start and the end.", "trim the input before using it"),
         ("after stripping surrounding spaces",), strip_text),
    Edit(("Skip any None values in the list.", "ignore None items in the list", "Make it ignore None entries.",
          "The list may contain None; leave those out."),
         ("skipping None values",), skip_none),
    Edit(("Make it raise a TypeError if {p} isn't an int.", "raise TypeError when {p} is not an integer",
          "It should raise TypeError for anything but an int."),
         ("and raise TypeError if it is not an int",), type_check("int")),
    Edit(("Make it raise a TypeError if {p} is not a number.", "raise TypeError for input that isn't a number"),
         ("and raise TypeError if it is not a number",), type_check("number")),
    Edit(("Make it raise a TypeError if {p} is not a list.", "raise a TypeError when it isn't given a list"),
         ("and raise TypeError if it is not given a list",), type_check("list")),
    Edit(("Make it raise a TypeError if {p} is not a string.", "raise TypeError when the input isn't a str"),
         ("and raise TypeError if it is not a string",), type_check("str")),
    Edit(("Make {last} default to {value}.", "let {last} default to {value}", "Give {last} a default value of {value}.",
          "{last} should be optional, with a default of {value}."),
         (), default_last),
)
DOCSTRING_FOLLOWUPS = ("Add a docstring.", "Now add a docstring to it.", "Please document it with a docstring.")
RENAME_FOLLOWUPS = ("Rename it to {name}.", "Call it {name} instead.", "Can you name the function {name}?")
NAMED_REQUESTS = ("Write a function called {name} that {third}.", "Write a function named {name} that {third}.",
                  "Write {name}(), a function that {third}.", "Define {name} to {imp}.",
                  "Create a Python function {name} that {third}.")
STOP_WORDS = {"a", "an", "the", "of", "in", "to", "from", "and", "or", "is", "it", "its", "all", "every", "each",
              "given", "list", "string", "number", "whether", "check", "return", "with", "for", "by", "on", "as",
              "that", "which", "into", "out", "only", "any", "one", "two", "value", "values", "none", "if", "not"}


def spelled_name(task: Task, rng: random.Random) -> str:
    """Another name a user might ask for: the request's own words in another combination, in
    snake case (mostly) or camel case."""
    words = [w for w in re.findall(r"[a-z]+", task.request.lower()) if w not in STOP_WORDS]
    fn = Function.parse(task.code)
    if not words or fn is None:
        return "my_function"
    picked = words if len(words) <= 2 else sorted(rng.sample(range(len(words)), rng.randint(2, min(3, len(words)))))
    parts = [words[i] for i in picked] if len(words) > 2 else words
    prefix = rng.choice(("", "", "get_", "compute_", "my_", "calc_", "do_"))
    name = prefix + "_".join(parts)
    if name == fn.name:
        name = "my_" + name
    if rng.random() < 0.2:
        head, *tail = name.split("_")
        name = head + "".join(t.capitalize() for t in tail)
    return name


def follow_up(edit: "Edit | str", fn: Function, task: Task, rng: random.Random) -> tuple[str | None, str]:
    """(the edited function or None where the edit does not fit, what the user asks): ``edit`` is
    one of ``EDITS``, "doc" or "rename"."""
    if edit == "doc":
        return add_docstring(task.request)(fn), rng.choice(DOCSTRING_FOLLOWUPS)
    if edit == "rename":
        new = spelled_name(task, rng)
        return fn.source(name=new), rng.choice(RENAME_FOLLOWUPS).format(name=new)
    return edit.rewrite(fn), edit.ask(fn, rng)


def followup_chats(tasks: list[Task], rng: random.Random, render_request, max_turns: int = 3) -> list[list[dict]]:
    """Conversations of 2-``max_turns`` user turns: a task's request and solution, then edits
    that fit it, each answered by the edited function (same name)."""
    out = []
    for task in tasks:
        fn = Function.parse(task.code)
        if fn is None:
            continue
        edits = [e for e in EDITS if e.rewrite(fn)] + ["doc", "rename"]
        rng.shuffle(edits)
        messages = [{"role": "user", "content": render_request(task, rng)}, {"role": "assistant", "content": task.code}]
        current = fn
        for edit in edits[: rng.randint(1, max_turns - 1)]:
            code, ask = follow_up(edit, current, task, rng)
            if code is None:
                continue
            messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": code}]
            out.append(list(messages))
            current = Function.parse(code)
            if current is None:
                break
    return out


def edge_case_chats(tasks: list[Task], rng: random.Random, phrase_with_clause) -> list[list[dict]]:
    """One-turn requests that state an edge case, answered with the guard in place."""
    out = []
    for task in tasks:
        fn = Function.parse(task.code)
        if fn is None:
            continue
        for edit in EDITS:
            code = edit.rewrite(fn) if edit.clauses else None
            if code:
                request = phrase_with_clause(task, rng.choice(edit.clauses), rng)
                out.append([{"role": "user", "content": request}, {"role": "assistant", "content": code}])
    return out


def named_chats(tasks: list[Task], rng: random.Random, third_person) -> list[list[dict]]:
    """Requests that name the function, answered with that name."""
    out = []
    for task in tasks:
        fn = Function.parse(task.code)
        if fn is None:
            continue
        name = spelled_name(task, rng)
        template = rng.choice(NAMED_REQUESTS)
        request = template.format(name=name, imp=task.request, third=third_person(task.request))
        out.append([{"role": "user", "content": request}, {"role": "assistant", "content": fn.source(name=name)}])
    return out


def own_reply_chats(tasks: list[Task], replies: list[dict], rng: random.Random) -> list[list[dict]]:
    """Edits that follow a reply the model itself wrote (``replies``: rows of ``request``, the
    task's request; ``user``, the words sent; ``reply``, the model's greedy answer), right or
    wrong, answered by the task's own function with the edit applied, under the task's name:
    the edit of a reply that missed is still the function the user asked for."""
    by_request: dict[str, Task] = {}
    for task in tasks:  # tasks that share a request are solutions of it alike: the first one answers
        by_request.setdefault(task.request, task)
    out = []
    for row in replies:
        task = by_request.get(row["request"])
        fn = Function.parse(task.code) if task else None
        if fn is None:
            continue
        edits = [e for e in EDITS if e.rewrite(fn)] + (["doc"] if fn.doc is None else []) + ["rename"]
        code, ask = follow_up(rng.choice(edits), fn, task, rng)
        out.append([{"role": "user", "content": row["user"]}, {"role": "assistant", "content": row["reply"]},
                    {"role": "user", "content": ask}, {"role": "assistant", "content": code}])
    return out
