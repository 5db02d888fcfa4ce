"""Draft configs copied key by key from published ones, dimensions scaled down to the tiny Qwen3
target of tests/tiny_models.py (hidden 64, 4 heads of 16, 2 KV heads, 4 layers, 96 ids), and
random-weight checkpoints written in each one's published layout."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.draft import DRAFT_CLASSES
from engine.draft_config import config_from_dict

MASK = 95  # the tiny target's last embedding row
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "vocab_size": 96}

PUBLISHED = {
    # z-lab/Qwen3-8B-DFlash-b16: the key set of sgl-project/SpecForge configs/qwen3-8b-dflash.json, with the
    # dflash_config of the z-lab release (vllm-project/speculators tests/unit/convert/test_dflash_converter.py).
    "z-lab Qwen3-8B b16": {
        "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "modeling_dflash.DFlashDraftModel"}, "block_size": 16,
        "bos_token_id": 93, "dtype": "bfloat16", "eos_token_id": 94, "head_dim": 16, "hidden_act": "silu",
        "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
        "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 40960,
        "max_window_layers": 2, "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "num_target_layers": 4, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False, "use_cache": True,
        "use_sliding_window": False, "vocab_size": 96,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 2]},
    },
    # z-lab/gpt-oss-20b-DFlash (b8): the config.json inlined in a public MLX port's drafter test ("as shipped
    # 2026-04-20"), with the yarn rope_scaling that vllm-neuron's test_gpt_oss_dflash_config_translation reads.
    "z-lab gpt-oss-20b b8 (yarn)": {
        "architectures": ["DFlashDraftModel"], "attention_bias": True, "attention_dropout": 0.0, "block_size": 8,
        "bos_token_id": 93, "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 1, 3]},
        "dtype": "bfloat16", "eos_token_id": 94, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
        "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 128,
        "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 150000,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
        "vocab_size": 96,
    },
    # z-lab Qwen3.6-27B draft: layer types [S, S, S, S, F], sliding layers causal with a window (2048 there,
    # 6 here so that it bites), the full layer bidirectional (vLLM vllm/model_executor/models/qwen3_dflash.py
    # docstring; z-lab/dflash commit 1fe684b "Add Draft sliding window"); block_size inside dflash_config.
    "z-lab Qwen3.6-27B (sliding + full)": {
        "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
        "dtype": "bfloat16", "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 128,
        "layer_types": ["sliding_attention"] * 4 + ["full_attention"], "max_position_embeddings": 262144,
        "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 5, "num_key_value_heads": 2,
        "num_target_layers": 4, "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"}, "sliding_window": 6,
        "tie_word_embeddings": False, "use_sliding_window": True, "vocab_size": 96,
        "dflash_config": {"block_size": 8, "mask_token_id": MASK, "target_layer_ids": [0, 1, 2, 3, 3]},
    },
    # z-lab DFlash2 (Qwen3.6-27B): sgl-project/SpecForge configs/qwen3.6-27b-dflash2.json, key for key.
    "DFlash2 Qwen3.6-27B": {
        "architectures": ["DFlash2DraftModel"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": None, "is_causal": False,
        "dflash_config": {"block_size": 8, "conv_group_size": 16, "conv_kernel_size": 2, "mask_token_id": MASK,
                          "selector_rank": 8, "selector_top_k": 16, "target_layer_ids": [0, 1, 2]},
        "dtype": "bfloat16", "eos_token_id": 94, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
        "initializer_range": 0.02, "intermediate_size": 128, "layer_types": ["sliding_attention"] * 3,
        "max_position_embeddings": 262144, "max_window_layers": 3, "model_type": "qwen3",
        "num_attention_heads": 4, "num_hidden_layers": 3, "num_key_value_heads": 2, "num_target_layers": 4,
        "pad_token_id": 94, "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"},
        "sliding_window": 6, "tie_word_embeddings": False, "transformers_version": "5.8.1", "use_cache": True,
        "use_sliding_window": True, "vocab_size": 96,
    },
    # XiaomiMiMo/MiMo-V2.5-DFlash dflash/config.json (revision 1f58446181abcaa01030fdbde835fbd38ae9a2b1): the keys
    # and values a public audit script of that file checks; the repository also ships dflash/mask_embedding.pt
    # ({"mask_token_id", "embedding"}) and per-layer self_attn.attention_sink_bias tensors. No layer_types.
    "MiMo-V2.5 dflash/": {
        "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "partial_rotary_factor": 0.5,
        "block_size": 8, "num_target_layers": 4, "vocab_size": 96, "max_position_embeddings": 262144,
        "rope_theta": 10000, "sliding_window": 6, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
        "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
        "dflash_config": {"target_layer_ids": [0, 1, 2, 3], "mask_token_id": MASK, "block_size": 8, "use_swa": True,
                          "swa_window_size": 6, "backbone_rotary_base": 5000000, "attention_value_scale": 0.612,
                          "attention_sink_bias": True},
    },
    # A draft with its own embed_tokens and lm_head over a smaller draft vocabulary mapped by d2t, narrower
    # than its target, reading target layers by eagle_aux_hidden_state_layer_ids: the keys and weight names
    # vLLM's DFlash drafter reads (vllm/model_executor/models/qwen3_dflash.py: load_weights, compute_logits,
    # _get_dflash_fc_input_size).
    "own vocabulary (d2t, vLLM / EAGLE-3 layout)": {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "vocab_size": 96, "draft_vocab_size": 48, "target_hidden_size": 64, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096, "rope_theta": 10000, "tie_word_embeddings": False, "block_size": 8,
        "eagle_aux_hidden_state_layer_ids": [2, 4],
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [1, 3]},
    },
}


def all_keys(raw: dict) -> set[str]:
    keys = {k for k in raw}
    keys |= {f"dflash_config.{k}" for k in raw.get("dflash_config") or {}}
    return keys


def random_weights(raw: dict, seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """Random weights in the checkpoint's layout (z-lab names, plus d2t / embed_tokens / lm_head and
    the sinks where the form has them), and MiMo's mask embedding (None for other forms)."""
    config, form = config_from_dict(copy.deepcopy(raw))
    own = "draft_vocab_size" in raw
    torch.manual_seed(seed)
    model = DRAFT_CLASSES[form](config, own_embeddings=own, own_head=own)
    state = {}
    for name, tensor in model.state_dict().items():
        if "rotary_emb" in name:
            continue
        if tensor.is_floating_point():
            scale = 1.0 if name.endswith("norm.weight") else 0.3
            state[name] = (torch.randn_like(tensor) * scale + (1.0 if name.endswith("norm.weight") else 0.0))
        else:
            state[name] = tensor
    if model.d2t is not None:  # draft id i -> a distinct target id, as an offset
        targets = torch.randperm(config.vocab_size - 1)[: model.d2t.shape[0]].sort().values
        state["d2t"] = targets - torch.arange(targets.shape[0])
    mask = torch.randn(config.hidden_size) if (raw.get("dflash_config") or {}).get("use_swa") else None
    return state, mask


def write_draft(directory: Path, raw: dict, seed: int = 0, model_prefix: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(raw))
    state, mask = random_weights(raw, seed)
    if model_prefix:
        state = {f"model.{k}" if k not in ("d2t",) and not k.startswith("lm_head") else k: v for k, v in state.items()}
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))
    if mask is not None:
        torch.save({"mask_token_id": MASK, "embedding": mask}, directory / "mask_embedding.pt")
    return directory
