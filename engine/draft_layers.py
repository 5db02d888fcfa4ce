"""The draft's decoder layers: Qwen3 layers whose attention takes extra keys/values from the
target's features ("KV injection"), with the variants published drafts use: sliding windows,
causal or bidirectional blocks, a learned per-head attention sink, a value scale and rotary on
part of each head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding

from .draft_config import draft_setting
from .errors import CheckpointError


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [b, heads, n, d]; cos/sin: [b, n, r] with r <= d: the first r channels of each head
    rotate (``partial_rotary_factor``), the rest pass through."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)
    rot, rest = x[..., :r], x[..., r:]
    return torch.cat([rot * cos.unsqueeze(1) + rotate_half(rot) * sin.unsqueeze(1), rest], dim=-1)


class DraftRotaryEmbedding(Qwen3RotaryEmbedding):
    """Qwen3's rotary embedding, with ``partial_rotary_factor`` honoured for plain RoPE too
    (Qwen3's own default ignores it; yarn and the other scaled kinds already read it)."""

    @staticmethod
    def compute_default_rope_parameters(config, device=None, seq_len=None) -> tuple[torch.Tensor, float]:
        base = config.rope_parameters["rope_theta"]
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
        return inv_freq, 1.0


class DraftCache:
    """Context keys/values per draft layer (after k_norm and RoPE), positions [0, length)."""

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[-2]

    def key_positions(self, count: int, device) -> torch.Tensor:
        return torch.arange(count, device=device)

    def visible_keys(self) -> None:
        """Every cached key is visible (``StaticDraftCache`` masks its padding)."""
        return None

    def run(self, draft, noise: torch.Tensor, context: torch.Tensor, start: int) -> torch.Tensor:
        """One draft pass with the new ``context`` features before the block at start.. ."""
        positions = torch.arange(start - context.shape[1], start + noise.shape[1], device=noise.device)[None]
        return draft(noise, context, positions, cache=self)

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=-2)
            v = torch.cat([self.values[layer], v], dim=-2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


def sliding_causal_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, causal: bool, window: int | None) -> torch.Tensor:
    """Boolean [Q, K] visibility for sliding-window layers (True = visible)."""
    q = query_pos[:, None]
    k = key_pos[None, :]
    visible = torch.ones(q.shape[0], k.shape[1], dtype=torch.bool, device=query_pos.device)
    if causal:
        visible &= k <= q
    if window is not None:
        visible &= (q - k) < window
        if not causal:
            visible &= (k - q) < window
    return visible


def layer_attention(config, layer_idx: int) -> tuple[int | None, bool]:
    """(sliding window or None, causal inside the block) for one draft layer, read as vLLM reads it:
    - causality: ``is_causal``, then ``dflash_config.causal``, else sliding layers causal, full not;
    - window: sliding layers per ``layer_types``; with ``use_swa`` and no sliding layer listed
      (MiMo's drafts have no ``layer_types``), every layer; size ``dflash_config.swa_window_size``
      or ``sliding_window``."""
    extra = getattr(config, "dflash_config", None) or {}
    layer_types = getattr(config, "layer_types", None) or []
    any_sliding = "sliding_attention" in layer_types
    use_swa = bool(extra.get("use_swa", False))
    listed_sliding = bool(layer_types) and layer_types[layer_idx] == "sliding_attention"
    sliding = listed_sliding or (use_swa and not any_sliding)
    window = None
    if sliding:
        window = extra.get("swa_window_size") or getattr(config, "sliding_window", None)
        if not window:
            raise CheckpointError("draft config: a sliding layer needs dflash_config.swa_window_size or sliding_window")
    forced = getattr(config, "is_causal", None)
    if forced is None:
        forced = extra.get("causal")
    causal = listed_sliding if forced is None else bool(forced)
    return (int(window) if window else None), causal


def attention_sink_enabled(config) -> bool:
    extra = getattr(config, "dflash_config", None) or {}
    value = extra.get("attention_sink_bias")
    if value is None:
        value = getattr(config, "add_swa_attention_sink_bias", None) or getattr(config, "attention_sink_bias", None)
    return bool(value)


class DraftAttention(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.sliding_window, self.is_causal = layer_attention(config, layer_idx)
        # MiMo: a learned logit per head that joins every softmax denominator (attends to nothing)
        self.attention_sink_bias = nn.Parameter(torch.zeros(self.num_heads)) if attention_sink_enabled(config) else None
        self.value_scale = float(draft_setting(config, "attention_value_scale", 1.0))

    def _heads(self, x: torch.Tensor, proj: nn.Linear, n_heads: int) -> torch.Tensor:
        b, n, _ = x.shape
        return proj(x).view(b, n, n_heads, self.head_dim)

    def forward(self, x, ctx, rope_block, rope_ctx, positions, attention_mask, cache: DraftCache | None):
        b, q_len, _ = x.shape
        q = self.q_norm(self._heads(x, self.q_proj, self.num_heads)).transpose(1, 2)
        k_blk = self.k_norm(self._heads(x, self.k_proj, self.num_kv_heads)).transpose(1, 2)
        v_blk = self._heads(x, self.v_proj, self.num_kv_heads).transpose(1, 2) * self.value_scale
        k_ctx = self.k_norm(self._heads(ctx, self.k_proj, self.num_kv_heads)).transpose(1, 2)
        v_ctx = self._heads(ctx, self.v_proj, self.num_kv_heads).transpose(1, 2) * self.value_scale
        q = apply_rope(q, *rope_block)
        k_blk = apply_rope(k_blk, *rope_block)
        k_ctx = apply_rope(k_ctx, *rope_ctx)
        if cache is not None:
            k_ctx, v_ctx = cache.extend(self.layer_idx, k_ctx, v_ctx)
        k = torch.cat([k_ctx, k_blk], dim=-2)
        v = torch.cat([v_ctx, v_blk], dim=-2)
        mask = attention_mask
        visible = cache.visible_keys() if cache is not None else None  # a static cache's filled positions
        if mask is None and (self.is_causal or self.sliding_window is not None):
            ctx_len = k_ctx.shape[-2]
            query_pos, block_key_pos = positions[1], positions[1]
            ctx_key_pos = cache.key_positions(ctx_len, x.device) if cache is not None else positions[0]
            key_pos = torch.cat([ctx_key_pos, block_key_pos])
            mask = sliding_causal_mask(query_pos, key_pos, self.is_causal, self.sliding_window)[None, None]
        if visible is not None:
            keys = torch.cat([visible, visible.new_ones(q_len)])[None, None, None]
            mask = keys if mask is None else mask & keys
        if self.attention_sink_bias is not None:
            out = self._attend_with_sink(q, k, v, mask)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=self.scaling, enable_gqa=self.num_kv_heads != self.num_heads
            )
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))

    def _attend_with_sink(self, q, k, v, mask):
        """softmax over [scores, sink] with the sink's column dropped after: the sink takes a share
        of each row's weight and gives back nothing (SDPA has no sink input)."""
        groups = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(-1, -2)).float() * self.scaling
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        sink = self.attention_sink_bias.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        return weights.to(v.dtype) @ v


class DraftLayer(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.self_attn = DraftAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, ctx, rope_block, rope_ctx, positions, attention_mask, cache):
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope_block, rope_ctx, positions, attention_mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))
