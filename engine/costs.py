"""What one cycle costs, measured: a target verify over B tokens and one draft pass for a block
of B, at a fixed context, in milliseconds and in plain steps (a verify of one token).

Speculation pays when E[tau] exceeds a cycle's cost in plain steps, so that ratio is what the
chat's speed estimate divides by ("tau / cycle cost = speedup") and what ``bench --costs``
prints. The ratio hardly moves with the machine's load (both sides slow down together), which
is why it is measured once per engine and reused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .decode import clock
from .errors import InvalidRequestError
from .target_cache import TargetCache
from .fallback import interpolate
from .features import FeatureCapture


@dataclass(frozen=True)
class CycleCosts:
    """Measured costs: ``verify_ms[B]`` for B tokens, ``draft_ms[B]`` for one draft pass."""

    context: int
    verify_ms: dict[int, float] = field(default_factory=dict)
    draft_ms: dict[int, float] = field(default_factory=dict)

    def cycle_ms(self, block: int) -> float:
        """Draft + verify at ``block`` (interpolated between measured sizes)."""
        draft = interpolate(self.draft_ms, block) if block > 1 and self.draft_ms else 0.0
        return interpolate(self.verify_ms, block) + draft

    def plain_steps(self, block: int) -> float:
        """One cycle at ``block`` in plain steps (block 1 = 1.0)."""
        return 1.0 if block <= 1 else self.cycle_ms(block) / self.verify_ms[1]

    def as_dict(self) -> dict:
        sizes = sorted(self.verify_ms)
        return {"context": self.context, "verify_ms": dict(self.verify_ms), "draft_ms": dict(self.draft_ms),
                "cycle_in_plain_steps": {b: round(self.plain_steps(b), 3) for b in sizes}}


def measure_costs(models, context: int = 128, sizes=(1, 2, 4, 8, 16), repeats: int = 20) -> dict:
    """``CycleCosts(...).as_dict()`` for ``models`` (a ``LoadedModels``): medians of ``repeats``
    timings after two warm-up runs, on random token ids at a context of ``context`` tokens."""
    return measure(models, context, sizes, repeats).as_dict()


def measure(models, context: int = 128, sizes=(1, 2, 4, 8, 16), repeats: int = 20) -> CycleCosts:
    """Round-robin over the sizes (a verify of each, then a draft pass of each, per round), so
    that a change in the machine's load during the measurement hits every size alike and the
    ratios (cycle cost in plain steps) stay put; medians per size after two warm-up rounds."""
    target, draft, device = models.target, models.draft, models.device
    sizes = sorted(set(sizes) | {1})
    if context + sizes[-1] > models.context_window:
        raise InvalidRequestError(f"a context of {context} tokens and a verify of {sizes[-1]} are past this model's "
                                  f"context window of {models.context_window} tokens: measure at a shorter context")
    vocab = getattr(models.tokenizer, "vocab_size", 1000)
    generator = torch.Generator().manual_seed(0)
    high = min(vocab, target.get_input_embeddings().weight.shape[0])
    prompt = torch.randint(0, high, (1, context), generator=generator).to(device)
    capture = FeatureCapture(target, draft.target_layer_ids).attach() if draft is not None else None
    verify = {b: [] for b in sizes}
    drafted = {b: [] for b in sizes if b > 1 and draft is not None}
    cache = TargetCache(target)
    try:
        with torch.inference_mode():
            target(input_ids=prompt, past_key_values=cache.cache, use_cache=True, logits_to_keep=1)
            cache.commit(context)
            features = capture.take() if capture else None
            for _ in range(repeats + 2):
                for b in sizes:
                    verify[b].append(_time_verify(target, cache, capture, prompt, b))
                for b in drafted:
                    drafted[b].append(_time_draft(target, draft, prompt, features, b))
    finally:
        cache.close()
        if capture:
            capture.detach()
    return CycleCosts(context, {b: _median_ms(t) for b, t in verify.items()},
                      {b: _median_ms(t) for b, t in drafted.items()})


def _median_ms(times: list[float]) -> float:
    return round(min(times[2:]) * 1000, 3)  # after two warm-up rounds; the least disturbed run


def _time_verify(target, cache, capture, prompt, size: int) -> float:
    """Seconds of one target forward over ``size`` tokens after the context, with the rollback
    that puts the cache back at the context (for linear-attention targets: restoring their
    states; recomputing them over accepted tokens is not included)."""
    device, context = prompt.device, prompt.shape[1]
    t0 = clock(device)
    if size > 1:
        cache.before_verify()
    target(input_ids=prompt[:, :size], position_ids=torch.arange(context, context + size, device=device)[None],
           past_key_values=cache.cache, use_cache=True)
    cache.commit(context)
    elapsed = clock(device) - t0
    if capture:
        capture.take()
    return elapsed


def _time_draft(target, draft, prompt, features, size: int) -> float:
    """Seconds of one draft pass as the decode loop runs it: the new context's K/V, a full
    trained block of masks (smaller blocks verify only their first slots), logits and proposals
    of ``size - 1`` slots. The draft's context cache is filled first (not timed)."""
    device, context = prompt.device, prompt.shape[1]
    embeddings = target.get_input_embeddings()
    draft_cache = draft.new_cache()
    draft(draft.embed(embeddings, prompt[:, :size]), features[:, : context - size],
          torch.arange(0, context, device=device)[None], cache=draft_cache)
    width = max(size, draft.block_size)
    ids = torch.full((1, width), draft.mask_token_id, device=device)
    t0 = clock(device)
    hidden = draft(draft.embed(embeddings, ids), features[:, -size:],
                   torch.arange(context - size, context + width, device=device)[None], cache=draft_cache)
    draft.draft_tokens(hidden[0, 1:size], 0, target.get_output_embeddings())
    return clock(device) - t0
