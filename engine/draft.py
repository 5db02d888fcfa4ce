"""The DFlash draft model, in the z-lab checkpoint format.

A small stack of Qwen3-style decoder layers with no embedding table and no LM head: it borrows
the target's. Its input is the target's embedding of the block ``[anchor, MASK, ...]``; the
target's hidden states at ``target_layer_ids`` are fused (``hidden_norm(fc(concat))``) and
injected as extra keys/values into every layer ("KV injection"). Queries come from the block
only; context K/V are cached (after k_norm and RoPE), block K/V are transient.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding

from .errors import CheckpointError
from .weights import check_safetensors_file, safetensors_files

DRAFT_ARCHITECTURE = "DFlashDraftModel"


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The z-lab rule: one target layer per draft layer, spread over the target's depth."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def draft_setting(config, name: str, default=None):
    """A DFlash key from ``dflash_config`` first, then the top level (z-lab v1 puts block_size there)."""
    extra = getattr(config, "dflash_config", None) or {}
    if name in extra and extra[name] is not None:
        return extra[name]
    return getattr(config, name, default)


def proposal_vocab_size(config) -> int | None:
    """``dflash_config.proposal_vocab_size``: drafts proposed from ids below it only (None: all)."""
    value = draft_setting(config, "proposal_vocab_size")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= config.vocab_size:
        raise CheckpointError(f"draft config: proposal_vocab_size must be an integer from 1 to the vocabulary "
                              f"size {config.vocab_size} (got {value!r})")
    return value


def proposal_ids(config) -> list[int] | None:
    """``dflash_config.proposal_ids``: the only ids drafts are proposed from, chosen by how often
    the target writes them (None: see ``proposal_vocab_size``). A target fine-tuned on new text
    writes words that a BPE numbered late, and a draft that cannot propose a token loses the
    block there; this keeps the head as cheap as a prefix of the same size."""
    value = draft_setting(config, "proposal_ids")
    if value is None:
        return None
    if draft_setting(config, "proposal_vocab_size") is not None:
        raise CheckpointError("draft config: set proposal_ids or proposal_vocab_size, not both")
    if (not isinstance(value, list) or not value
            or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < config.vocab_size for i in value)
            or len(set(value)) != len(value)):
        raise CheckpointError(f"draft config: proposal_ids must be a non-empty list of distinct token ids below "
                              f"the vocabulary size {config.vocab_size}")
    return sorted(value)


def new_draft_config(
    target_config,
    num_layers: int,
    block_size: int,
    mask_token_id: int,
    target_layer_ids: list[int] | None = None,
    intermediate_size: int | None = None,
) -> Qwen3Config:
    """A draft config shaped like the target (same hidden size, heads and RoPE)."""
    text_config = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    n_target = text_config.num_hidden_layers
    layer_ids = list(target_layer_ids) if target_layer_ids is not None else default_target_layer_ids(n_target, num_layers)
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    rope = getattr(text_config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    config = Qwen3Config(
        vocab_size=text_config.vocab_size,
        hidden_size=text_config.hidden_size,
        intermediate_size=intermediate_size or text_config.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=text_config.num_attention_heads,
        num_key_value_heads=text_config.num_key_value_heads,
        head_dim=head_dim,
        rms_norm_eps=text_config.rms_norm_eps,
        max_position_embeddings=text_config.max_position_embeddings,
        rope_parameters=dict(rope),
        tie_word_embeddings=False,
        layer_types=["full_attention"] * num_layers,
    )
    config.architectures = [DRAFT_ARCHITECTURE]
    config.block_size = block_size
    config.num_target_layers = n_target
    config.dflash_config = {"mask_token_id": int(mask_token_id), "target_layer_ids": layer_ids}
    return config


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [b, heads, n, d]; cos/sin: [b, n, d]."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


class DraftCache:
    """Context keys/values per draft layer (after k_norm and RoPE), positions [0, length)."""

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[-2]

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
        layer_types = getattr(config, "layer_types", None)
        layer_type = layer_types[layer_idx] if layer_types else "full_attention"
        sliding = layer_type == "sliding_attention"
        forced_causal = getattr(config, "is_causal", None)
        # z-lab/SGLang default: sliding layers are causal with a window, full layers bidirectional.
        self.is_causal = sliding if forced_causal is None else bool(forced_causal)
        self.sliding_window = getattr(config, "sliding_window", None) if sliding else None

    def _heads(self, x: torch.Tensor, proj: nn.Linear, n_heads: int) -> torch.Tensor:
        b, n, _ = x.shape
        return proj(x).view(b, n, n_heads, self.head_dim)

    def forward(self, x, ctx, rope_block, rope_ctx, positions, attention_mask, cache: DraftCache | None):
        b, q_len, _ = x.shape
        q = self.q_norm(self._heads(x, self.q_proj, self.num_heads)).transpose(1, 2)
        k_blk = self.k_norm(self._heads(x, self.k_proj, self.num_kv_heads)).transpose(1, 2)
        v_blk = self._heads(x, self.v_proj, self.num_kv_heads).transpose(1, 2)
        k_ctx = self.k_norm(self._heads(ctx, self.k_proj, self.num_kv_heads)).transpose(1, 2)
        v_ctx = self._heads(ctx, self.v_proj, self.num_kv_heads).transpose(1, 2)
        q = apply_rope(q, *rope_block)
        k_blk = apply_rope(k_blk, *rope_block)
        k_ctx = apply_rope(k_ctx, *rope_ctx)
        if cache is not None:
            k_ctx, v_ctx = cache.extend(self.layer_idx, k_ctx, v_ctx)
        k = torch.cat([k_ctx, k_blk], dim=-2)
        v = torch.cat([v_ctx, v_blk], dim=-2)
        mask = attention_mask
        if mask is None and (self.is_causal or self.sliding_window is not None):
            ctx_len = k_ctx.shape[-2]
            query_pos, block_key_pos = positions[1], positions[1]
            ctx_key_pos = torch.arange(ctx_len, device=x.device) if cache is not None else positions[0]
            key_pos = torch.cat([ctx_key_pos, block_key_pos])
            mask = sliding_causal_mask(query_pos, key_pos, self.is_causal, self.sliding_window)[None, None]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=self.scaling, enable_gqa=self.num_kv_heads != self.num_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


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


class DFlashDraftModel(nn.Module):
    """Weights are named exactly as in z-lab checkpoints (no ``model.`` prefix)."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        layer_ids = draft_setting(config, "target_layer_ids")
        if not layer_ids:
            raise CheckpointError("draft config has no dflash_config.target_layer_ids")
        self.target_layer_ids: list[int] = [int(i) for i in layer_ids]
        self.block_size = int(draft_setting(config, "block_size", 16))
        mask_id = draft_setting(config, "mask_token_id")
        if mask_id is None:
            raise CheckpointError("draft config has no dflash_config.mask_token_id")
        self.mask_token_id = int(mask_id)
        self.input_embedding_scale = float(draft_setting(config, "input_embedding_scale", 1.0) or 1.0)
        self.output_multiplier = float(draft_setting(config, "output_multiplier", 1.0) or 1.0)
        self.logit_softcap = draft_setting(config, "final_logit_softcapping")
        self.proposal_vocab_size = proposal_vocab_size(config)
        ids = proposal_ids(config)
        # not persistent: the checkpoint's weights stay exactly the z-lab set
        self.register_buffer("proposal_ids", torch.tensor(ids, dtype=torch.long) if ids else None, persistent=False)
        self._proposal_rows: tuple | None = None  # (which head, its rows at proposal_ids)
        self.layers = nn.ModuleList(DraftLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.fc = nn.Linear(len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)

    def new_cache(self) -> DraftCache:
        return DraftCache(len(self.layers))

    def forward(
        self,
        noise_embedding: torch.Tensor,
        target_hidden: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: DraftCache | None = None,
    ) -> torch.Tensor:
        """noise_embedding [b, Q, H] (block embeddings), target_hidden [b, C, k*H] (new context
        features), position_ids [b, C+Q] (context positions, then block positions);
        attention_mask: optional bool [b, 1, Q, K] over keys (cached context, new context, block)."""
        ctx = self.hidden_norm(self.fc(target_hidden))
        c = target_hidden.shape[1]
        cos, sin = self.rotary_emb(noise_embedding, position_ids)
        rope_ctx, rope_block = (cos[:, :c], sin[:, :c]), (cos[:, c:], sin[:, c:])
        positions = (position_ids[0, :c], position_ids[0, c:])
        h = noise_embedding
        for layer in self.layers:
            h = layer(h, ctx, rope_block, rope_ctx, positions, attention_mask, cache)
        return self.norm(h)

    def embed(self, target_embedding: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, target_embedding.weight) * self.input_embedding_scale

    def compute_logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Logits over the whole vocabulary (what training fits)."""
        return self._scale(lm_head(hidden))

    def proposal_logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Logits over the whole vocabulary for proposing drafts. With ``proposal_vocab_size`` K
        only ids below K can be proposed (-inf elsewhere): the head multiplies by K rows of the
        target's embedding instead of all of them. On a CPU the full table falls out of the
        cache (8,192 x 256 floats: 8 MB, about 2 ms for a block against 0.2-0.6 ms for the first
        2,048-4,096 rows), and a byte-level BPE numbers its tokens by merge order, so the
        first ids are the frequent ones. With ``proposal_ids`` only those ids can be proposed.
        Lossless either way: the target still emits any token."""
        if self.proposal_ids is not None:
            weight, bias = self._head_rows(lm_head)
            head = self._scale(F.linear(hidden, weight, bias))
            logits = head.new_full((*head.shape[:-1], lm_head.weight.shape[0]), float("-inf"))
            logits[..., self.proposal_ids] = head
            return logits
        k = self.proposal_vocab_size
        vocab = lm_head.weight.shape[0]
        if k is None or k >= vocab:
            return self.compute_logits(hidden, lm_head)
        bias = lm_head.bias[:k] if getattr(lm_head, "bias", None) is not None else None
        head = self._scale(F.linear(hidden, lm_head.weight[:k], bias))
        logits = head.new_full((*head.shape[:-1], vocab), float("-inf"))
        logits[..., :k] = head
        return logits

    def _head_rows(self, lm_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head's rows at ``proposal_ids``, gathered once per head (a gather per block would
        copy as much memory as the prefix slice avoids); gathered again if the head changes."""
        weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
        key = (weight.data_ptr(), weight._version, weight.dtype, weight.device)
        if self._proposal_rows is None or self._proposal_rows[0] != key:
            ids = self.proposal_ids.to(weight.device)
            rows = (weight.detach().index_select(0, ids),
                    bias.detach().index_select(0, ids) if bias is not None else None)
            self._proposal_rows = (key, rows)
        return self._proposal_rows[1]

    def _scale(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits * self.output_multiplier
        if self.logit_softcap:
            cap = float(self.logit_softcap)
            logits = torch.tanh(logits / cap) * cap
        return logits


# ---------------------------------------------------------------------------------------------
# z-lab checkpoint format: config.json (Qwen3 config + DFlash keys) and model.safetensors.
# ---------------------------------------------------------------------------------------------


def save_draft(draft: DFlashDraftModel, directory: str | Path) -> Path:
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = draft.config.to_dict()
    config["architectures"] = [DRAFT_ARCHITECTURE]
    config["model_type"] = "qwen3"
    config["block_size"] = draft.block_size
    config.setdefault("dflash_config", {})
    config["dflash_config"].update(
        {"mask_token_id": draft.mask_token_id, "target_layer_ids": list(draft.target_layer_ids)}
    )
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in draft.state_dict().items() if "rotary_emb" not in k}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def read_draft_config(directory: Path) -> Qwen3Config:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"no config.json in draft directory {directory}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"draft config {path} is not valid JSON: {exc}") from exc
    arch = raw.get("architectures") or []
    if arch and not any("DFlash" in a for a in arch):
        raise CheckpointError(f"{directory} is not a DFlash draft (architectures: {arch})")
    if "DFlash2DraftModel" in arch:
        raise CheckpointError("DFlash2 drafts (candidate selector, convolutions) are not supported yet")
    extras = mimo_sink_extras(raw)
    if extras:
        raise CheckpointError(
            f"{directory} is a MiMo attention-sink draft ({', '.join(extras)}): its learned per-head sink and "
            "value scale change the attention this engine computes, so it is not supported (its output would be "
            "wrong, not just slower); use a draft without them")
    for key in ("auto_map", "transformers_version", "model_type"):
        raw.pop(key, None)
    return Qwen3Config(**raw)


MIMO_EXTRA_KEYS = ("attention_sink_bias", "attention_value_scale")


def mimo_sink_extras(raw: dict) -> list[str]:
    """The MiMo DFlash extras a draft config turns on (top level or in ``dflash_config``): a
    learned attention sink (``attention_sink_bias: true``) or a value scale other than 1."""
    found = []
    for where in (raw, raw.get("dflash_config") or {}):
        if not isinstance(where, dict):
            continue
        sink, scale = where.get("attention_sink_bias"), where.get("attention_value_scale")
        if sink not in (None, False, 0) and "attention_sink_bias" not in found:
            found.append("attention_sink_bias")
        if scale not in (None, 1, 1.0) and "attention_value_scale" not in found:
            found.append("attention_value_scale")
    return found


def load_draft(directory: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> DFlashDraftModel:
    from safetensors.torch import load_file

    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"draft directory not found: {directory}")
    config = read_draft_config(directory)
    state: dict[str, torch.Tensor] = {}
    for file in safetensors_files(directory, "draft"):
        check_safetensors_file(file)
        try:
            state.update(load_file(str(file)))
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"cannot read {file}: {exc}") from exc
    state = {k.removeprefix("model."): v for k, v in state.items()}
    sinks = sorted(k for k in state if "sink" in k)
    if sinks:
        raise CheckpointError(f"draft weights in {directory} hold attention-sink tensors ({sinks[0]}, …): a MiMo "
                              "attention-sink draft, which this engine does not support")
    draft = DFlashDraftModel(config)
    expected = {k for k in draft.state_dict() if "rotary_emb" not in k}
    missing = sorted(expected - state.keys())
    unexpected = sorted(k for k in state.keys() - expected if not k.startswith(("embed_tokens", "lm_head")))
    if missing or unexpected:
        raise CheckpointError(
            f"draft weights in {directory} do not match its config: "
            f"missing {missing[:5]}{'…' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
        )
    for name, tensor in draft.state_dict().items():
        if name in state and state[name].shape != tensor.shape:
            raise CheckpointError(f"draft weight {name} has shape {tuple(state[name].shape)}, config implies {tuple(tensor.shape)}")
    draft.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    return place_draft(draft, device, dtype)


def place_draft(draft: DFlashDraftModel, device, dtype: torch.dtype) -> DFlashDraftModel:
    """Move to device/dtype, keeping RoPE frequencies in fp32 (as transformers does)."""
    draft = draft.to(device=device, dtype=dtype).eval()
    draft.rotary_emb = Qwen3RotaryEmbedding(draft.config).to(device)
    return draft
