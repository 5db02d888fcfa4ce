"""Twins of the published pairs: each built from the configs in tests/published_configs (the
published files, kept verbatim where a public copy exists) with only the sizes shrunk (layers,
widths, heads, experts, vocabulary, windows, and the layer indices that follow the depth),
written as checkpoints in the published layout, and loaded through the real loading path.

    twin = write_twin(CATALOG_CONFIGS["Qwen3-8B + z-lab DFlash b16"], tmp_path)
    models = load_models(EngineConfig(target=str(twin.target), draft=str(twin.draft), device="cpu"))
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.tiny_models import tiny_tokenizer

CONFIGS = Path(__file__).resolve().parent / "published_configs"

# catalog name -> (target folder, draft folder) under tests/published_configs
CATALOG_CONFIGS = {
    "Qwen3-8B + z-lab DFlash b16": ("Qwen__Qwen3-8B", "z-lab__Qwen3-8B-DFlash-b16"),
    "Qwen3-4B + z-lab DFlash b16": ("Qwen__Qwen3-4B", "z-lab__Qwen3-4B-DFlash-b16"),
    "Qwen3-Coder-30B-A3B + z-lab DFlash": ("Qwen__Qwen3-Coder-30B-A3B-Instruct", "z-lab__Qwen3-Coder-30B-A3B-DFlash"),
    "Llama-3.1-8B-Instruct + z-lab DFlash": ("meta-llama__Llama-3.1-8B-Instruct",
                                             "z-lab__LLaMA3.1-8B-Instruct-DFlash-UltraChat"),
    "gpt-oss-20b + z-lab DFlash": ("openai__gpt-oss-20b", "z-lab__gpt-oss-20b-DFlash"),
    "gpt-oss-120b + z-lab DFlash": ("openai__gpt-oss-120b", "z-lab__gpt-oss-120b-DFlash"),
    "Qwen3-Coder-Next + z-lab DFlash": ("Qwen__Qwen3-Coder-Next", "z-lab__Qwen3-Coder-Next-DFlash"),
    "Qwen3.5-4B + z-lab DFlash": ("Qwen__Qwen3.5-4B", "z-lab__Qwen3.5-4B-DFlash"),
    "Qwen3.5-9B + z-lab DFlash": ("Qwen__Qwen3.5-9B", "z-lab__Qwen3.5-9B-DFlash"),
    "Qwen3.5-27B + z-lab DFlash": ("Qwen__Qwen3.5-27B", "z-lab__Qwen3.5-27B-DFlash"),
    "Qwen3.5-35B-A3B + z-lab DFlash": ("Qwen__Qwen3.5-35B-A3B", "z-lab__Qwen3.5-35B-A3B-DFlash"),
    "Qwen3.6-27B + z-lab DFlash": ("Qwen__Qwen3.6-27B", "z-lab__Qwen3.6-27B-DFlash"),
    "Qwen3.6-35B-A3B + z-lab DFlash": ("Qwen__Qwen3.6-35B-A3B", "z-lab__Qwen3.6-35B-A3B-DFlash"),
    "MiMo-V2.5 + its own DFlash": ("XiaomiMiMo__MiMo-V2.5-DFlash", "XiaomiMiMo__MiMo-V2.5-DFlash__dflash"),
    "MiMo-V2.5-Pro-FP4 + its own DFlash": ("XiaomiMiMo__MiMo-V2.5-Pro-FP4-DFlash",
                                           "XiaomiMiMo__MiMo-V2.5-Pro-FP4-DFlash__dflash"),
}

TARGET_LAYERS = 4
WINDOW = 6  # windows shrink too, so that a short reply passes them
EXPERTS, EXPERTS_PER_TOKEN = 4, 2
# shrunk sizes, by key, for targets and drafts alike
SIZES = {
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "v_head_dim": 16, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "num_experts": EXPERTS, "num_local_experts": EXPERTS, "n_routed_experts": EXPERTS,
    "num_experts_per_tok": EXPERTS_PER_TOKEN, "experts_per_token": EXPERTS_PER_TOKEN,
}
NOT_SIZES = ("quantization_config",)  # a quantised target is loaded and tested apart; its twin is stored in full


def read_config(folder: str) -> dict:
    return json.loads((CONFIGS / folder / "config.json").read_text())


def is_verbatim(folder: str) -> bool:
    return (CONFIGS / folder / "SOURCE.md").read_text().startswith("VERBATIM")


def shrink_layers(kinds: list, count: int) -> list:
    """The first ``count`` layer kinds, ending with the last kind the model has (so that every
    kind stays present: [S, F] * 12 -> [S, F, S, F]; [L, L, L, F] * 12 -> [L, L, L, F])."""
    kept = list(kinds[:count])
    if kinds and kinds[-1] not in kept:
        kept[-1] = kinds[-1]
    return kept


def shrink_ids(ids: list[int], layers: int, to: int) -> list[int]:
    return [min(to - 1, int(i) * to // layers) for i in ids]


def shrink_common(config: dict, vocab: int) -> dict:
    out = copy.deepcopy(config)
    for key in NOT_SIZES:
        out.pop(key, None)
    for key, value in SIZES.items():
        if out.get(key):  # a size of 0 (no shared expert) stays 0
            out[key] = value
    out["vocab_size"] = vocab
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in out:
            out[key] = None
    if out.get("sliding_window"):
        out["sliding_window"] = WINDOW
    if "max_window_layers" in out and out.get("num_hidden_layers"):
        out["max_window_layers"] = min(out["max_window_layers"], out["num_hidden_layers"])
    return out


def shrink_target(config: dict, vocab: int) -> dict:
    out = shrink_common(config, vocab)
    layers = out["num_hidden_layers"]
    out["num_hidden_layers"] = TARGET_LAYERS
    out["max_window_layers"] = TARGET_LAYERS if "max_window_layers" in out else None
    if out["max_window_layers"] is None:
        out.pop("max_window_layers")
    for key in ("layer_types", "mlp_layer_types"):
        if out.get(key):
            out[key] = shrink_layers(out[key], TARGET_LAYERS)
    if out.get("mlp_layer_types"):
        out["mlp_layer_types"][0] = config["mlp_layer_types"][0]
    assert layers >= TARGET_LAYERS
    return out


def shrink_draft(config: dict, vocab: int, target_layers: int) -> dict:
    out = shrink_common(config, vocab)
    nested = out.get("dflash_config") or {}
    for where in (out, nested):
        if "target_layer_ids" in where:
            where["target_layer_ids"] = shrink_ids(where["target_layer_ids"], target_layers, TARGET_LAYERS)
        if "num_target_layers" in where:
            where["num_target_layers"] = TARGET_LAYERS
        if "mask_token_id" in where:
            where["mask_token_id"] = vocab - 1
        if where.get("swa_window_size"):
            where["swa_window_size"] = WINDOW
    if out.get("target_hidden_size"):
        out["target_hidden_size"] = SIZES["hidden_size"]
    return out


@dataclass
class Twin:
    name: str
    target: Path
    draft: Path
    block_size: int
    target_config: dict
    draft_config: dict


def write_target(config: dict, directory: Path, tokenizer, seed: int = 0) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    values = dict(config)
    model_type = values.pop("model_type")
    values.pop("architectures", None)
    values.pop("transformers_version", None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **values)).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # clear winners: greedy comparisons without near-ties
    model.generation_config.eos_token_id = None
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)


def write_draft(config: dict, directory: Path, seed: int = 1) -> None:
    from engine.draft import DRAFT_CLASSES
    from engine.draft_config import config_from_dict

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    parsed, form = config_from_dict(copy.deepcopy(config))
    nested = config.get("dflash_config") or {}
    torch.manual_seed(seed)
    model = DRAFT_CLASSES[form](parsed, mask_embedding=bool(nested.get("use_swa")))
    state = {}
    for name, tensor in model.state_dict().items():
        if "rotary_emb" in name:
            continue
        norm = name.endswith("norm.weight")
        state[name] = torch.randn_like(tensor) * (0.1 if norm else 0.3) + (1.0 if norm else 0.0)
    mask = state.pop("mask_embedding", None)
    if mask is not None:  # MiMo's layout: the mask slots' embedding in its own file
        torch.save({"mask_token_id": int(nested["mask_token_id"]), "embedding": mask}, directory / "mask_embedding.pt")
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))


def twin_configs(name: str, vocab: int) -> tuple[dict, dict]:
    target_folder, draft_folder = CATALOG_CONFIGS[name]
    target = read_config(target_folder)
    draft = read_config(draft_folder)
    return shrink_target(target, vocab), shrink_draft(draft, vocab, target["num_hidden_layers"])


def write_twin(name: str, root: Path) -> Twin:
    """target/ and draft/ under ``root`` for the catalog pair ``name``."""
    tokenizer = tiny_tokenizer()
    vocab = len(tokenizer) + 16  # a padded embedding, as the published ones are: the mask row lies past the tokenizer
    target_config, draft_config = twin_configs(name, vocab)
    write_target(target_config, root / "target", tokenizer)
    write_draft(draft_config, root / "draft")
    nested = draft_config.get("dflash_config") or {}
    block = int(nested.get("block_size") or draft_config.get("block_size") or 16)
    return Twin(name, root / "target", root / "draft", block, target_config, draft_config)
