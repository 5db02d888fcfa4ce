"""The default training corpus: the running Python's standard library source.

Files are split into train / held-out by a hash of their path relative to the corpus root, so
the split is fixed across machines and runs. Besides raw source, the corpus yields chat
examples (request -> code) derived from functions: a docstring's first line as the user's
request, the function source as the assistant's reply, and "Complete this code:" prompts."""

from __future__ import annotations

import ast
import hashlib
import os
import random
import sysconfig
import textwrap
from pathlib import Path

SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__",
             "encodings", "pydoc_data", "lib2to3", "ensurepip", "turtledemo"}
MAX_FILE_BYTES = 250_000
HELDOUT_FRACTION = 0.05


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def list_source_files(root: Path | None = None, max_bytes: int = MAX_FILE_BYTES) -> list[Path]:
    """Sorted *.py files under root, skipping test directories, installed packages and huge
    (generated/table) files."""
    root = Path(root) if root else stdlib_root()
    out = []
    # skipped directories are never entered: the standard library's site-packages alone can
    # hold 50,000 files (torch), which a glob would walk before dropping them. Linked folders are
    # not followed (as a recursive glob does not): a venv's lib64 -> lib would list every file
    # twice, and a link back up the tree would never end.
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("test_")]
        for name in names:
            if not name.endswith(".py") or name.startswith("test_"):
                continue
            path = Path(folder) / name
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if 0 < size <= max_bytes:
                out.append(path)
    return sorted(out)


def is_heldout(rel_path: str, fraction: float = HELDOUT_FRACTION) -> bool:
    h = int(hashlib.sha256(rel_path.replace("\\", "/").encode()).hexdigest()[:8], 16)
    return (h % 10_000) < fraction * 10_000


def split_files(root: Path | None = None, fraction: float = HELDOUT_FRACTION):
    """(train_files, heldout_files). Held-out is never empty when there are >= 2 files."""
    root = Path(root) if root else stdlib_root()
    files = list_source_files(root)
    train, held = [], []
    for p in files:
        (held if is_heldout(str(p.relative_to(root)), fraction) else train).append(p)
    if not held and len(train) >= 2:
        held.append(train.pop())
    return train, held


def read_source(path: Path) -> str:
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    return text.replace("\r\n", "\n").expandtabs(4)


def function_pairs(source: str, max_lines: int = 60) -> list[tuple[str, str]]:
    """(request, code) pairs from functions that have a docstring: the request is the
    docstring's first line, the code is the dedented function source (decorators excluded)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    pairs = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc:
            continue
        first = doc.strip().splitlines()[0].strip()
        if len(first) < 12 or len(first) > 160:
            continue
        end = getattr(node, "end_lineno", None)
        if end is None or end - node.lineno + 1 > max_lines:
            continue
        code = textwrap.dedent("\n".join(lines[node.lineno - 1 : end]))
        if node.name.startswith("_") and not node.name.startswith("__"):
            continue
        pairs.append((first, code))
    return pairs


REQUEST_TEMPLATES = (
    "{req}",
    "Write a Python function: {req}",
    "{req} Write it in Python.",
    "Write `{name}`: {req_lc}",
)


def chat_examples(source: str, rng: random.Random) -> list[list[dict]]:
    """Chat conversations derived from one file's functions."""
    out = []
    for req, code in function_pairs(source):
        name = code.split("(", 1)[0].split()[-1] if "(" in code else "it"
        if rng.random() < 0.3:
            # "Complete this code:" with the signature (and maybe the docstring) as the prefix.
            code_lines = code.splitlines()
            k = rng.randint(1, max(1, min(4, len(code_lines) - 1)))
            user = "Complete this code:\n" + "\n".join(code_lines[:k])
        else:
            tmpl = rng.choice(REQUEST_TEMPLATES)
            req_lc = req[:1].lower() + req[1:]
            user = tmpl.format(req=req, req_lc=req_lc, name=name)
        out.append([{"role": "user", "content": user}, {"role": "assistant", "content": code}])
    return out
