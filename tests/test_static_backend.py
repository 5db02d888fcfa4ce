"""The static backend (preallocated caches, padded verifies and draft passes: what the compiled
path compiles) decodes every target family exactly as the eager backend and plain greedy
decoding do, run eagerly here so that it costs no compile time: the same tokens, the same drafts
(so the same features reach the draft), through every rollback length and past every window."""

from __future__ import annotations

import pytest
import torch

from engine import decode as decode_module
from engine.backends import StaticBackend
from engine.config import SamplingConfig
from engine.decode import generate
from engine.events import Cycle, Finished
from tests.family_twins import FAMILIES, family_twin
from tests.test_families import NEW_TOKENS, PROMPT, oracle_propose, plain_greedy, sampling_setup
from tests.tiny_models import tiny_draft, tiny_target


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    target = family_twin(request.param)
    return request.param, target, plain_greedy(target, PROMPT, NEW_TOKENS)


def run(target, draft, block, backend=None, **sampling):
    events = list(generate(target, draft, PROMPT, SamplingConfig(block_size=block, max_new_tokens=NEW_TOKENS,
                                                                 **sampling), backend=backend))
    assert isinstance(events[-1], Finished), events[-1]
    return events


def drafts_of(events):
    return [cycle.draft_tokens for cycle in events if isinstance(cycle, Cycle)]


@pytest.mark.parametrize("block", [1, 4, 8, 16])
def test_static_backend_equals_plain_and_eager_on_every_family(family, block, monkeypatch):
    name, target, reference = family
    draft = tiny_draft(target, block_size=max(block, 2))
    backend = StaticBackend(target, draft)
    try:
        eager = run(target, draft, block)
        static = run(target, draft, block, backend)
        assert list(static[-1].token_ids) == reference, name
        # the draft saw the same features and context: it proposed the same tokens in every cycle
        assert drafts_of(static) == drafts_of(eager), name
        # a second reply on the same (reused) caches starts from empty ones
        assert list(run(target, draft, block, backend)[-1].token_ids) == reference, name
        # every accept count and rollback length, past every window
        monkeypatch.setattr(decode_module, "propose", oracle_propose(reference, target.config.vocab_size))
        events = run(target, draft, block, backend)
        assert list(events[-1].token_ids) == reference, name
    finally:
        backend.close()  # the module's twin is shared: its hooks go
    if block > 1:
        accepted = {cycle.accepted for cycle in events[1:-1]}
        assert len(accepted) >= min(block, 4) and max(accepted) == block - 1, accepted


def test_a_short_last_block_is_padded_to_the_policys_width_and_cut():
    """7 prompt tokens + 10 new at block 8: the last verify has fewer real tokens than the
    compiled width; its padding must not reach the reply or the rollback."""
    target = tiny_target()
    draft = tiny_draft(target, block_size=8)
    reference = plain_greedy(target, PROMPT, 10)
    calls = []
    backend = StaticBackend(target, draft)
    original = backend.open

    def spy(*args):
        session = original(*args)
        verify = session.verify
        session.verify = lambda tokens, start, width: calls.append((len(tokens), width)) or verify(tokens, start, width)
        return session

    backend.open = spy
    events = list(generate(target, draft, PROMPT, SamplingConfig(block_size=8, max_new_tokens=10), backend=backend))
    assert list(events[-1].token_ids) == reference
    assert any(real < width for real, width in calls), calls


def test_a_reply_longer_than_the_first_bucket_takes_the_next():
    target = tiny_target()
    draft = tiny_draft(target, block_size=4)
    backend = StaticBackend(target, draft, buckets=(16, 64))
    reference = plain_greedy(target, PROMPT, 40)
    events = list(generate(target, draft, PROMPT, SamplingConfig(block_size=4, max_new_tokens=40), backend=backend))
    assert list(events[-1].token_ids) == reference
    assert sorted(backend.caches) == [64]


def test_the_static_draft_cache_masks_its_padding():
    """A draft pass whose context is padded to the block width gives the hidden states of the
    unpadded pass on the dynamic cache (the padding is never attended to)."""
    target = tiny_target()
    draft = tiny_draft(target, block_size=8)
    from engine.static_cache import StaticDraftCache

    torch.manual_seed(3)
    width = 8
    features = torch.randn(1, 12, len(draft.target_layer_ids) * 64)
    noise = torch.randn(1, width, 64)
    dynamic, static = draft.new_cache(), StaticDraftCache(len(draft.layers), 64)
    padded = {width: lambda n, c, p, cache: draft(n, c, p, cache=cache)}
    with torch.no_grad():
        for cache in (dynamic, static):
            cache.run(draft, noise, features[:, :9], 9)
        static.passes = padded
        expected = dynamic.run(draft, noise, features[:, 9:], 12)
        got = static.run(draft, noise, features[:, 9:], 12)  # 3 real context positions padded to 8
    assert static.length == 12
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_speculative_sampling_on_the_static_backend_keeps_the_distribution(name, monkeypatch):
    """At T > 0 the static backend (padded verifies, reused caches) still emits the target's own
    samples: the chi-square test of tests/test_families.py, on this backend."""
    from engine.static_cache import StaticDraftCache
    from tests import test_engine_sampling as sampling_tests

    target, marginals, draft = sampling_setup(name, monkeypatch)
    backend = StaticBackend(target, draft, buckets=(32,))
    n = 400
    counts = [torch.zeros(sampling_tests.VOCAB) for _ in marginals]
    accepted = 0
    for seed in range(n):
        events = list(generate(target, draft, sampling_tests.PROMPT,
                               SamplingConfig(max_new_tokens=4, block_size=3, temperature=1.0, seed=seed,
                                              proposal="sample"), backend=backend))
        assert isinstance(events[-1], Finished), events[-1]
        for k, counter in enumerate(counts):
            counter[events[-1].token_ids[k]] += 1
        accepted += events[1].accepted
    assert isinstance(backend.caches[32].draft, StaticDraftCache)
    assert accepted > n * 0.2, accepted  # the accept paths ran
    for k, (counter, probs) in enumerate(zip(counts, marginals), 1):
        stat, dof = sampling_tests.chi_square(counter, probs, n)
        assert stat < 31.3, (name, k, stat, dof, counter / n, probs)  # p = 0.001 for <= 11 dof
