"""Request -> code fine-tuning data for the tiny coder (`train target --data requests`).

Three sources, all offline:
- the simple tasks of ``task_families`` (written for this project), each request in several
  phrasings ("Write a function that counts the vowels in a string.", "How do I count the vowels
  in a string in Python?", ...);
- docstring pairs from real code: module-level functions with a docstring in the standard
  library and in a few permissively licensed packages installed here (``PACKAGES``, licence
  checked against the installed metadata), the docstring's first line turned into a request;
- raw code: the task solutions and those functions as plain source, plus standard-library files,
  so that a raw prefix like ``def merge(a, b):`` is continued with a body that uses a and b.

Chat examples use the app's template (``render_chat``): bare code replies that end at <|end|>."""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import random
import re
import textwrap
from pathlib import Path

import torch

# Packages whose source may be used (name -> the licence it must declare). A package that is not
# installed, or whose metadata declares another licence, is skipped (and the skip is logged).
PACKAGES = {
    "click": "BSD-3-Clause", "jinja2": "BSD-3-Clause", "werkzeug": "BSD-3-Clause",
    "pyparsing": "MIT", "attr": "MIT", "six": "MIT", "idna": "BSD-3-Clause",
    "networkx": "BSD-3-Clause", "sortedcontainers": "Apache-2.0", "packaging": "Apache-2.0 OR BSD-2-Clause",
    "requests": "Apache-2.0", "dateutil": "Apache-2.0 OR BSD-3-Clause", "pygments": "BSD-2-Clause",
}
DISTRIBUTIONS = {"attr": "attrs", "dateutil": "python-dateutil", "jinja2": "Jinja2", "pygments": "Pygments",
                 "yaml": "PyYAML", "markdown_it": "markdown-it-py"}  # module -> distribution, where they differ

# {imp}: "count the vowels in a string"; {third}: "counts the vowels in a string"
PHRASINGS = (
    "{Imp}.", "{imp}", "Write a function that {third}.", "Write a Python function that {third}.",
    "Write a Python function to {imp}.", "Write a function to {imp}.", "Create a function that {third}.",
    "Implement a function that {third}.", "How do I {imp} in Python?", "I need a function to {imp}.",
    "Python function to {imp}", "Define a function that {third}.", "Can you write a function that {third}?",
    "Give me Python code to {imp}.", "Write code to {imp}.", "Please write a function that {third}.",
)
CLASS_PHRASINGS = ("{Imp}.", "{imp}", "Write Python code to {imp}.", "Please {imp}.", "Can you {imp}?",
                   "{Imp} in Python.")
MAX_DOC_FUNCTION_LINES = 25
SYNTHETIC_PHRASINGS = 8  # distinct phrasings per task
STDLIB_RAW_SHARE = 0.5  # of the raw tokens


def third_person(imperative: str) -> str:
    """'count the vowels' -> 'counts the vowels'; 'check ...' -> 'checks'; 'apply' -> 'applies'."""
    verb, _, rest = imperative.partition(" ")
    if verb.endswith(("s", "sh", "ch", "x", "z")):
        verb += "es"
    elif verb.endswith("y") and verb[-2:-1] not in "aeiou":
        verb = verb[:-1] + "ies"
    else:
        verb += "s"
    return f"{verb} {rest}".strip()


def phrase(imperative: str, template: str) -> str:
    return template.format(imp=imperative, Imp=imperative[:1].upper() + imperative[1:],
                           third=third_person(imperative))


# Words users capitalise (names and acronyms); the task families write them in lower case.
USER_CAPITALS = {w.lower(): w for w in (
    "Fibonacci", "Celsius", "Fahrenheit", "Kelvin", "Roman", "Caesar", "Newton", "Collatz", "Armstrong",
    "FizzBuzz", "Pascal", "Euclid", "Euclidean", "Pythagorean", "Morse", "Luhn", "Gregorian", "Python",
    "JSON", "CSV", "URL", "HTML", "ASCII", "UTF-8", "ISO", "RGB", "DNA", "ID", "IP", "UUID", "HTTP")}
USER_WORDING_SHARE = 0.5  # of the requests reworded by ``user_wording`` in `--data wording`


def user_wording(imperative: str, rng: random.Random) -> str:
    """A request as users often type it: names and acronyms capitalised ('fibonacci' ->
    'Fibonacci', 'csv' -> 'CSV'), and 'check whether' as 'check if' (each half the time), so
    that the model answers both spellings of the same request alike."""
    words = [USER_CAPITALS.get(w.lower(), w) if rng.random() < 0.5 else w for w in imperative.split(" ")]
    out = " ".join(words)
    if rng.random() < 0.5:
        out = re.sub(r"\bcheck whether\b", "check if", out)
    return out


def task_requests(task, n: int, rng: random.Random, reword: float = 0.0,
                  paraphrases: dict[str, list[str]] | None = None) -> list[str]:
    """``n`` phrasings of the task's request; ``reword`` of them in a user's wording (``user_wording``);
    with ``paraphrases`` (request -> other wordings of it, ``task_data.paraphrases``) each phrasing
    wraps one of the task's wordings, drawn at random."""
    templates = CLASS_PHRASINGS if task.code.startswith("class ") else PHRASINGS
    wordings = [task.request] + list((paraphrases or {}).get(task.request, ()))
    out = []
    for template in rng.sample(templates, min(n, len(templates))):
        imperative = rng.choice(wordings)
        out.append(phrase(user_wording(imperative, rng) if reword and rng.random() < reword else imperative, template))
    return out


DOC_VERBS = {"return", "get", "set", "create", "convert", "check", "compute", "calculate", "make", "find",
             "read", "write", "parse", "build", "add", "remove", "test", "count", "split", "join", "format",
             "load", "save", "open", "close", "generate", "yield", "encode", "decode", "escape", "quote",
             "unquote", "normalize", "strip", "replace", "sort", "merge", "copy", "update", "apply", "extract",
             "determine", "construct", "print", "wrap", "match", "search", "insert", "delete", "validate",
             "translate", "iterate", "collect", "filter", "map", "transform", "turn", "compare", "render"}


def base_verb(word: str) -> str:
    """'Returns' -> 'return', 'Matches' -> 'match', 'Applies' -> 'apply', 'Return' -> 'return'."""
    verb = word.lower()
    if verb.endswith("ies"):
        return verb[:-3] + "y"
    if verb.endswith("es") and verb[:-2].endswith(("sh", "ch", "x", "ss")):
        return verb[:-2]
    if verb.endswith("s") and not verb.endswith("ss"):
        return verb[:-1]
    return verb


def docstring_request(doc_line: str, rng: random.Random) -> str:
    """A user request from a docstring's first line ('Return the sum of ...' / 'Returns ...')."""
    first, _, rest = doc_line.rstrip(".").partition(" ")
    verb = base_verb(first)
    if verb in DOC_VERBS and rest:
        return phrase(f"{verb} {rest}", rng.choice(PHRASINGS))
    return rng.choice(("Write a Python function: {d}", "{d}", "Write a function for this: {d}")).format(d=doc_line)


def module_functions(source: str) -> list[tuple[str, str]]:
    """(docstring first line, dedented source) of the top-level, public functions with a
    docstring, short enough to be a reply."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    out = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        end = getattr(node, "end_lineno", None)
        if not doc or end is None or end - node.lineno + 1 > MAX_DOC_FUNCTION_LINES:
            continue
        first = doc.strip().splitlines()[0].strip()
        if 12 <= len(first) <= 120 and first[:1].isalpha():
            out.append((first, textwrap.dedent("\n".join(lines[node.lineno - 1: end]))))
    return out


def package_licence(module: str) -> str | None:
    """The installed distribution's declared licence (License-Expression, License or classifier)."""
    try:
        meta = importlib.metadata.metadata(DISTRIBUTIONS.get(module, module))
    except importlib.metadata.PackageNotFoundError:
        return None
    text = " ".join(filter(None, [meta.get("License-Expression"), meta.get("License")]
                           + [c for c in meta.get_all("Classifier") or [] if c.startswith("License")]))
    return text or None


def licence_matches(declared: str, expected: str) -> bool:
    words = {"MIT": ("MIT",), "BSD": ("BSD",), "Apache": ("Apache",)}
    families = [k for k in words if k in expected]
    return any(any(w in declared for w in words[k]) for k in families)


def package_roots(log=print, packages: dict[str, str] = PACKAGES, what: str = "request data"
                  ) -> dict[str, tuple[Path, str]]:
    """{module: (source directory, declared licence)} for the allowed ``packages`` (module ->
    the licence it must declare) installed here."""
    import importlib.util

    out = {}
    for module, expected in packages.items():
        spec = importlib.util.find_spec(module)
        declared = package_licence(module)
        if spec is None or not spec.submodule_search_locations or declared is None:
            log(f"{what}: package {module} not installed; skipped")
            continue
        if not licence_matches(declared, expected):
            log(f"{what}: package {module} declares {declared[:60]!r}, not {expected}; skipped")
            continue
        out[module] = (Path(list(spec.submodule_search_locations)[0]), declared)
    return out


def is_held(text: str, fraction: float = 0.03) -> bool:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 10_000 < fraction * 10_000


def docstring_examples(files: list[Path], rng: random.Random,
                       unnamed_share: float = 1.0) -> tuple[list[str], list[str]]:
    """(chat texts, raw function sources) from the module-level functions of these files.
    ``unnamed_share``: the fraction of the pairs kept as chat whose function name carries none of
    the request's key words (``close(fd)`` for "Close the file descriptor" is fine; ``_fn`` for
    "Return a new mapping" teaches a reply to ignore the request)."""
    from training import code_metrics

    from .corpus import read_source
    from .tokenizer import render_chat

    chats, raws = [], []
    for path in files:
        for doc, code in module_functions(read_source(path)):
            request = docstring_request(doc, rng)
            raws.append(code)
            if code_metrics.topic_match(request, code)["name"] or rng.random() < unnamed_share:
                chats.append(render_chat([{"role": "user", "content": request},
                                          {"role": "assistant", "content": code}]))
    return chats, raws


def synthetic_examples(rng: random.Random, phrasings: int = SYNTHETIC_PHRASINGS, tasks=None, reword: float = 0.0,
                       paraphrases: dict[str, list[str]] | None = None):
    """{'train'|'held': (chat texts, raw sources)} from the task families (or ``tasks``); 3 % of
    the solutions (by hash) are kept out for the held-out loss; ``reword``, ``paraphrases``: see
    ``task_requests``."""
    from .task_families import all_tasks
    from .tokenizer import render_chat

    out = {"train": ([], []), "held": ([], [])}
    seen_code = set()
    for task in tasks if tasks is not None else all_tasks():
        chats, raws = out["held" if is_held(task.code) else "train"]
        for request in task_requests(task, phrasings, rng, reword, paraphrases):
            chats.append(render_chat([{"role": "user", "content": request},
                                      {"role": "assistant", "content": task.code}]))
        if task.code not in seen_code:
            seen_code.add(task.code)
            raws.append(task.code + "\n")
    return out


ASSISTANT_HEADER = "<|assistant|>\n"
NAME_LINE = 2  # the mask's mark for the reply's first line (``def name(...)``), weighted by --name-weight


def tokenize_chat_examples(tokenizer, texts: list[str]) -> dict:
    """A chat stream for reply-only loss: {'ids', 'mask' (1 on reply tokens, the <|end|> and
    the separator included; ``NAME_LINE`` on the reply's first line, where the request's words
    become a name), 'starts' (where each example begins)}. The prompt (up to and
    including the assistant header) and the reply are tokenized apart, as at inference time,
    where the prompt is encoded first and the reply is generated after it."""
    prompts, replies = [], []
    for text in texts:
        head, sep, reply = text.rpartition(ASSISTANT_HEADER)
        prompts.append(head + sep if sep else "")
        replies.append(reply if sep else text)
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"] if texts else []
    encoded = tokenizer(replies, add_special_tokens=False, return_offsets_mapping=True) if texts else {}
    reply_ids, offsets = encoded.get("input_ids", []), encoded.get("offset_mapping", [])
    ids, mask, starts = [], [], []
    for p, r, spans, reply in zip(prompt_ids, reply_ids, offsets, replies):
        first_line = len(reply.split("\n", 1)[0])
        starts.append(len(ids))
        ids += p + r + [tokenizer.eos_token_id]
        mask += [0] * len(p) + [NAME_LINE if start < first_line else 1 for start, _ in spans] + [1]
    return {"ids": torch.tensor(ids, dtype=torch.int32), "mask": torch.tensor(mask, dtype=torch.int8),
            "starts": torch.tensor(starts, dtype=torch.int64)}


def split_after_block_opener(text: str, rng: random.Random) -> list[str]:
    """``text`` cut right after the line break of one line that opens a block or a docstring
    (chosen at random), or whole when it has none. Tokenized apart, the two pieces hold what a
    prompt sent as written holds: a bare "\\n" token, then the indentation as its own token
    (joined, the BPE merges "\\n   " into one), so the model learns to go on with the body there
    instead of ending the text."""
    from engine.prompts import BLOCK_ENDS

    cuts, start = [], 0
    for line in text.split("\n")[:-1]:
        start += len(line) + 1
        if line.rstrip().endswith(BLOCK_ENDS) and start < len(text) and text[start:start + 1] in " \t":
            cuts.append(start)
    if not cuts:
        return [text]
    cut = rng.choice(cuts)
    return [text[:cut], text[cut:]]


def tokenize_stream(tokenizer, texts: list[str], split_share: float = 0.0, rng: random.Random | None = None) -> torch.Tensor:
    """The texts' ids back to back, each followed by the end-of-text id. ``split_share`` of
    them (drawn with ``rng``) are tokenized in two pieces, cut by ``split_after_block_opener``."""
    ids: list[int] = []
    rng = rng or random.Random(0)
    pieces = [split_after_block_opener(t, rng) if split_share and rng.random() < split_share else [t] for t in texts]
    flat = [piece for parts in pieces for piece in parts]
    encoded = iter(tokenizer(flat, add_special_tokens=False)["input_ids"]) if flat else iter(())
    for parts in pieces:
        for _ in parts:
            ids.extend(next(encoded))
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.int32)


# share of the raw code texts tokenized as a prompt sent as written would be (`split_after_block_opener`)
AS_WRITTEN_SHARE = 0.3


def mix(parts: list[tuple[list[str], float]], rng: random.Random) -> list[str]:
    """Concatenate text lists, repeating or subsampling each to its share of the characters
    (the first part is kept whole and sets the scale)."""
    base_texts, base_share = parts[0]
    total = sum(len(t) for t in base_texts) / max(base_share, 1e-9)
    out = list(base_texts)
    for texts, share in parts[1:]:
        want, size = total * share, sum(len(t) for t in texts)
        if not texts or size == 0:
            continue
        pool = list(texts)
        rng.shuffle(pool)
        reps = int(want // size)
        out += pool * reps
        rest = want - reps * size
        for text in pool:
            if rest <= 0:
                break
            out.append(text)
            rest -= len(text)
    rng.shuffle(out)
    return out


HELDOUT_REQUESTS = Path(__file__).resolve().parents[1] / "assets" / "prompts" / "heldout_requests.jsonl"


def heldout_keywords(path: Path = HELDOUT_REQUESTS) -> set[str]:
    """The key words of the held-out requests: kept out of the generated vocabulary."""
    import json

    from training.code_metrics import request_keywords

    if not path.exists():
        return set()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {k for r in rows if r.get("kind") == "chat" for k in request_keywords(r["prompt"])}


# shares of the chat tokens in `--data requests`
TASK_SHARE = 0.35
RECORD_SHARE = 0.45
DOCSTRING_SHARE = 1.0 - TASK_SHARE - RECORD_SHARE
UNNAMED_DOCSTRING_SHARE = 0.2


def split_streams(tokenizer, split: str, chat: list[str], raw: list[str], rng: random.Random) -> dict:
    """One split's token streams: the training chat with its reply-only mask and example starts
    (``tokenize_chat_examples``), the held-out chat as one stream, and the raw code, a share of it
    tokenized as a prompt sent as written (``AS_WRITTEN_SHARE``)."""
    out = {}
    if split == "train":
        examples = tokenize_chat_examples(tokenizer, chat)
        out["chat_train"], out["chat_train_mask"], out["chat_train_starts"] = (
            examples["ids"], examples["mask"], examples["starts"])
    else:
        out["chat_held"] = tokenize_stream(tokenizer, chat)
    out[f"raw_{split}"] = tokenize_stream(tokenizer, raw, AS_WRITTEN_SHARE, rng)
    return out


def build_request_streams(tokenizer, corpus: Path | None, seed: int, log=print, invented: int = 0,
                          reword: float = 0.0) -> dict:
    """The streams `train target` samples from ({raw,chat}_{train,held}), for request -> code;
    the training chat stream comes with ``chat_train_mask`` / ``chat_train_starts`` so that the
    loss falls on replies only and every chat window starts at a request. ``invented``: that
    many made-up words join the record vocabulary (``record_tasks.invented_words``)."""
    from .corpus import read_source, split_files
    from .record_tasks import identifier_words, invented_words, record_tasks

    rng = random.Random(seed)
    train_files, held_files = split_files(corpus)
    synthetic = synthetic_examples(rng, reword=reword)
    words = identifier_words([read_source(p) for p in train_files], heldout_keywords())
    words += invented_words(invented, heldout_keywords() | set(words), seed)
    records = synthetic_examples(rng, phrasings=1, tasks=record_tasks(seed, combos_per_thing=3, extra_words=words),
                                 reword=reword)
    package_files = []
    for module, (root, declared) in package_roots(log).items():
        package_files += sorted(p for p in root.rglob("*.py") if "tests" not in p.parts and "test" not in p.parts)
    doc_train = docstring_examples(train_files + package_files, rng, UNNAMED_DOCSTRING_SHARE)
    doc_held = docstring_examples(held_files, rng, UNNAMED_DOCSTRING_SHARE)
    stdlib_raw = [read_source(p) for p in rng.sample(train_files, len(train_files) // 3)]
    streams = {}
    for split, (doc_chat, doc_raw), raw_files in (("train", doc_train, stdlib_raw),
                                                   ("held", doc_held, [read_source(p) for p in held_files[:8]])):
        syn_chat, syn_raw = synthetic[split]
        rec_chat, rec_raw = records[split]
        chat = mix([(syn_chat, TASK_SHARE), (rec_chat, RECORD_SHARE), (doc_chat, DOCSTRING_SHARE)], rng)
        raw = mix([(syn_raw * 3 + rec_raw + doc_raw, 1.0 - STDLIB_RAW_SHARE), (raw_files, STDLIB_RAW_SHARE)], rng)
        streams.update(split_streams(tokenizer, split, chat, raw, rng))
    log("request data: " + ", ".join(f"{k} {len(v):,} tokens" for k, v in streams.items() if "_train_" not in k)
        + f"; {len(synthetic['train'][1])} task solutions, {len(records['train'][1])} record tasks, "
        f"{len(doc_train[0])} docstring pairs")
    return streams


# made-up words in `--data copy` (the record vocabulary has ~1,650 real ones)
COPY_CURRICULUM_WORDS = 4000


def build_copy_streams(tokenizer, corpus: Path | None, seed: int, log=print) -> dict:
    """`--data copy`: the request data with ``COPY_CURRICULUM_WORDS`` invented words in the
    record tasks, so that most record names can only be right by copying the request."""
    return build_request_streams(tokenizer, corpus, seed, log, invented=COPY_CURRICULUM_WORDS)


def build_wording_streams(tokenizer, corpus: Path | None, seed: int, log=print) -> dict:
    """`--data wording`: the `--data copy` data with ``USER_WORDING_SHARE`` of the requests worded
    as users type them (capitalised names and acronyms, 'check if'): the shipped request target
    answered "the nth fibonacci number" and not "the nth Fibonacci number"."""
    return build_request_streams(tokenizer, corpus, seed, log, invented=COPY_CURRICULUM_WORDS,
                                 reword=USER_WORDING_SHARE)


# shares of the chat tokens in `--data coder`
CODER_SHARES = {"tasks": 0.36, "followups": 0.2, "stated": 0.1, "records": 0.22, "docstrings": 0.12}
# with the model's own replies (`train target --own-replies`): edits of them take a share of the
# records' and the one-turn tasks'
OWN_REPLY_SHARES = {**CODER_SHARES, "tasks": 0.32, "records": 0.18, "own": 0.08}
CODER_PHRASINGS = 12  # wrappers per task (each around one of the task's wordings)


def coder_conversations(rng: random.Random, tasks, paraphrase_map: dict[str, list[str]],
                        own_replies: list[dict] | None = None) -> dict[str, list[str]]:
    """{'followups'|'stated'|'own': chat texts}: edits of a previous reply and requests that state
    an edge case or a name (``followups``), on the function tasks (classes are left out); edits
    of the model's own replies to those tasks (``own_reply_chats``), where there are any."""
    from .followups import edge_case_chats, followup_chats, named_chats, own_reply_chats
    from .tokenizer import render_chat

    functions = [t for t in tasks if t.code.startswith("def ")]

    def one_request(task, rng):
        return task_requests(task, 1, rng, 0.0, paraphrase_map)[0]

    def with_clause(task, clause, rng):
        wording = rng.choice([task.request] + paraphrase_map.get(task.request, []))
        return phrase(f"{wording}, {clause}", rng.choice(PHRASINGS[2:]))

    follow = [render_chat(m) for _ in range(2) for m in followup_chats(functions, rng, one_request)]
    stated = [render_chat(m) for m in edge_case_chats(functions, rng, with_clause)]
    stated += [render_chat(m) for _ in range(2) for m in named_chats(functions, rng, third_person)]
    own = [render_chat(m) for m in own_reply_chats(functions, own_replies or [], rng)]
    return {"followups": follow, "stated": stated, "own": own}


def build_coder_streams(tokenizer, corpus: Path | None, seed: int, log=print,
                        own_replies: list[dict] | None = None) -> dict:
    """`--data coder`: the default coder's data. The task families plus the extra tasks
    (``task_data``), each request in many wordings; follow-ups that edit the previous function;
    requests that state an edge case or the function's name; the record tasks with invented
    words (copying names); docstring pairs from real code; and raw code (``CODER_SHARES``).
    ``own_replies`` (``own_replies.py``): edits that follow the model's own first replies too
    (``OWN_REPLY_SHARES``)."""
    from .corpus import read_source, split_files
    from .record_tasks import identifier_words, invented_words, record_tasks
    from .task_data import extra_tasks, paraphrases
    from .task_families import all_tasks

    rng = random.Random(seed)
    paraphrase_map = paraphrases()
    tasks = all_tasks() + extra_tasks()
    train_tasks = [t for t in tasks if not is_held(t.code)]
    held_tasks = [t for t in tasks if is_held(t.code)]
    synthetic = synthetic_examples(rng, CODER_PHRASINGS, tasks, paraphrases=paraphrase_map)
    train_files, held_files = split_files(corpus)
    words = identifier_words([read_source(p) for p in train_files], heldout_keywords())
    words += invented_words(COPY_CURRICULUM_WORDS, heldout_keywords() | set(words), seed)
    records = synthetic_examples(rng, phrasings=1, tasks=record_tasks(seed, combos_per_thing=3, extra_words=words))
    package_files = []
    for module, (root, declared) in package_roots(log).items():
        package_files += sorted(p for p in root.rglob("*.py") if "tests" not in p.parts and "test" not in p.parts)
    docs = {"train": docstring_examples(train_files + package_files, rng, UNNAMED_DOCSTRING_SHARE),
            "held": docstring_examples(held_files, rng, UNNAMED_DOCSTRING_SHARE)}
    shares = OWN_REPLY_SHARES if own_replies else CODER_SHARES
    talks = {"train": coder_conversations(rng, train_tasks, paraphrase_map, own_replies),
             "held": coder_conversations(rng, held_tasks, paraphrase_map)}
    stdlib_raw = {"train": [read_source(p) for p in rng.sample(train_files, len(train_files) // 3)],
                  "held": [read_source(p) for p in held_files[:8]]}
    streams = {}
    for split in ("train", "held"):
        syn_chat, syn_raw = synthetic[split]
        rec_chat, rec_raw = records[split]
        doc_chat, doc_raw = docs[split]
        chat = mix([(syn_chat, shares["tasks"]), (talks[split]["followups"], shares["followups"]),
                    (talks[split]["stated"], shares["stated"]), (rec_chat, shares["records"]),
                    (doc_chat, shares["docstrings"]), (talks[split]["own"], shares.get("own", 0.0))], rng)
        raw = mix([(syn_raw * 3 + rec_raw + doc_raw, 1.0 - STDLIB_RAW_SHARE), (stdlib_raw[split], STDLIB_RAW_SHARE)], rng)
        streams.update(split_streams(tokenizer, split, chat, raw, rng))
    log("coder data: " + ", ".join(f"{k} {len(v):,} tokens" for k, v in streams.items() if "_train_" not in k)
        + f"; {len(tasks)} tasks ({len(paraphrase_map)} with paraphrases), "
        f"{len(talks['train']['followups'])} follow-up chats, {len(talks['train']['stated'])} stated-case requests, "
        f"{len(talks['train']['own'])} edits of the model's own replies")
    return streams


def build_task_streams(tokenizer, corpus: Path | None, seed: int, log=print) -> dict:
    """Only the simple tasks (chat and raw solutions): a short second fine-tune that sharpens the
    request -> name/body mapping after ``build_request_streams``."""
    rng = random.Random(seed)
    synthetic = synthetic_examples(rng)
    streams = {}
    for split in ("train", "held"):
        chats, raws = synthetic[split]
        streams[f"chat_{split}"] = tokenize_stream(tokenizer, chats)
        streams[f"raw_{split}"] = tokenize_stream(tokenizer, raws)
    log("task data: " + ", ".join(f"{k} {len(v):,} tokens" for k, v in streams.items()))
    return streams


def draft_prompt_rows(seed: int, n: int = 2400, coder: bool = False) -> list[dict]:
    """Prompts for `train draft --prompts requests`: what users of the request -> code target
    send (chat requests in the training phrasings, and def/class lines to continue, healed as the
    Complete tab sends them), so the draft learns the target's replies to exactly those.
    Drawn from the task families and record tasks; the held-out requests are never among them.
    ``coder`` (`--prompts coder`): the `--data coder` target's prompts: the extra tasks too, every
    request in any of its wordings, and a fifth of them follow-ups that ask to edit a first reply
    (``messages`` rows, the first reply the task's solution)."""
    from engine.prompts import heal_code_prompt

    from .followups import followup_chats
    from .record_tasks import record_tasks
    from .task_data import extra_tasks, paraphrases
    from .task_families import all_tasks

    rng = random.Random(seed)
    wordings = paraphrases() if coder else {}
    tasks = all_tasks() + (extra_tasks() if coder else []) + record_tasks(seed, combos_per_thing=1)
    rng.shuffle(tasks)
    rows = []
    for task in tasks:
        if len(rows) >= n:
            break
        draw = rng.random()
        if coder and draw < 0.2 and task.code.startswith("def "):
            chats = followup_chats([task], rng, lambda t, r: task_requests(t, 1, r, 0.0, wordings)[0], max_turns=2)
            if chats:
                rows.append({"kind": "chat", "messages": chats[0][:-1]})
        elif draw < 0.75:
            rows.append({"kind": "chat", "prompt": task_requests(task, 1, rng, 0.0, wordings)[0]})
        else:
            first_line = task.code.split("\n", 1)[0] + "\n"
            rows.append({"kind": "complete", "prompt": heal_code_prompt(first_line)})
    return rows
