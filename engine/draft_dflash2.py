"""DFlash2's additions to the DFlash draft (``DFlash2DraftModel``).

- A grouped dynamic depthwise convolution around each attention and MLP sublayer: before the
  sublayer its input is convolved, after it its output, each with kernel ``base_kernel[side] +
  delta``, where ``delta`` (one coefficient per tap and channel group, ``conv_group_size``
  channels per group) is projected from the sublayer's input at the same position. The taps look
  back over earlier positions of the block only: position j mixes positions j, j-1, ...,
  never anything before the block start.
- A candidate selector: per slot, the top ``selector_top_k`` tokens of the LM head, rescored by a
  low-rank bigram term ``<predecessor_codebook[previous] * hidden_projection(h), successor_codebook
  [candidate]>``; the drafts are the greedy path through those candidates, starting from the anchor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .draft_config import draft_setting
from .draft_layers import DraftLayer
from .errors import CheckpointError

SETTINGS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def dflash2_settings(config) -> dict[str, int]:
    """The four DFlash2 keys (either level), checked as SpecForge states them."""
    values = {}
    for name in SETTINGS:
        value = draft_setting(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"DFlash2 draft config: {name} must be a positive integer (got {value!r})")
        values[name] = value
    if config.hidden_size % values["conv_group_size"]:
        raise CheckpointError(f"DFlash2 draft config: conv_group_size {values['conv_group_size']} does not divide "
                              f"hidden_size {config.hidden_size}")
    if values["selector_top_k"] > config.vocab_size:
        raise CheckpointError(f"DFlash2 draft config: selector_top_k {values['selector_top_k']} exceeds the "
                              f"vocabulary ({config.vocab_size})")
    return values


class GroupedDynamicConv(nn.Module):
    """out[j] = sum_t (base[side, t] + delta[j, t, group]) * x[j - t] over taps t with j - t >= 0
    (j counts from the block start)."""

    def __init__(self, hidden_size: int, taps: int, group_size: int):
        super().__init__()
        self.taps, self.group_size, self.groups = taps, group_size, hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * taps * self.groups, bias=False)

    def _convolve(self, x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        """x [b, n, H]; delta [b, n, taps, groups]; base [taps, H]."""
        b, n, hidden = x.shape
        blocks = x.view(b, n, self.groups, self.group_size)
        out = torch.zeros_like(blocks)
        for tap in range(min(self.taps, n)):
            shifted = F.pad(blocks[:, : n - tap], (0, 0, 0, 0, tap, 0))  # zeros before the block start
            weight = base[tap].view(self.groups, self.group_size) + delta[:, :, tap, :, None]
            out = out + weight * shifted
        return out.view(b, n, hidden)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The convolved sublayer input, and the coefficients ``finish`` applies to its output."""
        delta = self.kernel_projection(x).view(*x.shape[:-1], 2, self.taps, self.groups)
        return self._convolve(x, delta[..., 0, :, :], self.base_kernel[0]), delta[..., 1, :, :]

    def finish(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self._convolve(y, delta, self.base_kernel[1])


class DFlash2Layer(DraftLayer):
    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        settings = dflash2_settings(config)
        taps, group = settings["conv_kernel_size"], settings["conv_group_size"]
        self.attention_conv = GroupedDynamicConv(config.hidden_size, taps, group)
        self.mlp_conv = GroupedDynamicConv(config.hidden_size, taps, group)

    def forward(self, x, ctx, rope_block, rope_ctx, positions, attention_mask, cache):
        h, delta = self.attention_conv.prepare(self.input_layernorm(x))
        h = self.self_attn(h, ctx, rope_block, rope_ctx, positions, attention_mask, cache)
        x = x + self.attention_conv.finish(h, delta)
        h, delta = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(h), delta)


class CandidateSelector(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    @torch.no_grad()
    def select(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: int) -> list[int]:
        """hidden [n, H] and logits [n, V] of the n mask slots; the greedy path from ``anchor``.
        A tie goes to the candidate the LM head ranks higher (torch.topk's order)."""
        k = min(self.top_k, logits.shape[-1])
        unary, candidates = logits.float().topk(k, dim=-1)
        projected = self.hidden_projection(hidden).float()
        successors = self.successor_codebook[candidates].float()  # [n, k, r]
        previous = torch.tensor(anchor, device=logits.device)
        path = []
        for slot in range(hidden.shape[0]):
            query = self.predecessor_codebook[previous].float() * projected[slot]
            scores = unary[slot] + successors[slot] @ query
            previous = candidates[slot, scores.argmax()]
            path.append(previous)
        return torch.stack(path).tolist() if path else []
