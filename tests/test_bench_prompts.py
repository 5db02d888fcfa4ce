"""The benchmark's prompt files: code prefixes, chat requests, chat conversations, clear errors."""

from __future__ import annotations

import json

import pytest

from engine.bench import read_prompts
from engine.errors import InvalidRequestError
from engine.loading import assets_dir


def write(tmp_path, *rows):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_prompts_messages_and_kinds(tmp_path):
    path = write(tmp_path,
                 {"name": "add", "kind": "complete", "prompt": "def add(a, b):\n"},
                 {"prompt": "Write a function that reverses a list."},
                 "",
                 {"id": "conv", "messages": [{"role": "user", "content": "Sort a list."},
                                             {"role": "assistant", "content": "sorted(xs)"},
                                             {"role": "user", "content": "In place?"}]},
                 {"prompt": "x = 1\n", "raw": True})
    add, request, conversation, raw = read_prompts(path)
    assert (add.name, add.raw, add.label) == ("add", True, "def add(a, b):\n")
    assert (request.name, request.raw) == ("Write a function that…", False)  # no name: its first words
    assert conversation.name == "conv" and not conversation.raw
    assert [m["role"] for m in conversation.prompt] == ["user", "assistant", "user"]
    assert conversation.label == "In place?"
    assert raw.raw and raw.name == "x = 1"


def test_heal_leaves_the_line_break_after_a_block_opener_to_the_model_as_the_complete_tab_does(tmp_path):
    path = write(tmp_path,
                 {"kind": "complete", "prompt": "def add(a, b):\n"},
                 {"kind": "complete", "prompt": 'def f():\n    """Doc."""\n'},
                 {"kind": "complete", "prompt": "x = 1\n"},
                 {"prompt": "Write a function that ends with a colon:\n"})
    healed = [p.prompt for p in read_prompts(path, heal=True)]
    assert healed == ["def add(a, b):", 'def f():\n    """Doc."""', "x = 1\n",
                      "Write a function that ends with a colon:\n"]  # chat prompts are never touched
    assert [p.prompt for p in read_prompts(path)][0] == "def add(a, b):\n"  # as written unless asked
    assert read_prompts("humaneval", heal=True)[0].prompt.endswith('"""')


@pytest.mark.parametrize("line, why", [
    ("not json", r"prompts\.jsonl:1: "),
    (json.dumps({"text": "def f():"}), "'prompt' string"),
    (json.dumps({"prompt": ""}), "non-empty"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}), "user's"),
    (json.dumps({"messages": [{"content": "hi"}]}), r"prompts\.jsonl:1: "),
])
def test_bad_lines_name_the_line_and_the_format(tmp_path, line, why):
    with pytest.raises(InvalidRequestError, match=why):
        read_prompts(write(tmp_path, line))


def test_an_empty_file_is_an_error(tmp_path):
    with pytest.raises(InvalidRequestError, match="no prompts"):
        read_prompts(write(tmp_path, ""))


def test_the_shipped_prompt_set_mixes_code_prefixes_and_requests():
    prompts = read_prompts(assets_dir() / "prompts" / "code.jsonl")
    assert len(prompts) == 25 and len({p.name for p in prompts}) == 25
    assert sum(p.raw for p in prompts) == 13


def test_humaneval_prompt_set_reads_the_packages_164_problems():
    prompts = read_prompts("humaneval")
    assert len(prompts) == 164
    first = prompts[0]
    assert first.name == "HumanEval/0" and first.raw
    assert first.prompt.startswith("from typing import List") and "def has_close_elements" in first.prompt


def test_plain_path_disagreement_and_per_prompt_spread():
    from engine.bench import plain_paths_disagree, spread

    assert not plain_paths_disagree(100.0, 119.0) and not plain_paths_disagree(119.0, 100.0)
    assert plain_paths_disagree(100.0, 121.0) and plain_paths_disagree(121.0, 100.0)
    assert plain_paths_disagree(0.0, 5.0) and not plain_paths_disagree(0.0, 0.0)
    assert spread([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "q1": 1.75, "q3": 4.75, "min": 1.0, "max": 10.0}
    assert spread([2.0])["median"] == 2.0 and spread([]) == {}


def test_bench_summary_says_what_identical_means_at_each_temperature():
    """At T > 0 speculative sampling draws other tokens from the same distribution: the summary
    must not call a match there 'identical greedy outputs'."""
    from app.cmd_bench import identity_label

    assert identity_label({"temperature": 0.0}) == "identical greedy outputs"
    assert "greedy" not in identity_label({"temperature": 0.7})
    assert "not expected" in identity_label({"temperature": 0.7})


def test_progress_lines_flag_a_difference_only_where_it_is_a_bug():
    """A sampled reply differs from plain sampling by construction: its progress line must not say
    DIFFERENT (that word means a greedy reply broke identity)."""
    from app.cmd_bench import identity_mark

    assert identity_mark({"identical": False}, 0.0) == "  DIFFERENT"
    assert identity_mark({"identical": True}, 0.0) == ""
    assert identity_mark({"identical": False}, 0.7) == ""
    assert identity_mark({"identical": True}, 0.7) == "  same tokens"


def test_the_per_kind_line_names_both_kinds_with_their_figures():
    from app.cmd_bench import kind_line

    line = kind_line({"chat": {"prompts": 12, "identical": 12, "speedup": 1.3, "mean_acceptance_length": 2.42},
                      "prefix": {"prompts": 12, "identical": 11, "speedup": 1.6, "mean_acceptance_length": 2.96}})
    assert line == ("by kind: chat requests (12) τ 2.42, 1.30x, 12 identical · "
                    "code prefixes (12) τ 2.96, 1.60x, 11 identical")
