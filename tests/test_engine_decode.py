"""The flagship tests: greedy DFlash equals plain greedy decoding, token for token."""

from __future__ import annotations

import threading

import pytest
import torch

from engine import decode as decode_module
from engine.config import FallbackConfig, SamplingConfig
from engine.decode import generate
from engine.events import Cycle, Finished, Started
from tests.tiny_models import tiny_draft, tiny_target

PROMPT = [5, 17, 33, 2, 9, 41, 8]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def run(target, draft, prompt=PROMPT, **kwargs):
    stop = kwargs.pop("stop_token_ids", ())
    cancel = kwargs.pop("cancel", None)
    fallback = kwargs.pop("fallback", None)
    events = list(generate(target, draft, prompt, SamplingConfig(**kwargs), stop_token_ids=stop,
                           cancel=cancel, fallback=fallback))
    assert isinstance(events[0], Started), events
    assert isinstance(events[-1], Finished), events[-1]
    return events, events[-1]


def hf_greedy(target, prompt, n):
    out = target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def oracle_propose(reference, correct):
    """A stand-in for the draft network that knows the true greedy continuation: its first
    ``correct`` proposals of each block are right, the rest wrong. It exercises every accept,
    bonus and cache-crop path with real acceptance lengths."""

    def propose(draft, target, draft_cache, pending, anchor, start, block):
        offset = start - len(PROMPT)  # reference[offset] is the anchor
        truth = reference[offset + 1: offset + block]
        truth += [0] * (block - 1 - len(truth))
        k = correct(start, block)
        proposals = [t if j < k else (t + 1) % 90 for j, t in enumerate(truth)]
        logits = torch.zeros(block - 1, 96)
        return proposals, logits

    return propose


@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
def test_greedy_dflash_equals_transformers_generate(target, block_size):
    draft = tiny_draft(target, block_size=block_size)
    reference = hf_greedy(target, PROMPT, 40)
    events, finished = run(target, draft, max_new_tokens=40)
    assert list(finished.token_ids) == reference
    assert finished.reason == "length"


def test_a_draft_proposing_from_part_of_the_vocabulary_keeps_greedy_output_identical(target):
    draft = tiny_draft(target, block_size=8)
    draft.proposal_vocab_size = 40  # dflash_config.proposal_vocab_size: ids below 40 only
    events, finished = run(target, draft, max_new_tokens=40)
    assert list(finished.token_ids) == hf_greedy(target, PROMPT, 40)
    drafted = [t for e in events if isinstance(e, Cycle) for t in e.draft_tokens]
    assert drafted and max(drafted) < 40
    hidden = torch.randn(3, target.config.hidden_size)
    logits = draft.proposal_logits(hidden, target.get_output_embeddings())
    full = draft.compute_logits(hidden, target.get_output_embeddings())
    assert logits.shape == full.shape and torch.isinf(logits[:, 40:]).all()
    torch.testing.assert_close(logits[:, :40], full[:, :40])


def test_proposal_vocab_size_is_read_from_the_config_and_checked(target):
    from engine.draft import DFlashDraftModel
    from engine.errors import CheckpointError

    config = tiny_draft(target).config
    config.dflash_config = dict(config.dflash_config, proposal_vocab_size=50)
    assert DFlashDraftModel(config).proposal_vocab_size == 50
    for bad in (0, -3, 10_000, 2.5, "50", True):
        config.dflash_config = dict(config.dflash_config, proposal_vocab_size=bad)
        with pytest.raises(CheckpointError, match="proposal_vocab_size"):
            DFlashDraftModel(config)
    del config.dflash_config["proposal_vocab_size"]
    assert DFlashDraftModel(config).proposal_vocab_size is None  # z-lab's drafts: the whole vocabulary


def test_a_draft_proposing_from_chosen_ids_keeps_greedy_output_identical_and_loads_from_its_config(target, tmp_path):
    from engine.draft import load_draft, save_draft

    chosen = [3, 7, 11, 60, 61, 90]
    draft = tiny_draft(target, block_size=8)
    draft.config.dflash_config = dict(draft.config.dflash_config, proposal_ids=chosen)
    loaded = load_draft(save_draft(draft, tmp_path / "draft"))
    assert loaded.proposal_ids.tolist() == chosen
    assert "proposal_ids" not in loaded.state_dict()  # the weights stay exactly the z-lab set
    events, finished = run(target, loaded, max_new_tokens=40)
    assert list(finished.token_ids) == hf_greedy(target, PROMPT, 40)
    drafted = {t for e in events if isinstance(e, Cycle) for t in e.draft_tokens}
    assert drafted and drafted <= set(chosen)
    hidden = torch.randn(3, target.config.hidden_size)
    head = target.get_output_embeddings()
    logits, full = loaded.proposal_logits(hidden, head), loaded.compute_logits(hidden, head)
    torch.testing.assert_close(logits[:, chosen], full[:, chosen])
    others = [i for i in range(full.shape[-1]) if i not in chosen]
    assert torch.isinf(logits[:, others]).all()
    with torch.no_grad():  # a changed head (another target loaded into the same draft) is gathered again
        head.weight[chosen[0]] += 1.0
    torch.testing.assert_close(loaded.proposal_logits(hidden, head)[:, chosen], loaded.compute_logits(hidden, head)[:, chosen])
    with torch.no_grad():
        head.weight[chosen[0]] -= 1.0


def test_proposal_ids_are_checked(target):
    from engine.draft import DFlashDraftModel
    from engine.errors import CheckpointError

    config = tiny_draft(target).config
    for bad in ([], [1, 1], [-1], [10_000], [2.0], "1,2", [True]):
        config.dflash_config = dict(config.dflash_config, proposal_ids=bad)
        with pytest.raises(CheckpointError, match="proposal_ids"):
            DFlashDraftModel(config)
    config.dflash_config = dict(config.dflash_config, proposal_ids=[4, 2], proposal_vocab_size=50)
    with pytest.raises(CheckpointError, match="not both"):
        DFlashDraftModel(config)


def test_sliding_window_draft_equals_plain(target):
    draft = tiny_draft(target, layers=2, sliding_window=4)
    assert draft.layers[0].self_attn.is_causal and draft.layers[0].self_attn.sliding_window == 4
    _, finished = run(target, draft, max_new_tokens=30)
    assert list(finished.token_ids) == hf_greedy(target, PROMPT, 30)


def test_block_size_one_is_plain_decoding(target):
    events, finished = run(target, None, max_new_tokens=20)
    cycles = [e for e in events if isinstance(e, Cycle)]
    assert all(c.block_size == 1 and c.draft_tokens == () for c in cycles)
    assert list(finished.token_ids) == hf_greedy(target, PROMPT, 20)


@pytest.mark.parametrize("correct", [0, 3, 7])
def test_accepting_drafts_keeps_output_identical(target, monkeypatch, correct):
    reference = hf_greedy(target, PROMPT, 50)
    monkeypatch.setattr(decode_module, "propose", oracle_propose(reference, lambda start, block: correct))
    draft = tiny_draft(target, block_size=8)
    events, finished = run(target, draft, max_new_tokens=50)
    assert list(finished.token_ids) == reference
    cycles = [e for e in events if isinstance(e, Cycle)]
    taus = [c.tau for c in cycles]
    assert tuple(taus) == finished.acceptance_lengths
    assert all(1 <= t <= 8 for t in taus)
    assert 1 + sum(taus) == len(finished.token_ids)  # the prefill token plus every cycle's tokens
    full = [c for c in cycles if c.block_size == 8]
    assert all(c.accepted == min(correct, 7) for c in full)
    for c in full:
        assert c.emitted == c.draft_tokens[: c.accepted] + (c.bonus,)
        assert c.rejected == c.draft_tokens[c.accepted:]
        assert [s.verdict for s in c.slots][: c.accepted] == ["accepted"] * c.accepted
        assert c.context_length == c.anchor_position + c.tau


def test_acceptance_lengths_in_range_and_sum(target):
    draft = tiny_draft(target, block_size=4)
    events, finished = run(target, draft, max_new_tokens=33)
    assert len(finished.token_ids) == 33
    assert all(1 <= t <= 4 for t in finished.acceptance_lengths)
    assert 1 + sum(finished.acceptance_lengths) == 33


def test_last_block_shrinks_to_fit_max_new_tokens(target, monkeypatch):
    reference = hf_greedy(target, PROMPT, 12)
    monkeypatch.setattr(decode_module, "propose", oracle_propose(reference, lambda s, b: 16))
    events, finished = run(target, tiny_draft(target, block_size=8), max_new_tokens=12)
    cycles = [e for e in events if isinstance(e, Cycle)]
    assert [c.block_size for c in cycles] == [8, 4]
    assert finished.acceptance_lengths == (8, 3)  # the bonus of the last block is cut by length
    assert list(finished.token_ids) == reference


def test_stop_token_cuts_output(target, monkeypatch):
    reference = hf_greedy(target, PROMPT, 30)
    stop = reference[9]
    first = reference.index(stop)
    monkeypatch.setattr(decode_module, "propose", oracle_propose(reference, lambda s, b: 5))
    _, finished = run(target, tiny_draft(target), max_new_tokens=30, stop_token_ids=[stop])
    assert finished.reason == "stop"
    assert list(finished.token_ids) == reference[: first + 1]


def test_cancel_is_honoured_within_one_cycle(target):
    cancel = threading.Event()
    seen = []
    gen = generate(target, tiny_draft(target), PROMPT, SamplingConfig(max_new_tokens=200), cancel=cancel)
    for event in gen:
        seen.append(event)
        if isinstance(event, Cycle) and event.index == 2:
            cancel.set()
    assert isinstance(seen[-1], Finished) and seen[-1].reason == "cancelled"
    assert sum(isinstance(e, Cycle) for e in seen) == 2


def test_fallback_switches_sizes_and_output_stays_identical(target, monkeypatch):
    reference = hf_greedy(target, PROMPT, 80)
    monkeypatch.setattr(decode_module, "propose", oracle_propose(reference, lambda s, b: 0))
    fallback = FallbackConfig(enabled=True, min_cycles_before_switch=2, window=4)
    events, finished = run(target, tiny_draft(target), max_new_tokens=80, fallback=fallback)
    cycles = [e for e in events if isinstance(e, Cycle)]
    changes = [c.fallback for c in cycles if c.fallback.changed]
    assert changes and all(d.reason for d in changes)
    assert len({c.block_size for c in cycles}) > 1
    assert list(finished.token_ids) == reference


def test_text_pieces_match_token_counts(target):
    events, finished = run(target, tiny_draft(target), max_new_tokens=10)
    for c in (e for e in events if isinstance(e, Cycle)):
        assert len(c.emitted_pieces) == len(c.emitted)
        assert len(c.rejected_pieces) == len(c.rejected)
        assert len(c.slots) == c.block_size - 1
        for slot in c.slots:
            assert len(slot.draft_top) == 3 and 0.0 <= slot.target_prob <= 1.0


def test_cycles_carry_their_measured_cost_in_plain_steps(target):
    """``plain_steps`` (the engine's measured cost per block) lands on every Cycle; without it
    the field stays None."""
    draft = tiny_draft(target, block_size=4)
    steps = {1: 1.0, 2: 1.3, 3: 1.5, 4: 1.7}
    events = list(generate(target, draft, PROMPT, SamplingConfig(max_new_tokens=30), plain_steps=steps))
    cycles = [e for e in events if isinstance(e, Cycle)]
    assert cycles and all(c.cost_in_plain_steps == steps[c.block_size] for c in cycles)
    plain = [e for e in generate(target, draft, PROMPT, SamplingConfig(max_new_tokens=10)) if isinstance(e, Cycle)]
    assert all(c.cost_in_plain_steps is None for c in plain)


def test_measured_cycle_costs_in_plain_steps(target):
    from engine.costs import CycleCosts, measure

    costs = CycleCosts(128, verify_ms={1: 10.0, 8: 16.0}, draft_ms={2: 4.0, 8: 4.0})
    assert costs.plain_steps(1) == 1.0 and costs.plain_steps(8) == 2.0
    assert abs(costs.plain_steps(4) - (10.0 + 6 * 3 / 7 + 4.0) / 10.0) < 1e-9  # verify interpolated, draft flat
    assert costs.as_dict()["cycle_in_plain_steps"] == {1: 1.0, 8: 2.0}

    class Models:  # what measure() reads of a LoadedModels
        def __init__(self):
            self.target, self.draft, self.device, self.tokenizer = target, tiny_draft(target, block_size=4), target.device, None
            self.context_window = target.config.max_position_embeddings

    measured = measure(Models(), context=16, sizes=(1, 4), repeats=1)
    assert set(measured.verify_ms) == {1, 4} and set(measured.draft_ms) == {4}
    assert all(ms > 0 for ms in [*measured.verify_ms.values(), *measured.draft_ms.values()])
