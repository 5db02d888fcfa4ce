"""Rotary embeddings whose frequencies depend on the furthest position of each forward.

Two of transformers' rotary kinds pick their frequencies per forward, from the largest position
id the forward is given, not per token:

- ``longrope`` (Phi-3 / Phi-3.5 / Phi-4-mini, PhiMoE, MiniCPM 3): short factors while that
  position is inside ``original_max_position_embeddings``, long factors (and another attention
  scale) past it;
- ``dynamic`` (dynamic NTK): once a forward reaches past ``max_position_embeddings`` the base is
  recomputed for that length, and the module keeps the largest length it has seen.

Plain decoding feeds one token at a time, so each token gets its own position's frequencies. A
verify feeds a block: a block that reaches past the boundary would rotate its earlier tokens with
the later ones' frequencies, and a dynamic-NTK module would keep a length that rejected drafts
reached. Both change the logits (by 0.1-1.6 % of their scale on twins: enough to change greedy
tokens). So a verify never crosses the boundary: a block that would is shortened to end at it.
Past it a longrope target verifies whole blocks again (every token is past it, one at a time as
well), while a dynamic-NTK target decodes one token at a time, as plain decoding does.

Phi-3's own ``generate()`` goes one step further: the first time the sequence passes the boundary
it drops its cache and computes the whole sequence again, so that every position has the long
factors (``recompute``). The verify at the boundary does the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

# families whose generate() recomputes the whole sequence when it first passes the boundary
# (their prepare_inputs_for_generation drops the cache there)
RECOMPUTE_AT_BOUNDARY = ("phi3", "phimoe", "phi4_multimodal")


@dataclass(frozen=True)
class VerifyLimit:
    """Where a target's rotary frequencies change with the length of a forward."""

    rope_type: str  # "longrope" or "dynamic"
    boundary: int  # a forward whose positions all stay below this uses the short / original frequencies
    recompute: bool = False  # the whole sequence is computed again at the boundary

    def block_room(self, start: int, block: int) -> int:
        """The longest verify at positions ``start``.. (at most ``block``) that computes what
        plain decoding does."""
        if start + block <= self.boundary:
            return block
        if start < self.boundary:
            return self.boundary - start
        return block if self.rope_type == "longrope" else 1

    def recompute_at(self, start: int) -> bool:
        """Whether a verify at ``start`` recomputes the sequence before it (the first forward
        that reaches past the boundary; verifies before it end at the boundary)."""
        return self.recompute and start == self.boundary


@dataclass(frozen=True)
class VerifyLimits:
    """Every ``VerifyLimit`` of a target (one per layer kind that has one; none for most)."""

    limits: tuple[VerifyLimit, ...] = ()

    def block_room(self, start: int, block: int) -> int:
        return min([block] + [limit.block_room(start, block) for limit in self.limits])

    def recompute_at(self, start: int) -> bool:
        return any(limit.recompute_at(start) for limit in self.limits)

    def start_reply(self, target) -> None:
        """A dynamic-NTK rotary module keeps the longest length any earlier forward reached, and
        only goes back to its own frequencies when a forward is shorter than its boundary: a
        prompt at least that long would be rotated with the frequencies some earlier, longer
        reply left behind. Each reply starts from the module's own frequencies, as on a freshly
        loaded model (transformers' own reset, run by a one-position forward of the module)."""
        if any(limit.rope_type == "dynamic" for limit in self.limits):
            reset_dynamic_rotary(target)


def verify_limits(config) -> VerifyLimits:
    """The target's limits: none when its rotary frequencies are the same for any forward
    (default, linear, yarn, llama3 and the like)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    recompute = {getattr(config, "model_type", None), getattr(text, "model_type", None)} & set(RECOMPUTE_AT_BOUNDARY)
    limits = {limit for params in _rope_parameter_sets(text)
              if (limit := _limit_of(params, text, bool(recompute))) is not None}
    return VerifyLimits(tuple(sorted(limits, key=lambda limit: (limit.rope_type, limit.boundary))))


def _rope_parameter_sets(text) -> Iterator[Mapping]:
    """The config's rope parameters: one mapping, or one per layer kind (Gemma 3's
    ``{"full_attention": {...}, "sliding_attention": {...}}``)."""
    for name in ("rope_parameters", "rope_scaling"):
        params = getattr(text, name, None)
        if not isinstance(params, Mapping):
            continue
        nested = [value for value in params.values() if isinstance(value, Mapping)]
        yield from nested or [params]


def _limit_of(params: Mapping, text, recompute: bool) -> VerifyLimit | None:
    rope_type = params.get("rope_type") or params.get("type")
    if rope_type == "longrope":
        boundary = (params.get("original_max_position_embeddings")
                    or getattr(text, "original_max_position_embeddings", None)
                    or getattr(text, "max_position_embeddings", None))
        return VerifyLimit("longrope", int(boundary), recompute) if boundary else None
    if rope_type is not None and "dynamic" in rope_type:
        boundary = getattr(text, "max_position_embeddings", None)
        return VerifyLimit("dynamic", int(boundary)) if boundary else None
    return None


def reset_dynamic_rotary(target) -> None:
    """Every dynamic-NTK rotary module of ``target`` back to its original frequencies."""
    for module in target.modules():
        rope_type = getattr(module, "rope_type", None)
        if rope_type is None or not hasattr(module, "original_max_seq_len"):
            continue
        kinds = rope_type.items() if isinstance(rope_type, Mapping) else [(None, rope_type)]
        for layer_type, kind in kinds:
            if "dynamic" not in str(kind):
                continue
            inv_freq = getattr(module, f"{layer_type}_inv_freq" if layer_type else "inv_freq")
            position = torch.zeros(1, 1, dtype=torch.long, device=inv_freq.device)
            module(inv_freq.new_zeros(1), position, **({"layer_type": layer_type} if layer_type else {}))
