"""The request -> code fine-tuning data (training.task_families / request_data) and its
held-out set (assets/prompts/heldout_requests.jsonl, never trained on)."""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import pytest

from training import code_metrics
from training import request_data
from training.task_families import all_tasks, function, sentence

HELDOUT = Path(__file__).resolve().parents[1] / "assets" / "prompts" / "heldout_requests.jsonl"


@pytest.fixture(scope="module")
def tasks():
    """Every training task: the families, the written tasks and the extra tasks of the data files."""
    from training.task_data import extra_tasks

    return all_tasks() + extra_tasks()


@pytest.fixture(scope="module")
def training_requests(tasks):
    """Every request wording trained on, the paraphrases included, lower case, no final period."""
    from training.task_data import paraphrases

    return {r.lower().rstrip(".") for t in tasks for r in [t.request] + paraphrases().get(t.request, [])}


def heldout_rows():
    return [json.loads(line) for line in HELDOUT.read_text().splitlines() if line.strip()]


def test_every_task_solution_parses_defines_one_thing_and_is_on_topic(tasks):
    assert len(tasks) > 500 and len({t.family for t in tasks}) >= 6
    for task in tasks:
        tree = ast.parse(task.code)
        assert len(tree.body) == 1 and code_metrics.definitions(tree), task.request
        assert code_metrics.on_topic(task.request, task.code), task.request  # names carry the request's words


def test_no_heldout_family_is_trained_on(tasks, training_requests):
    """Every held-out request has a key word that names no training task (its family is new, so
    the held-out scores measure generalisation, not recall), no held-out prompt is a training
    request, and no held-out code prefix continues a function trained on."""
    train_names = {w for t in tasks for d in code_metrics.definitions(ast.parse(t.code))
                   for w in code_metrics.split_identifier(d.name)}
    rows = heldout_rows()
    assert sum(r["kind"] == "chat" for r in rows) >= 30 and sum(r["kind"] == "complete" for r in rows) >= 12
    for row in rows:
        if row["kind"] == "chat":
            novel = [k for k in code_metrics.request_keywords(row["prompt"])
                     if not any(code_metrics.same_word(k, w) for w in train_names)]
            assert novel, row["name"]
            assert row["prompt"].lower().rstrip(".") not in training_requests
        else:
            params = code_metrics.function_parameters(row["prompt"])
            assert params, row["name"]
            defined = row["prompt"].split("def ")[-1].split("(")[0]
            assert defined not in train_names


def test_no_fresh_prompt_is_a_training_request(tasks, training_requests):
    """assets/prompts/fresh_requests.jsonl (written after the copy-curriculum data was built, to judge the pair as a new user would): none of its requests is a task-family
    request and none of its prefixes continues a task solution. Unlike the held-out set its
    words may name training code: it measures the common requests, not generalisation."""
    rows = [json.loads(line) for line in (HELDOUT.parent / "fresh_requests.jsonl").read_text().splitlines() if line.strip()]
    solutions = "\n".join(t.code for t in tasks)
    assert sum(r["kind"] == "chat" for r in rows) >= 20 and sum(r["kind"] == "complete" for r in rows) >= 5
    for row in rows:
        if row["kind"] == "chat":
            assert row["prompt"].lower().rstrip(".") not in training_requests, row["name"]
        else:
            assert row["prompt"].split("\n")[0] not in solutions, row["name"]


def test_phrasings_conjugate_the_verb_and_keep_the_request():
    assert request_data.third_person("count the vowels") == "counts the vowels"
    assert request_data.third_person("check whether") == "checks whether"
    assert request_data.third_person("apply a rule") == "applies a rule"
    assert request_data.phrase("reverse a string", "Write a function that {third}.") == \
        "Write a function that reverses a string."
    assert request_data.base_verb("Returns") == "return" and request_data.base_verb("Matches") == "match"
    assert request_data.base_verb("Applies") == "apply" and request_data.base_verb("Process") == "process"


def test_user_wording_capitalises_names_and_says_check_if_without_touching_other_words():
    seen = {request_data.user_wording("check whether the nth fibonacci number is in a csv file", random.Random(i))
            for i in range(40)}
    assert "check if the nth Fibonacci number is in a CSV file" in seen
    assert "check whether the nth fibonacci number is in a csv file" in seen
    for text in seen:
        assert text.lower().replace("check if", "check whether") == \
            "check whether the nth fibonacci number is in a csv file"


def test_rewording_is_off_by_default_so_the_older_data_mixes_are_rebuilt_unchanged(tasks):
    task = next(t for t in tasks if "fibonacci" in t.request)
    plain = request_data.task_requests(task, 8, random.Random(5))
    assert plain == request_data.task_requests(task, 8, random.Random(5), reword=0.0)
    assert all("fibonacci" in r for r in plain)
    reworded = request_data.task_requests(task, 16, random.Random(5), reword=1.0)
    assert any("Fibonacci" in r for r in reworded) and all("ibonacci" in r for r in reworded)


def test_synthetic_examples_use_the_chat_template_and_end_replies(tasks):
    split = request_data.synthetic_examples(random.Random(0), phrasings=2)
    chats, raws = split["train"]
    assert len(chats) > 900 and split["held"][0]  # a few solutions kept for the held-out loss
    for text in chats[:50]:
        assert text.startswith("<|user|>\n") and "<|end|>\n<|assistant|>\n" in text and text.endswith("<|end|>\n")
        reply = text.split("<|assistant|>\n", 1)[1][: -len("<|end|>\n")]
        assert code_metrics.defines_code(reply)
    assert all(code_metrics.defines_code(r) for r in raws[:50])


def test_docstring_pairs_are_short_public_module_functions():
    source = ('def add(a, b):\n    """Return the sum of a and b."""\n    return a + b\n\n'
              'def _hidden():\n    """Return nothing useful here."""\n\n'
              'class K:\n    def m(self):\n        """Return the method result."""\n        return 1\n'
              'def long():\n    """Return a very long function body."""\n' + "    x = 1\n" * 40)
    pairs = request_data.module_functions(source)
    assert [doc for doc, _ in pairs] == ["Return the sum of a and b."]
    request = request_data.docstring_request("Returns the sum of a and b.", random.Random(1))
    assert "sum of a and b" in request and "Returns" not in request


def test_packages_are_used_only_under_the_licence_they_declare():
    assert request_data.licence_matches("MIT License", "MIT")
    assert request_data.licence_matches("License :: OSI Approved :: BSD License", "BSD-3-Clause")
    assert not request_data.licence_matches("GPL-3.0-or-later", "MIT")
    assert not request_data.licence_matches("License :: OSI Approved :: GNU General Public License", "BSD-3-Clause")


def test_mix_keeps_the_first_part_and_scales_the_others():
    rng = random.Random(0)
    out = request_data.mix([(["aaaa"] * 10, 0.5), (["bb"] * 3, 0.5)], rng)
    assert out.count("aaaa") == 10 and sum(len(t) for t in out if t == "bb") >= 40


def test_helpers_write_plain_functions():
    code = function("count_vowels", "s", 'return sum(c in "aeiou" for c in s)', sentence("count the vowels"))
    assert code.splitlines()[1] == '    """Count the vowels."""' and code_metrics.defines_code(code)



def test_task_streams_hold_only_the_simple_tasks():
    class Tok:  # a byte tokenizer: enough to check what goes into the streams
        eos_token_id = 0

        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [list(t.encode()) for t in texts]}

    streams = request_data.build_task_streams(Tok(), None, 0, log=lambda _line: None)
    chat = bytes(b for b in streams["chat_train"].tolist() if b).decode()
    assert chat.count("<|user|>") > 2000 and "def count_vowels(text):" in chat
    assert "<|user|>" not in bytes(b for b in streams["raw_train"].tolist() if b).decode()


class ByteTokenizer:  # a byte tokenizer: enough to check what goes into the streams
    eos_token_id = 0

    def __call__(self, texts, add_special_tokens=False, return_offsets_mapping=False):
        out = {"input_ids": [list(t.encode()) for t in texts]}
        if return_offsets_mapping:  # ASCII here: byte i is character i
            out["offset_mapping"] = [[(i, i + 1) for i in range(len(t.encode()))] for t in texts]
        return out


def test_record_tasks_are_correct_on_topic_and_avoid_the_heldout_words():
    from training import record_tasks as rt

    tasks = rt.record_tasks(seed=0, combos_per_thing=2)
    assert len(tasks) > 2000 and len({t.request for t in tasks}) > 0.9 * len(tasks)
    for task in tasks:
        tree = ast.parse(task.code)
        assert len(tree.body) == 1 and code_metrics.on_topic(task.request, task.code), task.request
    heldout = request_data.heldout_keywords(HELDOUT)
    assert "hamming" in heldout and "sphere" in heldout
    sources = ['def send_packet(socket, packet_size):\n    """Send the packet over the socket."""\n'
               '    return socket.send(packet_size)\n'] * 3
    words = rt.identifier_words(sources, heldout)
    assert "packet" in words and "socket" in words and "size" not in words  # 'size' never appears in prose
    assert not rt.identifier_words(sources, {"packets", "sockets", "send"})
    vocabulary = set(rt.THINGS) | set(rt.THINGS.values()) | set(rt.MEASURES) | set(rt.LABELS)
    clashes = [(v, k) for v in vocabulary for k in heldout if code_metrics.same_word(k, v)]
    assert not clashes
    widened = rt.record_tasks(seed=0, combos_per_thing=1, extra_words=("packet", "socket"))
    assert any("packets" in t.request for t in widened) and all(code_metrics.on_topic(t.request, t.code) for t in widened)
    # the generated solutions run: records are dictionaries
    namespace = {}
    by_request = {t.request: t.code for t in tasks}
    group_code = next(c for r, c in by_request.items() if r.startswith("group the pets by "))
    label = group_code.split('["')[1].split('"]')[0]
    exec(group_code, namespace)
    grouped = namespace[group_code.split("def ")[1].split("(")[0]]([{label: "a"}, {label: "b"}, {label: "a"}])
    assert grouped == {"a": [{label: "a"}, {label: "a"}], "b": [{label: "b"}]}
    sort_code = next(c for r, c in by_request.items() if r.startswith("sort a list of students by "))
    field = sort_code.split('["')[1].split('"]')[0]
    exec(sort_code, namespace)
    ranked = namespace[sort_code.split("def ")[1].split("(")[0]]([{field: 3}, {field: 1}, {field: 2}])
    assert [s[field] for s in ranked] == [1, 2, 3]


def test_invented_words_avoid_the_heldout_words_and_make_on_topic_record_tasks():
    from training import record_tasks as rt

    heldout = request_data.heldout_keywords(HELDOUT)
    words = rt.invented_words(500, heldout | {"brako"}, seed=3)
    assert len(words) == len(set(words)) == 500 and words == rt.invented_words(500, heldout | {"brako"}, seed=3)
    assert all(w.isalpha() and w.islower() and 5 <= len(w) <= 10 and not w.endswith("s") for w in words)
    assert not [(w, k) for w in words for k in heldout | {"brako"} if code_metrics.same_word(k, w)]
    assert not [w for w in words if w in code_metrics.GENERIC_WORDS]
    tasks = rt.record_tasks(seed=0, combos_per_thing=1, extra_words=words[:50])
    invented = [t for t in tasks if any(w in t.request for w in words[:50])]
    assert len(invented) >= 50 and all(code_metrics.on_topic(t.request, t.code) for t in invented)


def test_chat_examples_label_only_the_reply_and_start_at_a_request():
    texts = ["<|user|>\nreverse it<|end|>\n<|assistant|>\ndef rev(s):\n    return s[::-1]<|end|>\n",
             "<|user|>\nsum it<|end|>\n<|assistant|>\ndef add(a, b):\n    return a + b<|end|>\n"]
    out = request_data.tokenize_chat_examples(ByteTokenizer(), texts)
    ids, mask, starts = out["ids"].tolist(), out["mask"].tolist(), out["starts"].tolist()
    assert len(ids) == len(mask) and starts == [0, len(texts[0].encode()) + 1]
    first = bytes(i for i, m in zip(ids[: starts[1]], mask[: starts[1]]) if m and i).decode()
    assert first == "def rev(s):\n    return s[::-1]<|end|>\n"  # the reply, its end and the separator
    name_line = bytes(i for i, m in zip(ids, mask) if m == request_data.NAME_LINE).decode()
    assert name_line == "def rev(s):def add(a, b):"  # each reply's first line, weighed by --name-weight
    prompt = bytes(i for i, m in zip(ids[: starts[1]], mask[: starts[1]]) if not m).decode()
    assert prompt == "<|user|>\nreverse it<|end|>\n<|assistant|>\n"


def test_example_windows_start_at_examples_and_carry_their_mask():
    import torch

    from training.target import example_windows

    stream = torch.arange(100, dtype=torch.int32)
    mask = (torch.arange(100) % 2).to(torch.int8)
    starts = torch.tensor([0, 10, 40, 95])
    windows, masks = example_windows(stream, mask, starts, 32, 20, torch.Generator().manual_seed(0))
    assert windows.shape == (32, 20) and set(windows[:, 0].tolist()) <= {0, 10, 40}  # 95 has no room
    assert torch.equal(masks.long(), windows % 2)


def test_draft_prompts_are_training_requests_and_healed_code_lines():
    rows = request_data.draft_prompt_rows(0, n=400)
    assert len(rows) == 400 and {r["kind"] for r in rows} == {"chat", "complete"}
    heldout = {r["prompt"].lower().rstrip(".") for r in heldout_rows()}
    assert not any(r["prompt"].lower().rstrip(".") in heldout for r in rows)
    assert all(r["prompt"].endswith(":") for r in rows if r["kind"] == "complete")  # as the Complete tab sends them


def test_the_weighted_loss_is_the_usual_loss_with_unit_weights_and_ignores_zero_weights():
    import torch

    from training.target import weighted_next_token_loss

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 11, generator=gen)
    tokens = torch.randint(0, 11, (2, 6), generator=gen)
    usual = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 11), tokens[:, 1:].reshape(-1))
    assert torch.allclose(weighted_next_token_loss(logits, tokens, torch.ones(2, 6)), usual)
    weights = torch.zeros(2, 6)
    weights[0, 3] = 2.0  # only the token at position 3 of the first row counts
    only = torch.nn.functional.cross_entropy(logits[0, 2][None], tokens[0, 3][None])
    assert torch.allclose(weighted_next_token_loss(logits, tokens, weights), only)


def test_raw_code_is_sometimes_tokenized_as_a_prompt_sent_as_written():
    """A share of the raw texts is cut after a block opener and tokenized in two pieces: the
    stream then holds a bare line break followed by the body's own indentation, as a prompt
    "def f(a):\\n" sent as written does (never a cut inside a line or after a plain line)."""
    code = 'def f(a):\n    """Doc."""\n    return a\n'
    seen = {tuple(request_data.split_after_block_opener(code, random.Random(seed))) for seed in range(20)}
    assert seen == {("def f(a):\n", '    """Doc."""\n    return a\n'), ('def f(a):\n    """Doc."""\n', "    return a\n")}
    assert request_data.split_after_block_opener("x = 1\ny = 2\n", random.Random(0)) == ["x = 1\ny = 2\n"]

    class PieceTokenizer:  # one id per piece: shows where the stream was cut
        eos_token_id = 0

        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [[len(t)] for t in texts]}

    whole = request_data.tokenize_stream(PieceTokenizer(), [code, "x = 1\n"]).tolist()
    assert whole == [len(code), 0, 6, 0]
    cut = request_data.tokenize_stream(PieceTokenizer(), [code] * 200, split_share=0.3, rng=random.Random(0)).tolist()
    split_count = sum(1 for i in cut if i) - 200  # one id per piece: a cut text has two
    assert cut.count(0) == 200 and 30 <= split_count <= 90  # ~30 % cut, every text still ends once


def test_the_task_data_files_hold_working_solutions_and_wordings_of_existing_tasks():
    from training.task_data import paraphrases, tested_tasks
    from training.task_families import all_tasks

    tested = tested_tasks()
    assert len(tested) > 300
    for item in {t.task.code: t for t in tested}.values():
        space: dict = {}
        exec(item.task.code, space)
        assert item.tests, item.task.request
        for test in item.tests:
            exec(test, space)  # an assert on the solution
        assert "# assert" not in item.task.code
    requests = {t.request for t in all_tasks()}
    wordings = paraphrases()
    assert len(wordings) > 300 and set(wordings) <= requests
    for others in wordings.values():
        for text in others:
            verb = text.split(" ", 1)[0]
            assert text == text.strip() and not text.endswith(".") and verb == verb.lower(), text

