"""Tiny twins of published quantized targets, written to disk in the published layouts
(tests/data/quantized/SOURCES.md) with each one's published ``quantization_config``, and the
dequantization of those layouts written out independently of transformers, to check what it loads.

transformers can only quantize to MXFP4 and FP8 with GPU kernels, so the tensors are encoded here:
each twin's own random weights are rounded to the format, then stored.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.family_twins import family_twin
from tests.tiny_models import tiny_tokenizer

PUBLISHED = json.loads((Path(__file__).parent / "data" / "quantized" / "quantization_configs.json").read_text())

# The e2m1 values of the 16 four-bit codes: sign bit 3, then 2 exponent bits and 1 mantissa bit.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E2M1_CODES = torch.tensor(E2M1 + [-v for v in E2M1])
E4M3_MAX = 448.0
FP8_BLOCK = 128

# name -> (family, published block, twin sizes): sides of the FP8 twins are whole 128-blocks or
# shorter than one block (the KV projections), as in the published checkpoints
QUANTIZED_TWINS = {
    "gpt-oss MXFP4": ("gpt_oss", "openai/gpt-oss-20b", dict(intermediate_size=64)),
    "Qwen3 FP8": ("qwen3", "Qwen/Qwen3-8B-FP8", dict(hidden_size=128, intermediate_size=384, head_dim=32)),
    "MiMo FP8": ("mimo_v2_flash", "XiaomiMiMo/MiMo-V2.5",
                 dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=128, head_dim=32, v_head_dim=32,
                      n_routed_experts=4, num_experts_per_tok=2)),
}


def to_mxfp4(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., n]`` floats -> (blocks ``[..., n/32, 16]`` uint8, scales ``[..., n/32]`` uint8): one
    power-of-two scale per 32 values, the smallest that fits the block's largest value under 6."""
    groups = rows.float().reshape(*rows.shape[:-1], rows.shape[-1] // 32, 32)
    largest = groups.abs().amax(-1, keepdim=True).clamp_min(2.0 ** -100)
    exponent = torch.ceil(torch.log2(largest / 6.0))
    scaled = groups / torch.exp2(exponent)
    magnitude = (scaled.abs().unsqueeze(-1) - torch.tensor(E2M1)).abs().argmin(-1)
    codes = (magnitude | ((scaled < 0).long() << 3)).to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), (exponent.squeeze(-1) + 127).to(torch.uint8)


def from_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The published MXFP4 layout back to float32 ``[..., n]``, element by element."""
    low, high = (blocks & 0x0F).long(), (blocks >> 4).long()
    values = torch.stack([E2M1_CODES[low], E2M1_CODES[high]], dim=-1).reshape(*blocks.shape[:-1], 32)
    values = values * torch.exp2(scales.float() - 127.0).unsqueeze(-1)
    return values.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


def to_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[out, in]`` -> (float8_e4m3fn weight, float32 ``weight_scale_inv`` per 128x128 block,
    the last block of a side partial): each block's largest value maps to e4m3's largest, 448."""
    rows, cols = weight.shape
    scale = torch.empty(-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
    stored = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            block = weight[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK].float()
            scale[i, j] = block.abs().max().clamp_min(1e-12) / E4M3_MAX
            stored[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK] = (
                block / scale[i, j]).to(torch.float8_e4m3fn)
    return stored, scale


def from_fp8(stored: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """Each stored value times the ``weight_scale_inv`` of its 128x128 block, in float32."""
    expanded = scale_inv.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)
    return stored.float() * expanded[: stored.shape[0], : stored.shape[1]]


def skipped(name: str, settings: dict) -> bool:
    """Left in full precision: embeddings, the head, norms, routers, and the published skip list."""
    module = name.removesuffix(".weight")
    listed = settings.get("ignored_layers") or settings.get("modules_to_not_convert") or []
    return (any(part in name for part in ("embed_tokens", "lm_head", "norm", "mlp.gate.")) or module in listed)


def write_quantized_twin(root: Path, name: str, quantized: bool = True, **overrides) -> Path:
    """The twin ``name`` of ``QUANTIZED_TWINS`` saved under ``root`` in its published layout
    (``quantized=False``: the same weights saved unquantized, as a reference)."""
    family, published, sizes = QUANTIZED_TWINS[name]
    settings = json.loads(json.dumps(PUBLISHED[published]))
    tokenizer = tiny_tokenizer()
    # an embedding padded past the tokenizer, as Qwen3's: the folder is a pair the CLI can run
    target = family_twin(family, **{"vocab_size": len(tokenizer) + 16, **sizes, **overrides})
    if "ignored_layers" in settings:  # the published list names every layer's o_proj: the twin's own layers
        settings["ignored_layers"] = [f"model.layers.{i}.self_attn.o_proj"
                                      for i in range(target.config.num_hidden_layers)]
    root = Path(root)
    target.save_pretrained(root, safe_serialization=True)  # transformers writes the published key layout
    tokenizer.save_pretrained(root)
    if not quantized:
        return root
    tensors = load_file(root / "model.safetensors")
    for key in list(tensors):
        value = tensors[key]
        if settings["quant_method"] == "mxfp4" and key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # in memory [experts, in, out]; stored by output rows, [experts, out, in/32, 16]
            tensors[key + "_blocks"], tensors[key + "_scales"] = to_mxfp4(tensors.pop(key).transpose(1, 2))
        elif settings["quant_method"] == "fp8" and key.endswith(".weight") and value.dim() == 2 and not skipped(
                key, settings):
            tensors[key], tensors[key + "_scale_inv"] = to_fp8(value)
    for path in root.glob("model*.safetensors*"):
        path.unlink()
    save_file(tensors, root / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((root / "config.json").read_text())
    config["quantization_config"] = settings
    (root / "config.json").write_text(json.dumps(config, indent=2))
    return root


def expected_weights(root: Path) -> dict[str, torch.Tensor]:
    """Every weight of the loaded model as the stored tensors define it, dequantized here: MXFP4
    experts as ``[experts, in, out]``, FP8 experts fused as transformers holds them (gate and up
    stacked by rows), everything stored unquantized as it is."""
    stored = load_file(Path(root) / "model.safetensors")
    weights: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}
    for key, value in stored.items():
        if key.endswith(("_scales", "_scale_inv")):
            continue
        if key.endswith("_blocks"):
            scales = stored[key.replace("_blocks", "_scales")]
            weights[key.removesuffix("_blocks")] = from_mxfp4(value, scales).transpose(1, 2)  # [experts, in, out]
            continue
        tensor = from_fp8(value, stored[key + "_scale_inv"]) if key + "_scale_inv" in stored else value.float()
        parts = key.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            at = parts.index("experts")
            experts.setdefault(".".join(parts[: at + 1] + parts[at + 2:]), {})[int(parts[at + 1])] = tensor
            continue
        weights[key.replace("attention_sink_bias", "sinks")] = tensor  # renamed by transformers at load
    for key, by_expert in experts.items():  # model.layers.L.mlp.experts.gate_proj.weight -> fused
        ordered = torch.stack([by_expert[e] for e in sorted(by_expert)])
        experts_at = key.rsplit(".", 2)[0]
        projection = key.rsplit(".", 2)[1]
        if projection == "down_proj":
            weights[f"{experts_at}.down_proj"] = ordered
        else:
            weights.setdefault(f"{experts_at}.gate_up_proj", {})[projection] = ordered
    for key, value in list(weights.items()):
        if isinstance(value, dict):
            weights[key] = torch.cat([value["gate_proj"], value["up_proj"]], dim=1)
    return weights
