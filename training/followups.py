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

import random
import re
from dataclasses import dataclass
from typing import Callable

from .task_families import Task, sentence

NUMBER_PARAMS = {"n", "x", "number", "num", "value", "celsius", "fahrenheit", "kelvin", "kilometers", "miles",
                 "kilograms", "pounds", "meters", "feet", "inches", "centimeters", "liters", "gallons", "degrees",
                 "radians", "bytes", "age", "year", "amount", "radius", "side", "width", "height", "length"}
LIST_PARAMS = {"numbers", "items", "values", "words", "strings", "nums", "lst", "scores", "prices", "names"}
TEXT_PARAMS = {"text", "word", "sentence", "string", "s"}


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


@dataclass(frozen=True)
class Edit:
    followups: tuple[str, ...]  # what a user types after the first reply
    clauses: tuple[str, ...]  # the same said inside the first request ("" if it cannot be)
    rewrite: Callable[[Function], str | None]


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
    Edit(("Make it ignore case.", "Now make it case-insensitive.", "It should not care about upper or lower case."),
         ("ignoring case",), ignore_case),
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
            if edit == "doc":
                code, ask = add_docstring(task.request)(current), rng.choice(DOCSTRING_FOLLOWUPS)
            elif edit == "rename":
                new = spelled_name(task, rng)
                code, ask = current.source(name=new), rng.choice(RENAME_FOLLOWUPS).format(name=new)
            else:
                code, ask = edit.rewrite(current), rng.choice(edit.followups)
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
