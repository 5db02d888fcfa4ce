"""Sampling at T > 0 keeps the target's distribution (the draft proposes argmax, the target
samples, accept while equal), and detokenization never splits a UTF-8 character."""

from __future__ import annotations

import torch

from engine import decode as decode_module
from engine.config import SamplingConfig
from engine.decode import generate
from engine.detok import IncrementalDetokenizer
from engine.events import Finished
from engine.sampling import sampling_probs
from tests.tiny_models import tiny_draft, tiny_target, tiny_tokenizer

VOCAB = 12
PROMPT = [1, 2, 3]


def small_target():
    target = tiny_target(seed=7, layers=2, hidden=32, vocab=VOCAB)
    with torch.no_grad():
        target.lm_head.weight.mul_(0.25)  # flatter than the greedy fixtures: real uncertainty
    return target


def exact_marginals(target, temperature):
    """P(first token), and P(second token) = sum_t1 P(t1) P(t2 | t1), from the target itself."""
    with torch.no_grad():
        p1 = sampling_probs(target(input_ids=torch.tensor([PROMPT])).logits[0, -1], temperature)
        p2 = torch.zeros(VOCAB)
        for t1 in range(VOCAB):
            logits = target(input_ids=torch.tensor([PROMPT + [t1]])).logits[0, -1]
            p2 += p1[t1] * sampling_probs(logits, temperature)
    return p1, p2


def chi_square(counts, probs, n):
    expected = probs * n
    keep = expected > 5
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum()), int(keep.sum()) - 1


def test_sampling_has_the_targets_distribution(monkeypatch):
    target = small_target()
    temperature = 1.0
    p1, p2 = exact_marginals(target, temperature)
    likely = int(p2.argmax())

    def propose_likely(draft, tgt, cache, pending, anchor, start, block):
        return [likely] * (block - 1), torch.zeros(block - 1, VOCAB)

    monkeypatch.setattr(decode_module, "propose", propose_likely)
    draft = tiny_draft(target, block_size=4)
    n = 800
    first, second = torch.zeros(VOCAB), torch.zeros(VOCAB)
    accepted = 0
    for seed in range(n):
        events = list(generate(target, draft, PROMPT, SamplingConfig(max_new_tokens=3, block_size=4, temperature=temperature, seed=seed)))
        finished = events[-1]
        assert isinstance(finished, Finished)
        first[finished.token_ids[0]] += 1
        second[finished.token_ids[1]] += 1
        accepted += events[1].accepted
    assert accepted > n * 0.1  # the accept path really ran
    for counts, probs in ((first, p1), (second, p2)):
        stat, dof = chi_square(counts, probs, n)
        # chi-square critical value at p = 0.001 for <= 11 degrees of freedom is 31.3
        assert stat < 31.3, (stat, dof, counts / n, probs)


def test_seed_makes_sampling_reproducible():
    target = small_target()
    draft = tiny_draft(target, block_size=4)
    runs = [list(generate(target, draft, PROMPT, SamplingConfig(max_new_tokens=20, block_size=4, temperature=0.8, top_p=0.9, top_k=8, seed=11)))[-1].token_ids for _ in range(2)]
    assert runs[0] == runs[1]


def test_top_k_and_top_p_filtering():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    probs = sampling_probs(logits, 1.0, top_k=2)
    assert (probs[2:] == 0).all() and torch.isclose(probs.sum(), torch.tensor(1.0))
    probs = sampling_probs(logits, 1.0, top_p=0.5)
    assert probs[0] == 1.0  # the top token alone already holds > 50 %


def test_incremental_detokenizer_never_splits_characters():
    tokenizer = tiny_tokenizer()
    text = "print('héllo wörld ✓ 漢字 🙂')\n"
    ids = tokenizer(text)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push(t) for t in ids]
    assert "".join(pieces) + detok.flush() == tokenizer.decode(ids)
    assert not any("\ufffd" in p for p in pieces)
    emoji_tokens = tokenizer("🙂")["input_ids"]
    assert len(emoji_tokens) > 1  # a multi-byte character spread over several tokens
    pieces = IncrementalDetokenizer(tokenizer).peek(emoji_tokens)
    assert pieces[:-1] == [""] * (len(emoji_tokens) - 1) and pieces[-1] == "🙂"
