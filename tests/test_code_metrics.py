"""The request -> code metrics of `train eval` (training.code_metrics): each must be able to fail."""

from __future__ import annotations

from training import code_metrics as cm

# The reply an earlier tiny coder gave to every request, before it was trained on requests.
TKINTER = '''def get_file(self, name):
    """Return the name of the name of the reverse of a string."""
    return self.tk.call(self._w, 'set')'''


def test_request_keywords_drop_instructions_and_input_types():
    assert cm.request_keywords("Write a Python function that reverses a string.") == ["reverses"]
    assert cm.request_keywords("Count the vowels in a sentence") == ["count", "vowels"]
    assert cm.request_keywords("Return the number of words in a sentence") == ["number", "words", "sentence"]
    assert cm.request_keywords("Write a function that returns it") == []


def test_same_word_accepts_inflections_and_refuses_other_words():
    assert cm.same_word("vowels", "vowel") and cm.same_word("sorted", "sort") and cm.same_word("sum", "sum")
    assert cm.same_word("reverses", "reverse") and cm.same_word("shuffled", "shuffle")
    assert not cm.same_word("sum", "summary") and not cm.same_word("leap", "lead") and not cm.same_word("is", "is")
    assert not cm.same_word("interest", "interleave")


def test_defines_code_needs_a_parse_and_a_definition():
    assert cm.defines_code("def f(x):\n    return x\n")
    assert cm.defines_code("class Stack:\n    pass\n")
    assert not cm.defines_code("x = 1\nprint(x)\n")  # parses, defines nothing
    assert not cm.defines_code("def f(x):\n    return (x\n")  # unbalanced bracket
    assert not cm.defines_code("Reverse the string with slicing.")


def test_on_topic_by_name_or_operation_not_by_docstring():
    assert cm.on_topic("Count the vowels in a string.", "def count_vowels(s):\n    return 0\n")
    assert cm.on_topic("Reverse a string.", "def flip(s):\n    return s[::-1]\n")  # the operation
    assert cm.on_topic("Return the largest number in a list", "def top(xs):\n    return max(xs)\n")
    assert not cm.on_topic("Write a Python function that reverses a string", TKINTER)  # only the docstring says it
    assert not cm.on_topic("Check whether a year is a leap year.", 'def f(y):\n    """leap year"""\n    return y\n')
    assert not cm.on_topic("Count the vowels in a string.", "def count_vowels(s):\n    return (s\n")  # no parse
    match = cm.topic_match("Merge two sorted lists", "def merge_lists(a, b):\n    return a + b\n")
    assert match["name"] and match["code"] and match["keywords"] == ["merge", "sorted"]


def test_close_function_stops_where_the_function_ends():
    prefix = "def merge(a, b):\n"
    assert cm.close_function(prefix, "    return a + b\n\n\ndef other():\n    pass\n") == "    return a + b\n"
    method = "class Book:\n    def __init__(self, title):\n"
    assert cm.close_function(method, "        self.title = title\n\n    def read(self):\n") == "        self.title = title\n"


def test_raw_prefix_metrics_fail_on_the_old_continuation():
    prefix = "def merge(a, b):\n"
    good = "    result = sorted(a + b)\n    return result\n\nprint(merge([1], [2]))\n"
    assert cm.parses_when_closed(prefix, good) and cm.uses_parameters(prefix, good)
    bad = "    _is_S_S_S_S_S_S_S_S"
    assert not cm.uses_parameters(prefix, bad)
    assert not cm.parses_when_closed(prefix, "    return (a +\n")
    assert not cm.parses_when_closed(prefix, "")  # nothing added
    assert not cm.parses_when_closed(prefix, "print(a)\n")  # dedented at once: an empty body
    # cut at the token limit: the last (partial) line is dropped before parsing
    assert cm.parses_when_closed(prefix, "    c = a + b\n    return (c", truncated=True)
    assert not cm.parses_when_closed(prefix, "    c = a + b\n    return (c", truncated=False)


def test_function_parameters_skip_self_defaults_and_annotations():
    assert cm.function_parameters('def greeting(name, greeting="Hello"):\n') == ["name", "greeting"]
    assert cm.function_parameters("class Book:\n    def __init__(self, title: str, *authors):\n") == ["title", "authors"]
    assert cm.function_parameters("x = 1\n") == []
