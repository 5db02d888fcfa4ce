"""An independent, naive rendering of the DFlash algorithm (no caches at all: every step
recomputes the whole sequence, features come from transformers' ``output_hidden_states``),
written straight from the algorithm (docs/engine.md). The engine must reproduce its token ids AND its
per-cycle acceptance lengths (random drafts here; the trained embedded pair, with real
acceptance, in test_embedded_model.py)."""

from __future__ import annotations

import pytest
import torch

from engine.config import SamplingConfig
from engine.decode import generate
from engine.events import Finished
from tests.tiny_models import tiny_draft, tiny_target


@torch.no_grad()
def naive_dflash(target, draft, prompt, max_new_tokens, block_size, stop_ids=()):
    ids = list(prompt)
    max_length = len(prompt) + max_new_tokens

    def run_target(seq):
        out = target(input_ids=torch.tensor([seq]), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i + 1] for i in draft.target_layer_ids], dim=-1)
        return out.logits[0], feats

    logits, _ = run_target(ids)
    ids.append(int(logits[-1].argmax()))
    start, taus = len(prompt), []
    stopped = ids[-1] in stop_ids
    while start + 1 < max_length and not stopped:
        b = min(block_size, max_length - start)
        _, feats = run_target(ids[:start])  # features of every committed position before the anchor
        width = max(b, draft.block_size)  # a smaller block still drafts the draft's own block, verifies b
        block = torch.tensor([[ids[start]] + [draft.mask_token_id] * (width - 1)])
        noise = draft.embed(target.get_input_embeddings(), block)
        hidden = draft(noise, feats, torch.arange(0, start + width)[None], cache=None)
        proposals = draft.compute_logits(hidden[0, 1:b], target.get_output_embeddings()).argmax(-1).tolist()
        logits, _ = run_target(ids[: start + 1] + proposals)
        posterior = logits[start:].argmax(-1).tolist()
        acc = 0
        while acc < len(proposals) and proposals[acc] == posterior[acc]:
            acc += 1
        emitted = (proposals[:acc] + [posterior[acc]])[: max_length - start - 1]
        for i, t in enumerate(emitted):
            if t in stop_ids:
                emitted, stopped = emitted[: i + 1], True
                break
        ids = ids[: start + 1] + emitted
        start += len(emitted)
        taus.append(len(emitted))
    return ids[len(prompt):], taus


def last_layer_draft(target, block_size):
    """A draft fed the target's LAST layer too (the post-norm tensor in transformers)."""
    n = target.config.num_hidden_layers
    return tiny_draft(target, layers=1, block_size=block_size, target_layer_ids=[1, n - 1])


@pytest.mark.parametrize("block_size", [4, 8])
@pytest.mark.parametrize("kind", ["random", "last-layer"])
def test_engine_matches_naive_reference(block_size, kind):
    target = tiny_target(seed=3)
    draft = tiny_draft(target, layers=2, block_size=block_size) if kind == "random" else last_layer_draft(target, block_size)
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]
    expected_ids, expected_taus = naive_dflash(target, draft, prompt, 36, block_size)
    events = list(generate(target, draft, prompt, SamplingConfig(max_new_tokens=36, block_size=block_size)))
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert list(finished.token_ids) == expected_ids
    assert list(finished.acceptance_lengths) == expected_taus


def test_last_layer_features_are_post_norm_like_transformers():
    """transformers reports hidden_states[-1] after the final norm; the hooks must agree."""
    from engine.features import target_features

    target = tiny_target(seed=4)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    n = target.config.num_hidden_layers
    layer_ids = [0, n // 2, n - 1]
    feats, _ = target_features(target, ids, layer_ids)
    out = target(input_ids=ids, output_hidden_states=True)
    expected = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
    torch.testing.assert_close(feats, expected)
