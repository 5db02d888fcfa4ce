"""The DFlash draft model, in the z-lab checkpoint format, and the published forms around it.

A small stack of Qwen3-style decoder layers (engine/draft_layers.py). Its input is the embedding
of the block ``[anchor, MASK, ...]`` (the target's table, or the draft's own ``embed_tokens``;
MiMo's drafts replace the mask row by ``mask_embedding.pt``); the target's hidden states at
``target_layer_ids`` are fused (``hidden_norm(fc(concat))``) and injected as extra keys/values
into every layer ("KV injection"). Queries come from the block only; context K/V are cached
(after k_norm and RoPE), block K/V are transient. Proposals come from the target's LM head or the
draft's own (``draft_vocab_size`` rows mapped to target ids by ``d2t``). ``DFlash2DraftModel``
adds convolutions and a candidate selector (engine/draft_dflash2.py). What each config key
does: engine/draft_config.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from .draft_config import draft_setting, read_draft_config
from .draft_dflash2 import CandidateSelector, DFlash2Layer, dflash2_settings
from .draft_files import read_mask_embedding, read_weights
from .draft_layers import DraftCache, DraftLayer, DraftRotaryEmbedding
from .errors import CheckpointError

DRAFT_ARCHITECTURE = "DFlashDraftModel"


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The z-lab rule: one target layer per draft layer, spread over the target's depth."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


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


# What older and non-Llama configs call the same settings (GPT-2's n_inner, OPT's ffn_dim, LayerNorm
# epsilons, GPT-2's n_positions); the draft is a Qwen3 stack whatever the target's own layers are.
# A target with none (an MoE's experts are narrower) gets 3 x hidden, the published drafts' ratio.
_FFN_SIZES = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")
_NORM_EPSILONS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "norm_epsilon")
_CONTEXT_LENGTHS = ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length")


def _setting(config, names: tuple[str, ...], default):
    """The first of ``names`` the config sets (not None), else ``default``. A setting that varies
    by layer (a heterogeneous config: Gemma 4's head_dim) is read from the first full-attention
    layer, which is what every draft layer is."""
    per_layer = getattr(config, "per_layer_attributes", None) or set()
    for name in names:
        source = config
        if name in per_layer:
            kinds = getattr(config, "layer_types", None) or []
            source = config.per_layer_config[kinds.index("full_attention") if "full_attention" in kinds else 0]
        value = getattr(source, name, None)
        if value is not None and not isinstance(value, (list, dict)):
            return value
    return default


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
    head_dim = _setting(text_config, ("head_dim",), None) or text_config.hidden_size // text_config.num_attention_heads
    rope = getattr(text_config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    if isinstance(rope.get("full_attention"), dict):  # per layer kind (Gemma 3, MiMo): draft layers are full
        rope = rope["full_attention"]
    hidden = text_config.hidden_size
    config = Qwen3Config(
        vocab_size=text_config.vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate_size or _setting(text_config, _FFN_SIZES, 3 * hidden),
        num_hidden_layers=num_layers,
        num_attention_heads=text_config.num_attention_heads,
        num_key_value_heads=_setting(text_config, ("num_key_value_heads",), text_config.num_attention_heads),
        head_dim=head_dim,
        rms_norm_eps=float(_setting(text_config, _NORM_EPSILONS, 1e-6)),
        max_position_embeddings=_setting(text_config, _CONTEXT_LENGTHS, 32768),
        rope_parameters=dict(rope),
        tie_word_embeddings=False,
        layer_types=["full_attention"] * num_layers,
    )
    config.architectures = [DRAFT_ARCHITECTURE]
    config.block_size = block_size
    config.num_target_layers = n_target
    config.dflash_config = {"mask_token_id": int(mask_token_id), "target_layer_ids": layer_ids}
    return config


def feature_layer_ids(config) -> list[int]:
    """The target layers whose outputs feed the draft. ``eagle_aux_hidden_state_layer_ids``
    (vLLM's convention: the input of layer L, that is the output of layer L-1) is read first,
    then ``target_layer_ids`` (layer outputs, z-lab's convention); two lists that disagree are
    refused rather than one of them silently winning."""
    ids = draft_setting(config, "target_layer_ids")
    aux = getattr(config, "eagle_aux_hidden_state_layer_ids", None)
    if aux:
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 1 for i in aux):
            raise CheckpointError(f"draft config: eagle_aux_hidden_state_layer_ids {aux} must be layer numbers >= 1 "
                                  "(the input of layer 0, the embeddings, is not captured)")
        from_aux = [i - 1 for i in aux]
        if ids and [int(i) for i in ids] != from_aux:
            raise CheckpointError(f"draft config: eagle_aux_hidden_state_layer_ids {aux} (layer inputs) and "
                                  f"target_layer_ids {ids} (layer outputs) name different target layers")
        return from_aux
    if not ids:
        raise CheckpointError("draft config has no dflash_config.target_layer_ids")
    return [int(i) for i in ids]


def draft_vocab_size(config) -> int:
    value = getattr(config, "draft_vocab_size", None)
    return int(value) if value else int(config.vocab_size)


class DFlashDraftModel(nn.Module):
    """Weights are named exactly as in z-lab checkpoints (no ``model.`` prefix). ``own_embeddings``
    / ``own_head``: the checkpoint ships ``embed_tokens`` / ``lm_head`` (used instead of the
    target's); ``mask_embedding``: it ships a separate embedding for the mask slots."""

    form = "dflash"

    def __init__(self, config: Qwen3Config, own_embeddings: bool = False, own_head: bool = False,
                 mask_embedding: bool = False):
        super().__init__()
        self.config = config
        self.target_layer_ids: list[int] = feature_layer_ids(config)
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
        hidden = config.hidden_size
        self.layers = nn.ModuleList(self.make_layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        target_width = int(getattr(config, "target_hidden_size", None) or hidden)
        self.fc = nn.Linear(len(self.target_layer_ids) * target_width, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary_emb = DraftRotaryEmbedding(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if own_embeddings else None
        self.lm_head = nn.Linear(hidden, draft_vocab_size(config), bias=False) if own_head else None
        self._own_head_checks(config, own_head)
        # d2t[i]: target id of draft id i minus i (EAGLE-3 / vLLM layout); persistent: it is in the weights
        mapped = draft_vocab_size(config) != config.vocab_size
        self.register_buffer("d2t", torch.zeros(draft_vocab_size(config), dtype=torch.long) if mapped else None)
        self.mask_embedding = nn.Parameter(torch.zeros(hidden)) if mask_embedding else None

    def make_layer(self, config, index: int) -> nn.Module:
        return DraftLayer(config, index)

    def _own_head_checks(self, config, own_head: bool) -> None:
        if draft_vocab_size(config) != config.vocab_size and not own_head:
            raise CheckpointError(f"draft config sets draft_vocab_size {draft_vocab_size(config)} but the weights "
                                  "have no lm_head with that many rows")
        if own_head and (self.proposal_ids is not None or self.proposal_vocab_size is not None):
            raise CheckpointError("draft config: proposal_ids / proposal_vocab_size narrow the target's head; this "
                                  "draft has its own lm_head")

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
        """The block's embeddings: the draft's own table when it has one, else the target's; the
        mask slots take ``mask_embedding`` when the checkpoint ships one."""
        table = self.embed_tokens.weight if self.embed_tokens is not None else target_embedding.weight
        embedded = F.embedding(ids, table)
        if self.mask_embedding is not None:
            mask = (ids == self.mask_token_id).unsqueeze(-1)
            embedded = torch.where(mask, self.mask_embedding.to(embedded.dtype), embedded)
        return embedded * self.input_embedding_scale

    def compute_logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Logits over the target's whole vocabulary (what training fits): from the draft's own
        head when it has one (draft ids mapped to target ids by ``d2t``, -inf at ids it cannot
        propose), else from the target's."""
        if self.lm_head is None:
            return self._scale(lm_head(hidden))
        logits = self._scale(self.lm_head(hidden))
        if self.d2t is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        full[..., self.target_ids()] = logits
        return full

    def target_ids(self) -> torch.Tensor:
        """The target id of each draft id (``d2t`` is an offset: target = draft + d2t[draft])."""
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    def draft_tokens(self, hidden: torch.Tensor, anchor: int, lm_head: nn.Module) -> tuple[list[int], torch.Tensor]:
        """(the proposals, their logits [n, V]) for the n mask slots' hidden states: the argmax
        of each slot (``DFlash2DraftModel`` walks its candidate selector instead)."""
        logits = self.proposal_logits(hidden, lm_head)
        return logits.argmax(dim=-1).tolist(), logits

    def proposal_logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Logits over the whole vocabulary for proposing drafts. With ``proposal_vocab_size`` K
        only ids below K can be proposed (-inf elsewhere): the head multiplies by K rows of the
        target's embedding instead of all of them. On a CPU the full table falls out of the
        cache (8,192 x 256 floats: 8 MB, about 2 ms for a block against 0.2-0.6 ms for the first
        2,048-4,096 rows), and a byte-level BPE numbers its tokens by merge order, so the
        first ids are the frequent ones. With ``proposal_ids`` only those ids can be proposed.
        Lossless either way: the target still emits any token."""
        if self.lm_head is not None:
            return self.compute_logits(hidden, lm_head)
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


class DFlash2DraftModel(DFlashDraftModel):
    """DFlash2: every layer's attention and MLP wrapped by a grouped dynamic convolution, and a
    candidate selector that walks a greedy path through each slot's top-k tokens."""

    form = "dflash2"

    def __init__(self, config: Qwen3Config, **own):
        settings = dflash2_settings(config)
        super().__init__(config, **own)
        if settings["conv_kernel_size"] > self.block_size:
            raise CheckpointError(f"DFlash2 draft config: conv_kernel_size {settings['conv_kernel_size']} exceeds "
                                  f"block_size {self.block_size}")
        self.candidate_selector = CandidateSelector(config.hidden_size, config.vocab_size,
                                                    settings["selector_rank"], settings["selector_top_k"])

    def make_layer(self, config, index: int) -> nn.Module:
        return DFlash2Layer(config, index)

    def draft_tokens(self, hidden: torch.Tensor, anchor: int, lm_head: nn.Module) -> tuple[list[int], torch.Tensor]:
        logits = self.proposal_logits(hidden, lm_head)
        return self.candidate_selector.select(hidden, logits, anchor), logits


DRAFT_CLASSES = {"dflash": DFlashDraftModel, "dflash2": DFlash2DraftModel}


# ---------------------------------------------------------------------------------------------
# z-lab checkpoint format: config.json (Qwen3 config + DFlash keys) and *.safetensors.
# ---------------------------------------------------------------------------------------------


def save_draft(draft: DFlashDraftModel, directory: str | Path) -> Path:
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = draft.config.to_dict()
    config["architectures"] = [type(draft).__name__]
    config["model_type"] = "qwen3"
    config["block_size"] = draft.block_size
    config.setdefault("dflash_config", {})
    config["dflash_config"].update(
        {"mask_token_id": draft.mask_token_id, "target_layer_ids": list(draft.target_layer_ids)}
    )
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in draft.state_dict().items() if "rotary_emb" not in k}
    mask = state.pop("mask_embedding", None)
    if mask is not None:  # the MiMo layout: a separate file next to the weights
        torch.save({"mask_token_id": draft.mask_token_id, "embedding": mask}, directory / "mask_embedding.pt")
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def load_draft(directory: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> DFlashDraftModel:
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"draft directory not found: {directory}")
    config, form = read_draft_config(directory)
    state = read_weights(directory, device)
    t2d = state.pop("t2d", None)  # the inverse of d2t (a flag per target id), checked against it below
    mask = read_mask_embedding(directory, int(draft_setting(config, "mask_token_id", -1)), config.hidden_size)
    if mask is not None:
        state["mask_embedding"] = mask
    own_embeddings = "embed_tokens.weight" in state
    if own_embeddings and "lm_head.weight" not in state and config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    with torch.device(device):  # built where it runs: its random weights are replaced below, not copied into
        draft = DRAFT_CLASSES[form](config, own_embeddings=own_embeddings, own_head="lm_head.weight" in state,
                                    mask_embedding=mask is not None)
    expected = {k for k in draft.state_dict() if "rotary_emb" not in k}
    missing = sorted(expected - state.keys())
    unexpected = sorted(state.keys() - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"draft weights in {directory} do not match its config: "
            f"missing {missing[:5]}{'…' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
        )
    for name, tensor in draft.state_dict().items():
        if name in state and state[name].shape != tensor.shape:
            raise CheckpointError(f"draft weight {name} has shape {tuple(state[name].shape)}, config implies {tuple(tensor.shape)}")
    draft.load_state_dict(in_dtype({k: v for k, v in state.items() if k in expected}, dtype), strict=False,
                          assign=True)  # the tensors read become the parameters: one copy of the weights
    if draft.d2t is not None or t2d is not None:
        check_d2t(draft, t2d)
    return place_draft(draft, device, dtype)


def in_dtype(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Floating tensors cast to ``dtype`` (integer maps such as d2t kept), each once: a tied
    embedding and head stay one tensor."""
    cast: dict[int, torch.Tensor] = {}
    for value in state.values():
        if id(value) not in cast:
            cast[id(value)] = value.to(dtype) if value.is_floating_point() else value
    return {name: cast[id(value)] for name, value in state.items()}


def check_d2t(draft: DFlashDraftModel, t2d: torch.Tensor | None) -> None:
    if draft.d2t is None:
        raise CheckpointError("draft weights hold t2d but no d2t and no draft_vocab_size: a mapping with nothing to map")
    targets = draft.target_ids()
    if int(targets.min()) < 0 or int(targets.max()) >= draft.config.vocab_size or targets.unique().numel() != targets.numel():
        raise CheckpointError("draft weights: d2t maps draft ids outside the target vocabulary or two onto one")
    if t2d is not None:
        expected = torch.zeros(draft.config.vocab_size, dtype=torch.bool, device=targets.device)
        expected[targets] = True
        if t2d.shape != expected.shape or not torch.equal(t2d.bool(), expected):
            raise CheckpointError("draft weights: t2d does not mark exactly the target ids d2t maps to")


def place_draft(draft: DFlashDraftModel, device, dtype: torch.dtype) -> DFlashDraftModel:
    """Move to device/dtype (the d2t mapping stays integer), keeping RoPE frequencies in fp32 (as
    transformers does)."""
    draft = draft.to(device=device, dtype=dtype).eval()
    draft.rotary_emb = DraftRotaryEmbedding(draft.config).to(device)
    return draft
