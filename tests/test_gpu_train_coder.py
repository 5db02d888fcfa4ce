"""scripts/gpu_train_coder.sh at toy scale on the CPU (--tiny): every step the GPU run takes
(grow the shipped target and train it on the coder data with edits of its own replies, move the
shipped draft's target layers to the grown stack and distil it, propose from the ids the new
target writes most, score both pairs with `train eval --pass1`, bench the new pair) runs, and
the new pair loads and decodes greedily exactly as plain decoding does."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from tests.gpu_scripts import PAIR, greedy_runs, run_tiny
from tests.tiny_models import tiny_target
from training.target import grow_target, grown_layer_ids

pytestmark = pytest.mark.skipif(not (PAIR / "draft").is_dir(), reason="the answering pair is not shipped here")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_coder")
    return out, run_tiny("gpu_train_coder.sh", out, timeout=900)


def test_the_tiny_run_grows_the_target_distils_its_draft_and_scores_both_pairs(tiny_run):
    out, stdout = tiny_run
    shipped_target = json.loads((PAIR / "target" / "config.json").read_text())
    target_meta = json.loads((out / "target" / "training_meta.json").read_text())
    assert json.loads((out / "target" / "config.json").read_text())["num_hidden_layers"] == 13
    assert target_meta["grown_from_layers"] == shipped_target["num_hidden_layers"] == 12
    assert target_meta["data"] == "coder" and target_meta["steps"] == 2 and target_meta["device"] == "cpu"
    assert len((out / "target_work" / "own_replies.jsonl").read_text().splitlines()) == 4
    draft = json.loads((out / "draft" / "config.json").read_text())
    assert len(draft["dflash_config"]["proposal_ids"]) == 256  # `train proposals` ran on the new pool
    verdict = json.loads((out / "compare.json").read_text())
    assert verdict["identical"]
    assert verdict["shipped"]["requests"]["alone"][2] == verdict["new"]["requests"]["alone"][2] == 52
    assert verdict["strict_passes_shipped"] == verdict["shipped"]["requests"]["alone"][0]
    assert ("the new target answers more" in stdout) == verdict["answers_more"]


def test_a_draft_reads_the_layers_the_grown_stack_moved_its_features_to():
    """Growing 12 layers to 16 puts a copy after layers 2, 5, 8 and 11: the shipped draft's target
    layers move to where those layers went, and the moved features are the original layers' own."""
    assert grown_layer_ids([1, 4, 6, 9], 12, 16) == [1, 5, 8, 12]
    assert grown_layer_ids([1, 4, 6, 9], 12, 12) == [1, 4, 6, 9]
    target = tiny_target(layers=4).eval()
    grown = grow_target(copy.deepcopy(target), 6).eval()
    ids = torch.tensor([[5, 9, 2, 7, 1, 3]])
    with torch.no_grad():  # hidden_states[i + 1]: the output of layer i (the last one is normed)
        before = target(input_ids=ids, output_hidden_states=True).hidden_states
        after = grown(input_ids=ids, output_hidden_states=True).hidden_states
    for old, new in zip([0, 1, 2], grown_layer_ids([0, 1, 2], 4, 6)):
        torch.testing.assert_close(after[new + 1], before[old + 1])


def test_the_new_pair_loads_and_its_greedy_output_is_plain_decoding(tiny_run):
    out, _ = tiny_run
    for drafted, plain in greedy_runs(out / "target", out / "draft"):
        assert drafted.token_ids == plain.token_ids
