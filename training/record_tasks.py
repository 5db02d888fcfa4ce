"""Record tasks: everyday requests about lists of records ("sort a list of students by grade",
"group the orders by status", "create a class for a planet with a label and a mass") over a
wide vocabulary of things and their fields, with correct solutions whose names are built from
the request's own words.

Why: the task families teach ~600 fixed request -> code mappings, and a tiny model fine-tuned
on them alone learns their marginal distribution (one favourite function for every request).
Answering an unseen request needs the general move "name the code after what was asked";
these templates show that move over thousands of word combinations, and every solution is
right for any words put in it (records are dictionaries, classes hold what they are given).
No key word of the held-out requests (``assets/prompts/heldout_requests.jsonl``) is in the
vocabulary (a test checks it)."""

from __future__ import annotations

import random

from .task_families import Task, function

# singular -> plural
THINGS = {
    "student": "students", "employee": "employees", "customer": "customers", "order": "orders",
    "movie": "movies", "song": "songs", "album": "albums", "city": "cities",
    "planet": "planets", "user": "users", "account": "accounts", "ticket": "tickets", "invoice": "invoices",
    "task": "tasks", "project": "projects", "vehicle": "vehicles", "flight": "flights",
    "hotel": "hotels", "recipe": "recipes", "player": "players", "team": "teams", "course": "courses",
    "server": "servers", "device": "devices", "sensor": "sensors", "animal": "animals", "company": "companies",
    "event": "events", "message": "messages", "comment": "comments", "photo": "photos", "video": "videos",
    "game": "games", "patient": "patients", "guest": "guests", "member": "members", "article": "articles",
    "parcel": "parcels", "truck": "trucks", "bike": "bikes", "plant": "plants", "river": "rivers",
    "mountain": "mountains", "room": "rooms", "job": "jobs", "candidate": "candidates",
    "contact": "contacts", "station": "stations", "warehouse": "warehouses", "lesson": "lessons",
    "exam": "exams", "village": "villages", "airport": "airports", "library": "libraries", "school": "schools",
    "store": "stores", "supplier": "suppliers", "worker": "workers", "teacher": "teachers", "pet": "pets",
    "ship": "ships", "museum": "museums", "park": "parks", "concert": "concerts", "shipment": "shipments",
    "loan": "loans", "meeting": "meetings", "review": "reviews", "recording": "recordings", "tenant": "tenants",
    "apartment": "apartments", "bird": "birds", "fruit": "fruits", "garden": "gardens", "visitor": "visitors",
}
# numeric fields (compared, summed, averaged)
MEASURES = ("age", "score", "salary", "rating", "population", "quantity", "balance", "speed", "duration",
            "size", "cost", "budget", "stock", "level", "rank", "capacity", "temperature", "altitude",
            "mileage", "grade", "votes", "likes", "views", "visits", "calories", "revenue", "profit",
            "attendance", "elevation", "area", "width", "depth", "income", "fee", "rent", "wage", "load",
            "usage", "delay", "priority", "energy", "volts", "pressure", "humidity")
# text fields (matched, grouped, collected)
LABELS = ("category", "genre", "status", "department", "language", "owner", "region", "brand", "email",
          "label", "city", "team", "species", "role", "tag", "nickname", "surname", "username",
          "address", "phone", "website", "kind", "group", "section", "topic", "location",
          "manager", "artist", "director", "club", "campus", "district", "currency", "planet", "origin")


def _pairs(singular: str, plural: str, measure: str, label: str) -> list[tuple[str, str, str, str]]:
    """(request, function name, parameters, body) for one thing and two of its fields. Names
    start with a word of the request: right after ``def`` a word is tokenized as in prose (" st",
    "u", "dent", "s"), so naming the code after the request is a plain copy of its tokens for a
    small model (inside an identifier, "_students" splits differently and needs a mapping)."""
    s, p, m, l = singular, plural, measure, label
    key_m, key_l = f'{s}["{m}"]', f'{s}["{l}"]'
    return [
        (f"sort a list of {p} by {m}", f"{p}_by_{m}", p,
         f"return sorted({p}, key=lambda {s}: {key_m})"),
        (f"sort the {p} by {m} from highest to lowest", f"{p}_by_{m}_desc", p,
         f"return sorted({p}, key=lambda {s}: {key_m}, reverse=True)"),
        (f"find the {s} with the highest {m}", f"{s}_with_highest_{m}", p,
         f"return max({p}, key=lambda {s}: {key_m})"),
        (f"find the {s} with the lowest {m}", f"{s}_with_lowest_{m}", p,
         f"return min({p}, key=lambda {s}: {key_m})"),
        (f"compute the total {m} of a list of {p}", f"{m}_total", p,
         f"return sum({key_m} for {s} in {p})"),
        (f"compute the average {m} of the {p}", f"{m}_average", p,
         f"if not {p}:\n    return 0.0\nreturn sum({key_m} for {s} in {p}) / len({p})"),
        (f"keep only the {p} whose {m} is above a limit", f"{p}_above_{m}", f"{p}, limit",
         f"return [{s} for {s} in {p} if {key_m} > limit]"),
        (f"group the {p} by {l}", f"{p}_grouped_by_{l}", p,
         f"groups = {{}}\nfor {s} in {p}:\n    groups.setdefault({key_l}, []).append({s})\nreturn groups"),
        (f"collect the {l} of every {s}", f"{s}_{l}s", p, f"return [{key_l} for {s} in {p}]"),
        (f"count the {p} with a given {l}", f"{p}_count_by_{l}", f"{p}, {l}",
         f"return sum(1 for {s} in {p} if {key_l} == {l})"),
        (f"find a {s} by its {l}", f"{s}_by_{l}", f"{p}, {l}",
         f"for {s} in {p}:\n    if {key_l} == {l}:\n        return {s}\nreturn None"),
        (f"map each {s}'s {l} to its {m}", f"{l}_to_{m}", p, f"return {{{key_l}: {key_m} for {s} in {p}}}"),
        (f"remove the {p} that have no {l}", f"{p}_with_{l}", p, f'return [{s} for {s} in {p} if {s}.get("{l}")]'),
        (f"sum the {m} of the {p} for each {l}", f"{m}_by_{l}", p,
         f"totals = {{}}\nfor {s} in {p}:\n    totals[{key_l}] = totals.get({key_l}, 0) + {key_m}\nreturn totals"),
    ]


def _camel(word: str) -> str:
    return "".join(part.capitalize() for part in word.split("_"))


def _class_tasks(singular: str, measure: str, label: str) -> list[Task]:
    s, m, l, cls = singular, measure, label, _camel(singular)
    init = f"    def __init__(self, {l}, {m}):\n        self.{l} = {l}\n        self.{m} = {m}"
    return [
        Task(f"create a class for a {s} with a {l} and a {m}", f"class {cls}:\n{init}", "records"),
        Task(f"write a {s} class that can increase its {m}",
             f"class {cls}:\n{init}\n\n    def increase_{m}(self, amount):\n        self.{m} += amount", "records"),
        Task(f"write a {s} class whose {l} can be changed",
             f"class {cls}:\n{init}\n\n    def set_{l}(self, {l}):\n        self.{l} = {l}", "records"),
        Task(f"create a {s} class that describes itself as text",
             f"class {cls}:\n{init}\n\n    def __str__(self):\n        return f\"{cls}({{self.{l}}}, {{self.{m}}})\"",
             "records"),
    ]


def record_tasks(seed: int = 0, combos_per_thing: int = 4, extra_words: tuple[str, ...] = ()) -> list[Task]:
    """Every template for each thing, with ``combos_per_thing`` random (measure, label) pairs.
    ``extra_words`` (see ``identifier_words``) widen the vocabulary: each is a thing (plural +s)
    with one template, and fills the measure and label slots too, so that a name can only be
    right by copying the request's words (there are too many to learn by heart)."""
    rng = random.Random(seed)
    measures, labels = list(MEASURES) + list(extra_words), list(LABELS) + list(extra_words)
    out = []
    for singular, plural in THINGS.items():
        for _ in range(combos_per_thing):
            measure = rng.choice(measures)
            label = rng.choice([x for x in labels if x != singular])
            for request, name, params, body in _pairs(singular, plural, measure, label):
                out.append(Task(request, function(name, params, body), "records"))
            out += _class_tasks(singular, measure, label)
    for word in extra_words:
        measure, label = rng.choice(measures), rng.choice(labels)
        if word in (measure, label):
            continue
        templates = _pairs(word, word + "s", measure, label)
        request, name, params, body = rng.choice(templates)
        out.append(Task(request, function(name, params, body), "records"))
        if rng.random() < 0.25:
            out.append(rng.choice(_class_tasks(word, measure, label)))
    return out


def identifier_words(sources: list[str], banned: set[str], min_count: int = 3, limit: int = 3000) -> tuple[str, ...]:
    """Plain lower-case words (4-10 letters, not ending in s) that name things in real code: the
    parts of identifiers in ``sources``, most frequent first, without Python keywords, the
    words ``banned`` (the held-out requests' key words) or the metric's instruction words."""
    import ast
    import builtins
    import keyword
    import re
    from collections import Counter

    from training.code_metrics import GENERIC_WORDS, same_word, split_identifier

    counts: Counter = Counter()
    prose: Counter = Counter()  # words of docstrings: an identifier part used in English is a word
    for source in sources:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            name = getattr(node, "id", None) or getattr(node, "arg", None) or getattr(node, "attr", None)
            if isinstance(name, str):
                counts.update(split_identifier(name))
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)):
                prose.update(re.findall(r"\b[a-z]+\b", ast.get_docstring(node) or ""))
    skip = set(dir(builtins)) | {"self", "cls", "args", "kwargs"}
    words = []
    for word, n in counts.most_common():
        if n < min_count or len(words) >= limit:
            break
        if (word.isalpha() and word.isascii() and 4 <= len(word) <= 10 and not word.endswith("s")
                and prose[word] >= 2 and word not in skip
                and not keyword.iskeyword(word) and word not in GENERIC_WORDS
                and not any(same_word(b, word) for b in banned)):
            words.append(word)
    return tuple(words)


_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "t", "v", "z", "br", "gr", "pl", "tr", "st", "sh", "ch")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "", "n", "r", "l", "m", "k", "t")


def invented_words(n: int, banned: set[str], seed: int = 0) -> tuple[str, ...]:
    """``n`` made-up, pronounceable lower-case words ("brakomel", "tivaru"; 5-10 letters, not
    ending in s), none of them an inflection of a ``banned`` word or of the metric's generic words.

    Why: a name built from an invented word can only be right by copying the request's tokens
    (BPE cuts such a word into 2-4 pieces, like most unseen real words: " volume" is " v", "ol",
    "ume"), so record tasks over them train the multi-token copy that naming code after an unseen
    request needs, instead of a mapping learned word by word."""
    from training.code_metrics import GENERIC_WORDS, same_word

    rng = random.Random(seed)
    avoid = set(banned) | set(GENERIC_WORDS)
    out: dict[str, None] = {}
    while len(out) < n:
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(2, 3)))
        word += rng.choice(_CODAS)
        if 5 <= len(word) <= 10 and not word.endswith("s") and not any(same_word(b, word) for b in avoid):
            out[word] = None
    return tuple(out)
