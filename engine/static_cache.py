"""Preallocated caches for the compiled path: every tensor keeps its shape and its address from
one reply to the next, so that a compiled forward never meets a new shape.

Target (``StaticTargetCache``): every attention layer, full or sliding, gets a ``StaticLayer`` of
``max_length`` positions; the sliding window is the attention mask's business (transformers
builds it from the positions), so no key inside the window is ever overwritten by a rolled
buffer and a rollback stays "move the length". The positions past the length hold stale keys
that the causal mask never shows: a verify writes its block from the length on, over them.
Linear-attention layers keep transformers' own layer and the snapshot-and-recompute rollback of
``TargetCache`` (their state has no length to move).

Draft (``StaticDraftCache``): the context keys/values of each draft layer in a [b, heads,
max_length, d] buffer; a pass writes its new context at the length (padded to a fixed width,
the padding masked) and the length moves by the real count afterwards.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, LinearAttentionLayer, StaticLayer

from .target_cache import TargetCache, layer_caches


class StaticTargetCache(TargetCache):
    """``TargetCache`` with preallocated attention layers of ``max_length`` positions."""

    def __init__(self, target, max_length: int):
        self.max_length = int(max_length)
        super().__init__(target)

    def new_cache(self, target) -> Cache:
        layers = [layer if isinstance(layer, LinearAttentionLayer) else StaticLayer(max_cache_len=self.max_length)
                  for layer in layer_caches(target)]
        return Cache(layers=layers)

    def seq_length(self) -> int:
        return int(self.attention[0].cumulative_length) if self.attention else 0

    def keep_attention(self, length: int, remove: int) -> None:
        if length > self.max_length:
            raise ValueError(f"a static cache of {self.max_length} positions cannot keep {length}")
        for layer in self.attention:
            layer.cumulative_length.fill_(length)

    def reset(self) -> None:
        """Empty, for the next reply (the buffers stay where they are)."""
        for layer in self.attention:
            layer.cumulative_length.fill_(0)
        for layer, _ in self.linear:
            layer.reset()
        self._snapshot = None
        self._inputs.clear()


class StaticDraftCache:
    """The draft's context keys/values in fixed buffers. ``filled``: positions [0, filled) hold
    context; ``incoming``: how many of the positions the running pass writes are real (the rest
    pads the pass to its fixed width and is masked)."""

    def __init__(self, num_layers: int, max_length: int):
        self.max_length = int(max_length)
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.filled = torch.zeros((), dtype=torch.long)
        self.incoming = torch.zeros((), dtype=torch.long)
        self.positions: torch.Tensor | None = None
        self.passes: dict = {}  # block width -> compiled draft pass (set per reply by the backend)

    @property
    def length(self) -> int:
        return int(self.filled)

    def to(self, device) -> "StaticDraftCache":
        self.filled, self.incoming = _static(self.filled.to(device)), _static(self.incoming.to(device))
        self.positions = _static(torch.arange(self.max_length, device=device))
        return self

    def reset(self) -> None:
        self.filled.fill_(0)
        self.incoming.fill_(0)

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer] is None:  # allocated by an eager pass, never inside a compiled one
            self.keys[layer] = _static(k.new_zeros(k.shape[0], k.shape[1], self.max_length, k.shape[-1]))
            self.values[layer] = _static(v.new_zeros(v.shape[0], v.shape[1], self.max_length, v.shape[-1]))
        index = self.filled + torch.arange(k.shape[-2], device=k.device)
        self.keys[layer].index_copy_(2, index, k)
        self.values[layer].index_copy_(2, index, v)
        return self.keys[layer], self.values[layer]

    def key_positions(self, count: int, device) -> torch.Tensor:
        return self.positions if self.positions is not None else torch.arange(self.max_length, device=device)

    def visible_keys(self) -> torch.Tensor:
        """[max_length] bool: the context positions a query of this pass may see."""
        positions = self.positions if self.positions is not None else torch.arange(self.max_length)
        return positions < self.filled + self.incoming

    def run(self, draft, noise: torch.Tensor, context: torch.Tensor, start: int) -> torch.Tensor:
        """One draft pass over ``context`` (the new features, [1, C, k*H]) and the block
        ``noise`` [1, W, H] at positions start.. . With a compiled pass for width W (``passes``)
        and C <= W, the context is padded to W positions (zeros, masked) and the pass runs
        compiled; otherwise (the prompt, features gathered over plain steps) the draft runs
        eagerly on the same buffers."""
        real, width = context.shape[1], noise.shape[1]
        compiled = self.passes.get(width) if real <= width else None
        if compiled is not None and real < width:
            context = torch.cat([context, context.new_zeros(1, width - real, context.shape[-1])], dim=1)
        if self.length + context.shape[1] > self.max_length:
            raise ValueError(f"the draft cache of {self.max_length} positions cannot take "
                             f"{self.length + context.shape[1]}")
        self.incoming.fill_(real)
        device = noise.device
        positions = torch.cat([torch.arange(start - real, start - real + context.shape[1], device=device),
                               torch.arange(start, start + width, device=device)])[None]
        hidden = (compiled or draft)(noise, context, positions, cache=self)
        self.filled.add_(real)
        self.incoming.fill_(0)
        return hidden


def _static(tensor: torch.Tensor) -> torch.Tensor:
    """Marked as living at a fixed address: CUDA graphs then update it in place instead of
    refusing to capture a pass that writes into it."""
    torch._dynamo.mark_static_address(tensor)
    return tensor
