"""The two ways the decode loop runs the target and the draft: one loop (engine/decode.py), two
backends behind the same three calls (prefill, verify, draft pass) and the same rollback.

- ``EagerBackend``: a ``DynamicCache`` per reply, features tapped by forward hooks, every
  forward at the shape it comes with.
- ``StaticBackend``: gpt-fast's way. Preallocated caches (engine/static_cache.py) reused from one
  reply to the next, every verify padded to a fixed width and every draft pass's new context to
  a fixed width, so that a compiled forward (``passes``, filled by engine/compiled.py) meets the
  same shapes every time; a shape with no compiled pass runs the same module eagerly. Its
  feature hooks are attached once, when the backend is made, and never change: a compiled pass
  has them traced in (a hook added or removed later would not be).

Both give the same tokens: the padding sits after the real tokens, where the causal mask keeps
it from every real query, and the rollback moves the length back over it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .errors import NonFiniteLogitsError
from .features import FeatureCapture, decoder_layers
from .rope_limits import verify_limits
from .static_cache import StaticDraftCache, StaticTargetCache
from .target_cache import TargetCache, logit_drift, probe_tokens
from .weights import check_finite_logits


@dataclass
class EagerBackend:
    """``release``: called when a session closes (the compiled path counts the eager replies
    running, and its compile thread pauses while any does)."""

    release: Callable[[], None] | None = None
    name = "eager"

    def open(self, target, draft, max_length: int, max_width: int) -> "EagerSession":
        return EagerSession(target, draft, self.release)


class EagerSession:
    """One reply on a fresh ``DynamicCache``; hooks capture the draft's features."""

    def __init__(self, target, draft, release: Callable[[], None] | None = None):
        self.release = release
        self.target = target
        self.cache = TargetCache(target)
        self.capture = FeatureCapture(target, draft.target_layer_ids).attach() if draft is not None else None
        self.draft_cache = draft.new_cache() if draft is not None else None
        self.rope = verify_limits(target.config)
        self.ids: list[int] = []  # the tokens in the cache, then those of the verify in flight

    def prefill(self, prompt_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last position's logits [1, V] and the prompt's features [1, n, k*H] (None without a draft)."""
        out = self.target(input_ids=torch.tensor([prompt_ids], device=self.target.device),
                          past_key_values=self.cache.cache, use_cache=True, logits_to_keep=1)
        self.cache.commit(len(prompt_ids))  # keeps every prompt position; trims sliding layers to their window
        self.ids = list(prompt_ids)
        return out.logits[0, -1:], self.capture.take() if self.capture is not None else None

    def verify(self, tokens: list[int], start: int, width: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``tokens`` at positions start.. through the target: logits [n, V], features [1, n, k*H]."""
        device, verified = self.target.device, len(tokens)
        del self.ids[start:]
        self.ids.extend(tokens)
        keep = {}
        if self.rope.recompute_at(start):  # as the family's own generate(): the whole sequence again
            self.cache.close()
            self.cache, tokens, start, keep = TargetCache(self.target), list(self.ids), 0, {"logits_to_keep": verified}
        if len(tokens) > 1:
            self.cache.before_verify()
        out = self.target(input_ids=torch.tensor([tokens], device=device),
                          position_ids=torch.arange(start, start + len(tokens), device=device)[None],
                          past_key_values=self.cache.cache, use_cache=True, **keep)
        features = self.capture.take()[:, -verified:] if self.capture is not None else None
        return out.logits[0, -verified:], features

    def commit(self, length: int) -> None:
        self.cache.commit(length)

    def close(self) -> None:
        try:
            self.cache.close()
            if self.capture is not None:
                self.capture.detach()
        finally:
            release, self.release = self.release, None  # once, however often close is called
            if release is not None:
                release()


@dataclass
class StaticCaches:
    """One bucket's caches: the target's and the draft's, ``length`` positions each (the draft's
    has room for a padded pass past the end)."""

    target: StaticTargetCache
    draft: StaticDraftCache | None


@dataclass
class StaticBackend:
    """Static caches per length bucket, and the compiled passes that use them.

    ``target``: the module that runs (the compiled path gives a copy sharing the weights, so
    that nothing another thread hooks onto the loaded target is traced into a compiled pass).
    ``passes``: ``("verify" | "draft", bucket, width) -> callable``; ``release``: called when a
    session closes (the compiled path's lock)."""

    target: object
    draft: object | None
    buckets: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
    passes: dict = field(default_factory=dict)
    release: Callable[[], None] | None = None
    name: str = "static"
    caches: dict = field(default_factory=dict)
    capture: FeatureCapture | None = None

    def __post_init__(self):
        if self.draft is not None and self.capture is None:
            self.capture = FeatureCapture(self.target, self.draft.target_layer_ids).attach()
            self.capture.enabled = False  # on only while a session of this backend runs

    def bucket(self, needed: int) -> int:
        for size in self.buckets:
            if needed <= size:
                return size
        raise ValueError(f"no static cache bucket holds {needed} positions (largest {self.buckets[-1]})")

    def caches_for(self, bucket: int) -> StaticCaches:
        if bucket not in self.caches:
            draft = None
            if self.draft is not None:
                draft = StaticDraftCache(len(self.draft.layers), bucket + 2 * _MAX_PAD).to(self.target.device)
            self.caches[bucket] = StaticCaches(StaticTargetCache(self.target, bucket + _MAX_PAD), draft)
        return self.caches[bucket]

    def cache_bytes(self) -> int:
        """Memory the static caches hold (every bucket allocated so far)."""
        tensors = []
        for caches in self.caches.values():
            tensors += [t for layer in caches.target.attention for t in (layer.keys, layer.values)]
            if caches.draft is not None:
                tensors += caches.draft.keys + caches.draft.values
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def open(self, target, draft, max_length: int, max_width: int) -> "StaticSession":
        bucket = self.bucket(max_length)
        caches = self.caches_for(bucket)
        caches.target.reset()
        if caches.draft is not None:
            caches.draft.reset()
        return StaticSession(self, bucket, caches, draft is not None)

    def close(self) -> None:
        for caches in self.caches.values():
            caches.target.close()
        self.caches.clear()
        if self.capture is not None:
            self.capture.detach()


_MAX_PAD = 16  # engine.config.MAX_BLOCK_SIZE: a verify or a draft context is padded to at most this


class StaticSession:
    """One reply on a bucket's static caches."""

    def __init__(self, backend: StaticBackend, bucket: int, caches: StaticCaches, speculative: bool):
        self.backend, self.bucket = backend, bucket
        self.target = backend.target
        self.cache = caches.target
        self.draft_cache = caches.draft if speculative else None
        # on for plain replies too: a compiled verify takes the features whether or not they are used
        self.capture = backend.capture
        if self.capture is not None:
            self.capture.enabled = True
        if self.draft_cache is not None:
            self.draft_cache.passes = {width: fn for (kind, b, width), fn in backend.passes.items()
                                       if kind == "draft" and b == bucket}
        self.uncompiled: set[tuple[str, int]] = set()  # shapes this reply ran eagerly

    def prefill(self, prompt_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.target(input_ids=torch.tensor([prompt_ids], device=self.target.device),
                          past_key_values=self.cache.cache, use_cache=True, logits_to_keep=1)
        self.cache.commit(len(prompt_ids))
        check_finite_logits(out.logits)
        return out.logits[0, -1:], self.capture.take() if self.capture is not None else None

    def verify(self, tokens: list[int], start: int, width: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``tokens`` padded to ``width`` (the policy's block: one compiled shape per block size)."""
        real = len(tokens)
        width = max(width, real)
        device = self.target.device
        ids = torch.tensor([tokens + [tokens[-1]] * (width - real)], device=device)
        positions = torch.arange(start, start + width, device=device)[None]
        if width > 1:
            self.cache.before_verify()
        run = self.backend.passes.get(("verify", self.bucket, width))
        if run is None:
            self.uncompiled.add(("verify", width))
            run = verify_pass(self.target, self.cache, self.capture)
        logits, features = run(ids, positions)
        logits = logits[0, :real]
        check_finite_logits(logits)
        return logits, features[:, :real] if features is not None else None

    def commit(self, length: int) -> None:
        self.cache.commit(length)

    def close(self) -> None:
        if self.capture is not None:
            self.capture.enabled = False
            self.capture.clear()
        if self.backend.release is not None:
            self.backend.release()


@torch.inference_mode()
def static_disagreement(backend: StaticBackend, prompt_lengths: tuple[int, ...] = (7, 13),
                        width: int = 4, bucket: int | None = None, where: str = "on a static cache") -> str | None:
    """Why the static caches would change what the target computes (None when they do not).

    For each prompt length, a prefill and a padded verify on the static caches beside the same
    forwards on the eager path's cache, compared logit for logit. A static cache always hands the
    model a mask over its whole length, and a few architectures read that differently from the
    eager path's: Doge adds a learned bias to whatever mask it gets and attends both ways without
    one, GPT-Neo compares the cache's length with a causal buffer of its own, BLOOM builds ALiBi
    from the mask. Such a model stays on the eager path, whose tokens are plain decoding's.

    The verify runs the backend's pass for (``bucket``, ``width``) where it has one: called
    again once a pass is compiled (``where="compiled"``), the same check proves the compiled
    forward computes what the eager one does."""
    for prompt_length in prompt_lengths:
        try:
            drift = _static_error(backend, prompt_length, width, bucket or backend.buckets[0])
        except NonFiniteLogitsError:
            return f"its logits {where} are NaN or infinite where the eager path's are finite"
        except Exception as exc:
            return f"the model fails {where} ({type(exc).__name__}: {exc})"
        if drift is not None:
            return f"its logits {where} differ from the eager path's by {drift:.1%} of their scale"
    return None


def _static_error(backend: StaticBackend, prompt_length: int, width: int, bucket: int) -> float | None:
    """How far the static caches move the logits of a prefill and a padded verify (``logit_drift``)."""
    target = backend.target
    ids = probe_tokens(target, prompt_length + max(1, width - 1))  # width 1: one token, no padding
    prompt, block = ids[:prompt_length], ids[prompt_length:]
    eager = EagerSession(target, None)
    try:
        want = torch.cat([eager.prefill(prompt)[0], eager.verify(block, prompt_length, width)[0]])
    finally:
        eager.close()
    caches = backend.caches_for(bucket)
    caches.target.reset()
    session = StaticSession(backend, bucket, caches, speculative=False)
    try:
        got = torch.cat([session.prefill(prompt)[0], session.verify(block, prompt_length, width)[0]])
    finally:
        if backend.capture is not None:
            backend.capture.enabled = False
            backend.capture.clear()
        caches.target.reset()
    return logit_drift(got, want)


def verify_pass(target, cache: StaticTargetCache, capture: FeatureCapture | None):
    """The function a compiled verify traces: one target forward on the static cache, returning
    the logits and the draft's features (the hooks' outputs, taken inside the pass)."""

    def verify(input_ids: torch.Tensor, position_ids: torch.Tensor):
        out = target(input_ids=input_ids, position_ids=position_ids, past_key_values=cache.cache, use_cache=True)
        return out.logits, capture.take() if capture is not None else None

    return verify


def draft_pass(draft):
    def run(noise, context, positions, cache):
        return draft(noise, context, positions, cache=cache)

    return run


def has_linear_attention(target) -> bool:
    """Linear-attention targets roll back by recomputing their mixers from hooked inputs: that
    path stays eager (static caches still work for them)."""
    from .target_cache import mixer_of

    return any(mixer_of(layer) is not None for layer in decoder_layers(target))
