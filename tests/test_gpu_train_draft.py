"""scripts/gpu_train_draft.sh at toy scale on the CPU (--tiny): every step the GPU run takes
(regenerate the answering target's replies, distil a larger draft from the shipped one, propose
from the ids the target writes most, compare both drafts with `bench --json`) runs, and the new
draft loads and decodes greedily exactly as plain decoding does."""

from __future__ import annotations

import json

import pytest

from tests.gpu_scripts import PAIR, ROOT, greedy_runs, run_tiny

pytestmark = pytest.mark.skipif(not (PAIR / "draft").is_dir(), reason="the answering pair is not shipped here")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_draft")
    return out, run_tiny("gpu_train_draft.sh", out, timeout=600)


def test_the_tiny_run_regenerates_distils_a_larger_draft_and_compares_it(tiny_run):
    out, stdout = tiny_run
    meta = json.loads((out / "draft" / "training_meta.json").read_text())
    assert meta["train_sequences"] == 24 and meta["steps"] == 3
    config = json.loads((out / "draft" / "config.json").read_text())
    shipped = json.loads((PAIR / "draft" / "config.json").read_text())
    assert config["num_hidden_layers"] == 3 > shipped["num_hidden_layers"]  # larger than the shipped draft
    assert len(config["dflash_config"]["proposal_ids"]) == 256  # `train proposals` ran on the new pool
    verdict = json.loads((out / "compare.json").read_text())
    assert verdict["replies"] == verdict["replies_asked"] == 24
    assert verdict["identical"] and verdict["new"]["identical"] == verdict["new"]["prompts"] == 2
    assert verdict["shipped"]["identical"] == 2
    assert ("does not beat" in stdout) != verdict["beats_shipped"]


def test_the_new_draft_loads_and_its_greedy_output_is_plain_decoding(tiny_run):
    out, _ = tiny_run
    for drafted, plain in greedy_runs(PAIR / "target", out / "draft"):
        assert drafted.token_ids == plain.token_ids
        assert len(drafted.acceptance_lengths) < len(plain.acceptance_lengths)  # it did draft


# ---------------------------------------------------------------- what a 200,000-reply pool needs


def test_line_counts_and_definitions_found_once_per_file_give_the_same_prefixes():
    import random

    from transformers import AutoTokenizer

    from training.draft import definition_lines, line_aligned_prefix

    tokenizer = AutoTokenizer.from_pretrained(str(PAIR / "target"))
    lines = (ROOT / "training" / "pass1.py").read_text().splitlines(keepends=True)
    counts = [len(ids) for ids in tokenizer(lines, add_special_tokens=False)["input_ids"]]
    for seed in range(20):
        alone = line_aligned_prefix(lines, tokenizer, 96, 16, random.Random(seed))
        counted = line_aligned_prefix(lines, tokenizer, 96, 16, random.Random(seed), line_counts=counts,
                                      definitions=definition_lines(lines))
        assert alone == counted


def test_corpus_listing_never_enters_skipped_folders(tmp_path):
    from training.corpus import list_source_files

    for rel in ("ok.py", "pkg/mod.py", "site-packages/big/x.py", "tests/t.py", "pkg/test_data/y.py",
                "pkg/test_mod.py", "pkg/notes.txt", "pkg/__pycache__/mod.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    (tmp_path / "empty.py").write_text("")
    assert [p.relative_to(tmp_path).as_posix() for p in list_source_files(tmp_path)] == ["ok.py", "pkg/mod.py"]


def test_corpus_listing_lists_each_file_once_past_linked_folders(tmp_path):
    """A linked folder (a venv's lib64 -> lib, a link back up the tree) is not followed, as a
    recursive glob does not follow it: each file once, and a link cycle cannot loop."""
    from training.corpus import list_source_files

    (tmp_path / "lib" / "pkg").mkdir(parents=True)
    (tmp_path / "lib" / "pkg" / "mod.py").write_text("x = 1\n")
    (tmp_path / "lib64").symlink_to(tmp_path / "lib", target_is_directory=True)
    (tmp_path / "lib" / "pkg" / "up").symlink_to(tmp_path, target_is_directory=True)
    assert [p.relative_to(tmp_path).as_posix() for p in list_source_files(tmp_path)] == ["lib/pkg/mod.py"]
