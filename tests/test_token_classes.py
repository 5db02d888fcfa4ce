"""Token classes for the analytics: what each character of a reply is, and which tokens came
from accepted drafts, on hand-worked replies."""

from __future__ import annotations

from ui.teach.analytics import code_mask
from ui.teach.token_classes import CLASSES, char_classes, piece_class, reply_token_classes


def classes_of(text, mode="complete"):
    return char_classes(text, code_mask(text, mode), mode)


def test_characters_of_code_get_their_lexical_class():
    text = "def f(x):\n    return x + 1  # one\n"
    got = classes_of(text)
    at = lambda fragment: got[text.index(fragment)]
    assert at("def") == "keyword" and at("return") == "keyword"
    assert at("f(") == "name" and at("x)") == "name"
    assert at("(") == "operator" and at("+") == "operator"
    assert at("1") == "number" and at("# one") == "comment"
    assert got[text.index("\n    ") + 2] == "whitespace"


def test_chat_replies_lex_only_inside_fences():
    text = "Here you go:\n```python\nx = 'a'\n```\nDone."
    got = classes_of(text, "chat")
    assert got[0] == "prose" and got[text.index("Done")] == "prose"
    assert got[text.index("```python")] == "prose"  # the fence line is markdown, not code
    assert got[text.index("x =")] == "name" and got[text.index("'a'")] == "string"


def test_a_token_takes_the_class_of_its_first_visible_character():
    text = "    return x\n"
    got = classes_of(text)
    assert piece_class(got, 0, len("    return")) == "keyword"  # " return"-style tokens are keywords
    assert piece_class(got, 0, 4) == "whitespace"
    assert piece_class(got, len(text) - 1, 1) == "whitespace"  # the newline
    assert piece_class(["prose"] * 3, 0, 2) == "prose"  # blanks in prose stay prose
    assert piece_class(got, 99, 1) == "prose"  # past the end: nothing to class


def test_drafted_and_target_tokens_are_counted_per_class():
    # the prefill token "def", then two cycles: 2 of 3 drafts accepted + bonus, 0 accepted + bonus
    text = "def f():\n    pass\n"
    cycles = [
        {"accepted": 2, "emitted_pieces": [" f", "():", "\n"]},
        {"accepted": 0, "emitted_pieces": ["    pass"]},
        {"accepted": 1, "emitted_pieces": ["\n", ""]},  # an empty piece (half a character) is not counted
    ]
    counts = reply_token_classes(text, cycles, code_mask(text, "complete"), "complete")
    assert counts.total == {**dict.fromkeys(CLASSES, 0), "keyword": 2, "name": 1, "operator": 1, "whitespace": 2}
    assert counts.drafted == {**dict.fromkeys(CLASSES, 0), "name": 1, "operator": 1, "whitespace": 1}
    assert counts.share("keyword") == 0.0 and counts.share("whitespace") == 0.5 and counts.share("string") is None
    assert counts.present() == ["whitespace", "keyword", "name", "operator"]


def test_bare_code_in_a_chat_reply_is_code_and_its_prose_stays_prose():
    text = "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\nThis adds two numbers and prints the result.\n"
    strict, loose = code_mask(text, "chat"), code_mask(text, "chat", loose=True)
    assert not any(strict)
    got = char_classes(text, loose, "chat")
    assert got[0] == "keyword" and got[text.index("print")] == "name"
    assert loose[text.index("\n\n") + 1]  # a blank line between code lines is code
    assert got[text.index("This adds")] == "prose"
