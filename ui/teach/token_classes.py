"""Which kinds of token the draft writes.

Every token of a reply gets a class from what it is in the code (indentation and newlines,
keywords, names, operators and punctuation, strings, numbers, comments; pygments' Python lexer
on the code: a Complete-mode reply, or the inside of a chat reply's code fences) or "prose".
A token either came from an accepted draft or the target wrote it itself (the first token and
each cycle's bonus token). The share of each class the draft wrote shows where block drafting
pays: the predictable structure of code, not the names a program happens to choose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby

from pygments.token import Comment, Keyword, Name, Number, Operator, Punctuation, String, Text, Whitespace

from ..chat.render import FENCE, lex_into
from .steps import first_text

CLASSES = ("whitespace", "keyword", "name", "operator", "string", "number", "comment", "prose")
LABELS = {"whitespace": "indentation & newlines", "keyword": "keywords", "name": "names",
          "operator": "operators & punctuation", "string": "strings", "number": "numbers",
          "comment": "comments", "prose": "prose"}


def lexer_class(token_type, value: str) -> str:
    if value.isspace() or token_type in Whitespace:
        return "whitespace"
    if token_type in Keyword or token_type in Operator.Word:
        return "keyword"
    if token_type in String:
        return "string"
    if token_type in Number:
        return "number"
    if token_type in Comment:
        return "comment"
    if token_type in Operator or token_type in Punctuation:
        return "operator"
    if token_type in Name or token_type in Text:
        return "name"
    return "operator"  # lexer errors: stray characters such as a lone "$"


def char_classes(text: str, code: list[bool], mode: str = "chat") -> list[str]:
    """The class of every character of a reply's text, given which characters are code
    (``analytics.code_mask``). Fence lines themselves are prose."""
    mask = list(code)
    if mode != "complete":
        for fence in FENCE.finditer(text):
            end = min(len(text), fence.end() + 1)  # with its newline
            mask[fence.start():end] = [False] * (end - fence.start())
    classes = ["prose"] * len(text)
    start = 0
    for is_code, run in groupby(mask):
        length = sum(1 for _ in run)
        if is_code:  # lex each stretch of code on its own
            lex_into(text[start:start + length], "python", start, classes, lexer_class)
        start += length
    return classes


def piece_class(classes: list[str], start: int, length: int) -> str:
    """A token's class: that of its first visible character (a token such as " return" is a
    keyword); all-blank tokens are whitespace in code and prose elsewhere."""
    span = classes[start:start + length]
    if not span:
        return "prose"
    return next((cls for cls in span if cls != "whitespace"), "whitespace")


@dataclass
class ClassCounts:
    drafted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))

    def add(self, cls: str, from_draft: bool) -> None:
        self.total[cls] += 1
        self.drafted[cls] += from_draft

    def merge(self, other: "ClassCounts") -> None:
        for cls in CLASSES:
            self.total[cls] += other.total[cls]
            self.drafted[cls] += other.drafted[cls]

    def share(self, cls: str) -> float | None:
        """Of this class's tokens, the fraction that came from accepted drafts."""
        return self.drafted[cls] / self.total[cls] if self.total[cls] else None

    def present(self) -> list[str]:
        return [cls for cls in CLASSES if self.total[cls]]


def reply_token_classes(content: str, cycles: list[dict], code: list[bool], mode: str = "chat") -> ClassCounts:
    """Counts per class for one stored reply (its text, which characters are code, its cycles'
    emitted pieces). Pieces without text (half of a multi-byte character) are not counted."""
    counts = ClassCounts()
    classes = char_classes(content, code, mode)
    head = first_text(content, cycles)
    if head:
        counts.add(piece_class(classes, 0, len(head)), False)
    position = len(head)
    for cycle in cycles:
        accepted = int(cycle.get("accepted") or 0)
        for slot, piece in enumerate(cycle.get("emitted_pieces") or ()):
            if piece:
                counts.add(piece_class(classes, position, len(piece)), slot < accepted)
            position += len(piece)
    return counts
