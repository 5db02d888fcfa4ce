"""The house rules, checked on the source (docs/architecture.md explains them).

- Layers: engine/ and storage/ are leaves (they import no other package of ours); training/
  imports engine/ only and only app/ imports it; service/ (a
  request run on the engine and recorded in the store) imports engine/ and storage/; ui/ imports
  engine/ (event types, configs, pure helpers), service/ and from storage/ only its named errors,
  the export format's reader and its records (it is handed a running store); nothing imports
  app/, which wires everything, and the API's modules (app/api*) never import ui/: the API
  serves without the page.
- The page (ui/) and the API (app/api*) are two thin callers of the reply service (service/):
  neither imports the other, and neither touches the service's registry of running replies or
  its worker function.
- No import circle between modules of our packages, counting imports inside functions too (a
  deferred import hides a circle from Python, not from the reader).
- No function or method over MAX_FUNCTION_LINES lines in app/, engine/, ui/, storage/.

Everything is read with `ast`, so nothing is imported and the test runs in well under a second.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "engine", "ui", "storage", "service", "training")
# Which of our packages each package may import (its own modules always).
ALLOWED = {
    "engine": set(),
    "storage": set(),
    "service": {"engine", "storage"},
    "ui": {"engine", "service"},
    "app": {"engine", "storage", "service", "ui", "training"},
    "training": {"engine"},  # trains drafts and tiny targets for the runtime; only the CLI runs it
}
# Single modules of a package a layer may import although the package as a whole is off limits.
# named errors; the export format's pure reader; the records the store hands out and what they tell
ALLOWED_MODULES = {"ui": {"storage.errors", "storage.transfer", "storage.records"}}
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of our packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _api_modules() -> list[str]:
    return sorted(module for module in MODULES if module.startswith("app.api"))


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> list[str]:
    """The absolute names an `from X import a, b` may refer to (X itself, or X.a when a module)."""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = package[: len(package) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    names = [target]
    names += [f"{target}.{alias.name}" for alias in node.names]
    return names


def _ours(name: str) -> str | None:
    """The longest module of ours that `name` is or lies in, or None for a third-party name."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def imports_of(module: str) -> dict[str, int]:
    """Our modules that `module` imports (at any depth in the file) -> the first line doing so."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = _resolve(module, path, node)
        else:
            continue
        for name in names:
            target = _ours(name)
            if target is not None and target != module:
                found.setdefault(target, node.lineno)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def test_the_walker_sees_our_packages_and_their_imports():
    # Guards the guards: an empty graph would make every check below pass vacuously.
    assert {"app.cli", "engine.runtime", "ui.layout", "storage.store"} <= set(MODULES)
    assert "engine.events" in GRAPH["ui.chat.generation"]
    assert "service.replies" in GRAPH["app.api_runs"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_respect_the_layers(module):
    package = module.split(".")[0]
    wrong = {
        target: line
        for target, line in GRAPH[module].items()
        if target.split(".")[0] not in ALLOWED[package] | {package}
        and target not in ALLOWED_MODULES.get(package, set())
    }
    assert not wrong, (
        f"{module} imports {sorted(wrong)} (lines {sorted(wrong.values())}); "
        f"{package}/ may import only {sorted(ALLOWED[package]) or 'none of our packages'}"
    )


def test_the_api_never_imports_the_page():
    """app/api*.py serve the OpenAI-compatible API; what they share with the page lives in
    service/ or engine/, so the API neither loads Gradio's page code nor breaks when it changes."""
    api = _api_modules()
    assert "app.api" in api and "app.api_runs" in api  # guards the guard
    wrong = {module: sorted(t for t in GRAPH[module] if t.split(".")[0] == "ui") for module in api}
    wrong = {module: targets for module, targets in wrong.items() if targets}
    assert not wrong, f"API modules import the page: {wrong}"


def test_the_page_and_the_api_never_reach_into_each_other():
    """ui/ and app/api*.py are two callers of the reply service: neither imports the other."""
    api = set(_api_modules())
    page = {module for module in MODULES if module.startswith("ui.")}
    assert "ui.chat.handlers" in page and "app.api_runs" in api  # guards the guard
    wrong = sorted(f"{module} -> {target}" for module in page for target in GRAPH[module] if target in api)
    wrong += sorted(f"{module} -> {target}" for module in api for target in GRAPH[module] if target in page)
    assert not wrong, f"the page and the API import each other: {wrong}"


# What only the reply service may touch: its registry of running replies (the page and the API
# ask ``ReplyService.stop`` / ``reply_pending`` / ``mark_request``) and its worker function (they
# call ``ReplyService.start``, which also registers the reply's cancel flag).
SERVICE_INTERNALS = {"modules": {"service.registry"}, "names": {"_registry", "CancelRegistry", "record_reply"}}


def reaches_into_the_service(module: str) -> list[str]:
    """Where ``module`` imports the service's internals or names them (``x._registry``)."""
    path = MODULES[module]
    found = [f"imports {target} (line {line})" for target, line in GRAPH[module].items()
             if target in SERVICE_INTERNALS["modules"]]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        name = (node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name)
                else next((a.name for a in node.names if a.name in SERVICE_INTERNALS["names"]), None)
                if isinstance(node, ast.ImportFrom) else None)
        if name in SERVICE_INTERNALS["names"]:
            found.append(f"names {name} (line {node.lineno})")
    return found


def test_reaching_into_the_service_is_seen(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from service.replies import record_reply\n\ndef stop(ctx):\n    ctx.replies._registry.cancel(1)\n")
    MODULES["planted"], GRAPH["planted"] = planted, {"service.replies": 1}
    try:
        assert reaches_into_the_service("planted") == ["names record_reply (line 1)", "names _registry (line 4)"]
    finally:
        del MODULES["planted"], GRAPH["planted"]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("ui.") or m.startswith("app.api")))
def test_the_page_and_the_api_use_the_reply_service_not_its_internals(module):
    wrong = reaches_into_the_service(module)
    assert not wrong, f"{module} reaches into the reply service: {wrong}"


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _package_edges(graph):
    """A package's __init__ re-exporting its modules is not a circle through the package."""
    return {
        module: {
            target: line
            for target, line in targets.items()
            # `from engine.x import y` also names the package `engine` (its __init__ runs first);
            # that edge is Python's import machinery, not a dependency on the re-exports.
            if not (target in PACKAGES and module.startswith(target + "."))
        }
        for module, targets in graph.items()
    }


def test_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_import_circles():
    circles = _cycles(_package_edges(GRAPH))
    assert not circles, "import circles between our modules: " + "; ".join(
        " <-> ".join(circle) for circle in circles
    )


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    too_long = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # From the `def` line (decorators excluded) to the last line of the body.
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return too_long


def test_length_check_counts_a_long_function(tmp_path):
    source = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES + "\ndef g():\n    return 1\n"
    (tmp_path / "m.py").write_text(source)
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert long_functions(tmp_path / "m.py") == [f"m.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
    finally:
        ROOT = saved


# Functions still being split by their owners; each entry must go, none may be added.
BEING_SPLIT: set[str] = set()


def _key(entry: str) -> str:
    location, name = entry.split(" ")[:2]
    return f"{location.split(':')[0]} {name}"


def test_no_function_over_the_length_limit():
    too_long = [entry for path in MODULES.values() for entry in long_functions(path)]
    new = [entry for entry in too_long if _key(entry) not in BEING_SPLIT]
    assert not new, f"functions over {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(new)
    done = BEING_SPLIT - {_key(entry) for entry in too_long}
    assert not done, f"now short enough, remove from BEING_SPLIT: {sorted(done)}"
