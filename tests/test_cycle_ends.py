"""scripts/cycle_ends.py puts each emitted token in a region of its reply."""

from tests.script_loader import load_script


def test_regions_follow_the_reply_line_by_line():
    region = load_script("cycle_ends").region
    assert region("", "def") == "def/class line"
    assert region("def add(a, b", "):") == "def/class line"
    assert region('def add(a, b):\n    """', "Add") == "docstring"  # inside an open docstring
    assert region('def add(a, b):\n    """Add."""\n', "    return") == "body"
    assert region("class Stack:\n    def", " push") == "def/class line"  # a method's line, indented
    assert region("x = 1\n", "print") == "body"
