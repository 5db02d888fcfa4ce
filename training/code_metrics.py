"""Does a reply answer a coding request? Pure checks on text, used by `train eval`:

- ``defines_code``: the reply parses as Python and defines a function or class;
- ``on_topic``: the function/class name or the code's identifiers (docstrings and comments not
  counted) carry a key word of the request, or the operation a key word names (``largest`` ->
  ``max``);
- for raw code prefixes, ``close_function`` cuts the continuation where the prefixed function
  ends, ``parses_when_closed`` checks that prefix + that body parse, and ``uses_parameters``
  that the continuation reads the function's parameters."""

from __future__ import annotations

import ast
import re

# Words of a request that say nothing about what to compute: instructions, articles, and the
# types of the inputs (a reply that merely names its parameter `sentence` is not on topic).
INSTRUCTION_WORDS = frozenset("""
a an the and or of in on to from for with into by as at is are be it its this that these those which
who what how do does can could you me my i we need want please give show make create write writes
implement implements define defines function functions python program code method methods class classes
script simple small given return returns get gets take takes check checks whether if true false
otherwise each every all one two three new like such some any using use than then there their them
called based equal named
""".split())
# The types of the inputs: key words only when a request names nothing else ("return the number of
# words in a sentence"); a reply that merely names its parameter `sentence` is not on topic.
TYPE_WORDS = frozenset("""
list lists string strings number numbers integer integers int float value values item items element
elements array arrays dictionary dict text sentence sentences word words input output length lengths
""".split())
GENERIC_WORDS = INSTRUCTION_WORDS | TYPE_WORDS

# Key word -> code that performs it (searched in the code without docstrings).
OPERATIONS = {
    "sum": ("sum(", "+"), "total": ("sum(", "+"), "add": ("+",), "largest": ("max(", ">"),
    "maximum": ("max(", ">"), "biggest": ("max(", ">"), "highest": ("max(", ">"), "longest": ("max(", "len("),
    "smallest": ("min(", "<"), "minimum": ("min(", "<"), "lowest": ("min(", "<"), "shortest": ("min(", "len("),
    "reverse": ("[::-1]", "reversed(", ".reverse("), "sort": ("sorted(", ".sort("), "average": ("sum(",),
    "mean": ("sum(",), "multiply": ("*",), "product": ("*",), "square": ("** 2", "**2"), "squares": ("** 2", "**2"),
    "count": ("len(", ".count(", "+= 1", "sum("), "join": (".join(",), "split": (".split(",),
    "uppercase": (".upper(",), "lowercase": (".lower(",), "shuffled": ("shuffle(",), "shuffle": ("shuffle(",),
    "divide": ("/",), "compare": ("==", "<", ">"), "power": ("**", "pow("), "remainder": ("%",),
}
PREFIX = 5  # shared leading letters that make two words the same key word ("vowels" ~ "vowel")


def request_keywords(request: str) -> list[str]:
    """The request's content words, lower case, in order, without duplicates; the input types
    it names when it names nothing else."""
    words = [w for w in dict.fromkeys(re.findall(r"[a-z]+", request.lower())) if len(w) >= 3]
    content = [w for w in words if w not in GENERIC_WORDS]
    return content or [w for w in words if w not in INSTRUCTION_WORDS]


def split_identifier(name: str) -> list[str]:
    """'count_vowels' -> ['count', 'vowels']; 'BankAccount' -> ['bank', 'account']."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).replace("_", " ")
    return [w.lower() for w in spaced.split() if w]


def same_word(keyword: str, word: str) -> bool:
    """Inflections of one word: the shorter (3+ letters) is a prefix of the longer up to its last
    two letters, and they share at least min(PREFIX, shorter) letters ('sorted' ~ 'sort',
    'vowels' ~ 'vowel', 'reverses' ~ 'reverse'; not 'sum' ~ 'summary', 'interest' ~ 'interleave')."""
    shorter, longer = sorted((keyword, word), key=len)
    if len(shorter) < 3:
        return False
    need = max(min(PREFIX, len(shorter)), len(shorter) - 2)
    if shorter[:need] != longer[:need]:
        return False
    return len(shorter) >= PREFIX or len(longer) - len(shorter) <= 2


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                ids.add(id(first.value))
    return ids


def definitions(tree: ast.AST) -> list[ast.AST]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def code_words(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(words of the defined names, words of every identifier and non-docstring string)."""
    docstrings = _docstring_nodes(tree)
    names, words = set(), set()
    for node in ast.walk(tree):
        found = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.update(split_identifier(node.name))
            found.append(node.name)
        elif isinstance(node, ast.Name):
            found.append(node.id)
        elif isinstance(node, ast.Attribute):
            found.append(node.attr)
        elif isinstance(node, ast.arg):
            found.append(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += re.findall(r"[A-Za-z]+", node.value)
        for name in found:
            words.update(split_identifier(name))
    return names, words


def strip_docstrings(tree: ast.AST) -> str:
    docstrings = _docstring_nodes(tree)

    class Strip(ast.NodeTransformer):
        def visit_Expr(self, node):
            return None if id(node.value) in docstrings else node

    return ast.unparse(Strip().visit(tree))


def parse(code: str) -> ast.AST | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def defines_code(reply: str) -> bool:
    """The reply parses as Python and defines at least one function or class."""
    tree = parse(reply)
    return tree is not None and bool(definitions(tree))


def topic_match(request: str, reply: str) -> dict:
    """{'name': a key word names the function/class, 'code': a key word or its operation is in
    the code (docstrings excluded), 'keywords': the request's key words}. Unparseable replies
    match nothing."""
    keywords = request_keywords(request)
    tree = parse(reply)
    if tree is None or not keywords:
        return {"name": False, "code": False, "keywords": keywords}
    names, words = code_words(tree)
    body = strip_docstrings(tree)
    by_name = any(same_word(k, w) for k in keywords for w in names)
    by_code = any(same_word(k, w) for k in keywords for w in words) or any(
        snippet in body for k in keywords for snippet in OPERATIONS.get(k, ()))
    return {"name": by_name, "code": by_name or by_code, "keywords": keywords}


def on_topic(request: str, reply: str) -> bool:
    return topic_match(request, reply)["code"]


# ---------------------------------------------------------------- raw code prefixes

_DEF = re.compile(r"^(\s*)(?:async\s+def|def|class)\s+(\w+)", re.M)


def close_function(prefix: str, continuation: str) -> str:
    """The continuation up to where the prefix's last def/class ends: the first non-blank line
    indented no deeper than that definition's line."""
    heads = list(_DEF.finditer(prefix))
    indent = len(heads[-1].group(1)) if heads else 0
    lines = continuation.split("\n")
    kept = []
    for i, line in enumerate(lines):
        starts_line = i > 0 or prefix.endswith("\n") or not prefix
        if starts_line and line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        kept.append(line)
    return "\n".join(kept).rstrip() + "\n"


def parses_when_closed(prefix: str, continuation: str, truncated: bool = False) -> bool:
    """prefix + the closed continuation parse and add at least one statement to the prefix's
    definition. ``truncated``: generation stopped at the token limit, so its last line may be
    cut mid-way and is dropped first."""
    body = close_function(prefix, continuation)
    if truncated and body.strip():
        lines = body.rstrip("\n").split("\n")
        body = "\n".join(lines[:-1]) + "\n" if len(lines) > 1 else body
    if not body.strip():
        return False
    return parse(prefix + body) is not None


def function_parameters(prefix: str) -> list[str]:
    """The parameters of the prefix's last def (for a class prefix: its __init__ if given),
    without self/cls."""
    heads = [m for m in _DEF.finditer(prefix) if "def" in m.group(0)]
    if not heads:
        return []
    signature = prefix[heads[-1].end():].split(")")[0]
    params = []
    for part in signature.lstrip("(").split(","):
        name = part.split("=")[0].split(":")[0].strip().lstrip("*")
        if name.isidentifier() and name not in ("self", "cls"):
            params.append(name)
    return params


def uses_parameters(prefix: str, continuation: str) -> bool:
    """The closed continuation reads at least one parameter of the function it continues."""
    params = set(function_parameters(prefix))
    names = set(re.findall(r"[A-Za-z_]\w*", close_function(prefix, continuation)))
    return bool(params & names)
