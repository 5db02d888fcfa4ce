"""Speculative sampling at T > 0 keeps the target's distribution (proposals drawn from the
draft's q or its argmax, accepted with probability min(1, p/q), residual on rejection), and
detokenization never splits a UTF-8 character."""

from __future__ import annotations

import pytest
import torch

from engine import decode as decode_module
from engine.config import SamplingConfig
from engine.decode import generate
from engine.detok import IncrementalDetokenizer
from engine.events import Finished
from engine.sampling import sampling_probs, speculative_accept
from tests.tiny_models import tiny_draft, tiny_target, tiny_tokenizer

VOCAB = 12
PROMPT = [1, 2, 3]


def small_target(sharpness=0.25):
    target = tiny_target(seed=7, layers=2, hidden=32, vocab=VOCAB)
    with torch.no_grad():
        target.lm_head.weight.mul_(sharpness)  # flatter than the greedy fixtures: real uncertainty
    return target


def exact_marginals(target, count, temperature, top_p=1.0):
    """P(k-th generated token) for k = 1..count, from the target alone: every prefix of k-1
    tokens is enumerated (one batched forward per k) and weighted by its exact probability."""
    marginals, prefixes, weights = [], torch.empty(1, 0, dtype=torch.long), torch.ones(1)
    with torch.no_grad():
        for _ in range(count):
            ids = torch.cat([torch.tensor([PROMPT]).expand(len(prefixes), -1), prefixes], dim=1)
            step = sampling_probs(target(input_ids=ids).logits[:, -1], temperature, top_p)  # [prefixes, V]
            marginals.append((weights[:, None] * step).sum(0))
            weights = (weights[:, None] * step).reshape(-1)
            prefixes = torch.cat([prefixes.repeat_interleave(VOCAB, 0),
                                  torch.arange(VOCAB).repeat(len(prefixes))[:, None]], 1)
    return marginals


def chi_square(counts, probs, n):
    expected = probs * n
    keep = expected > 5
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum()), int(keep.sum()) - 1


def stand_in_draft(target, fallback_logits, temperature):
    """A stand-in draft network: in the first cycle it proposes from the target's own greedy
    continuation of the anchor at a much lower temperature (a q close to p but not equal, so whole
    blocks get accepted); later its per-slot logits are fixed (a q unlike p)."""

    def propose(draft, tgt, cache, pending, anchor, start, block):
        if start != len(PROMPT):
            logits = fallback_logits[: block - 1]
            return logits.argmax(-1).tolist(), logits
        ids, rows = PROMPT + [anchor], []
        with torch.no_grad():
            for _ in range(block - 1):
                row = target(input_ids=torch.tensor([ids])).logits[0, -1] * 2.0
                rows.append(row)
                ids.append(int(row.argmax()))
        logits = torch.stack(rows)
        return logits.argmax(-1).tolist(), logits

    return propose


@pytest.mark.slow
@pytest.mark.parametrize("proposal,temperature,top_p,proposal_vocab", [
    ("argmax", 1.0, 1.0, None), ("sample", 1.0, 1.0, None), ("sample", 0.7, 0.9, None), ("sample", 1.0, 1.0, 6)])
def test_speculative_sampling_has_the_targets_distribution(monkeypatch, proposal, temperature, top_p, proposal_vocab):
    """Every emitted token (accepted draft, correction or bonus) is distributed as the target's
    own sample given what came before: chi-square on the first four tokens' marginals, block 3,
    so the fourth token is the bonus when both drafts are accepted. ``proposal_vocab``: a draft
    that proposes from the first ids only (``proposal_vocab_size``; q is 0 elsewhere)."""
    target = small_target(sharpness=2.5)  # peaked enough that whole blocks get accepted
    marginals = exact_marginals(target, 4, temperature, top_p)
    # the draft's q at slot j: the (j+1)-th token's marginal, sharpened (plausible, but not p)
    proposal_logits = torch.stack([m.clamp_min(1e-9).log() * 2.0 for m in marginals[1:]])
    if proposal_vocab is not None:
        proposal_logits[:, proposal_vocab:] = float("-inf")  # as DFlashDraftModel.proposal_logits leaves them
    monkeypatch.setattr(decode_module, "propose", stand_in_draft(target, proposal_logits, temperature))
    draft = tiny_draft(target, block_size=3)
    n = 800
    counts = [torch.zeros(VOCAB) for _ in marginals]
    accepted = full_blocks = off_argmax = 0
    for seed in range(n):
        settings = SamplingConfig(max_new_tokens=4, block_size=3, temperature=temperature, top_p=top_p,
                                  seed=seed, proposal=proposal)
        events = list(generate(target, draft, PROMPT, settings))
        finished = events[-1]
        assert isinstance(finished, Finished)
        for k, counter in enumerate(counts):
            counter[finished.token_ids[k]] += 1
        first = events[1]
        accepted += first.accepted
        full_blocks += first.accepted == 2
        off_argmax += [slot.draft_top[0][0] for slot in first.slots] != list(first.draft_tokens)  # not the argmax
    assert accepted > n * 0.2 and full_blocks >= 10, (accepted, full_blocks)  # accept and bonus paths ran
    assert (off_argmax > n * 0.05) if proposal == "sample" else off_argmax == 0
    for k, (counter, probs) in enumerate(zip(counts, marginals), 1):
        stat, dof = chi_square(counter, probs, n)
        # chi-square critical value at p = 0.001 for <= 11 degrees of freedom is 31.3
        assert stat < 31.3, (k, stat, dof, counter / n, probs)


def test_speculative_accept_rule():
    """The rule on hand-made distributions: certain acceptance where p >= q, certain rejection
    where p(x) = 0 with the token drawn from norm(max(0, p - q)), the bonus from the last row,
    and with a one-hot q (argmax proposal) a residual that never repeats the rejected draft."""
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        assert speculative_accept([1, 0], q, p, generator) == (1, 2)  # residual at slot 1 = [0, 0, 1]
    bonuses = {speculative_accept([0, 2], torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]), p, generator) for _ in range(200)}
    assert {b[0] for b in bonuses} == {2} and {b[1] for b in bonuses} == {0, 1, 2}  # p[2] has full support
    p_one = torch.tensor([[0.6, 0.2, 0.2], [1.0, 0.0, 0.0]])
    outcomes = [speculative_accept([0], None, p_one, generator) for _ in range(400)]
    rejected = [token for accepted, token in outcomes if accepted == 0]
    assert rejected and 0 not in rejected  # rejected with probability 1 - p(0) = 0.4; residual excludes 0
    assert 0.3 < len(rejected) / 400 < 0.5


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
