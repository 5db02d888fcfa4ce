"""scripts/cycle_ends.py puts each emitted token in a region of its reply."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cycle_ends.py"


def load_script():
    spec = importlib.util.spec_from_file_location("cycle_ends", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_regions_follow_the_reply_line_by_line():
    region = load_script().region
    assert region("", "def") == "def/class line"
    assert region("def add(a, b", "):") == "def/class line"
    assert region('def add(a, b):\n    """', "Add") == "docstring"  # inside an open docstring
    assert region('def add(a, b):\n    """Add."""\n', "    return") == "body"
    assert region("class Stack:\n    def", " push") == "def/class line"  # a method's line, indented
    assert region("x = 1\n", "print") == "body"
