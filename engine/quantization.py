"""Targets published quantized: gpt-oss stores its experts in MXFP4, Qwen3-FP8 and MiMo store
their linear layers in block-wise ("fine-grained") FP8. Such a target loads through transformers'
own quantizers, chosen by the ``quantization_config`` in its config.json:

- where this device computes in the stored format (a CUDA GPU with the compute capability the
  format needs and the ``kernels`` package that fetches transformers' Triton kernels), the weights
  stay quantized;
- elsewhere (a CPU, an older GPU, no ``kernels``) they are dequantized at load and then widened to
  the compute dtype, so that every matmul runs in one dtype. transformers itself dequantizes MXFP4
  to bf16 whatever the compute dtype, and on a GPU without ``kernels`` it would keep FP8 weights
  whose forward then fails on the first token, so the choice is made here, not left to it.

A format that cannot load on this device is refused before any weight is read, in one line that
names it and what would load it. ``pair_bytes`` gives what a quantized pair takes stored and once
loaded, for the figures a user sees before a download.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import UnsupportedQuantizationError

MXFP4_BLOCK = 32  # elements sharing one e8m0 scale byte
MXFP4_BYTES = (4 + 8 / MXFP4_BLOCK) / 8  # 4-bit elements plus one scale byte per block: 4.25 bits
FP8_BYTES = 1.0  # per element; the scales (4 bytes per 128x128 block) add 0.02 % and are left out
BF16_BYTES = 2.0

ELSEWHERE = "--engine vllm on a GPU (a vLLM server that loads it)"


@dataclass(frozen=True)
class Format:
    """A stored format this engine loads: its name for people, bytes per stored weight, and the
    CUDA compute capability from which transformers computes in it directly."""

    method: str  # quantization_config.quant_method
    name: str
    stored_bytes: float
    native_capability: tuple[int, int]


FORMATS = {
    "mxfp4": Format("mxfp4", "MXFP4", MXFP4_BYTES, (7, 5)),  # transformers' Triton MXFP4 kernels
    "fp8": Format("fp8", "block-wise FP8", FP8_BYTES, (8, 9)),  # FP8 tensor cores: Ada, Hopper and newer
}


@dataclass(frozen=True)
class DeviceKernels:
    """What decides whether a device computes in a stored format: its type, its CUDA compute
    capability, and whether the ``kernels`` package (which fetches transformers' Triton kernels
    for MXFP4 and FP8) is installed."""

    device_type: str
    capability: tuple[int, int] | None = None
    kernels_installed: bool = False


@dataclass(frozen=True)
class TargetQuantization:
    """How a quantized target loads here."""

    format: Format
    dequantized: bool  # True: widened to the compute dtype at load (no kernel for it on this device)

    def describe(self, dtype: torch.dtype) -> str:
        """"MXFP4, dequantized to float32 at load" or "block-wise FP8, computed in FP8"."""
        if self.dequantized:
            return f"{self.format.name}, dequantized to {str(dtype).removeprefix('torch.')} at load"
        return f"{self.format.name}, computed in {self.format.name}"


def quantization_settings(config: dict) -> dict | None:
    """The ``quantization_config`` of a target's config.json (top level, or in its text config)."""
    for holder in (config, config.get("text_config") or {}):
        settings = holder.get("quantization_config")
        if settings:
            return settings
    return None


def runs_natively(fmt: Format, kernels: DeviceKernels) -> bool:
    return (kernels.device_type == "cuda" and kernels.kernels_installed and kernels.capability is not None
            and tuple(kernels.capability) >= fmt.native_capability)


def plan_quantization(config: dict, kernels: DeviceKernels) -> TargetQuantization | None:
    """How the target of ``config`` (its config.json as a dict) loads on a device with
    ``kernels``: None for a target stored unquantized; ``UnsupportedQuantizationError`` for a
    format this engine cannot load, naming it and what would load it."""
    settings = quantization_settings(config)
    if settings is None:
        return None
    method = str(settings.get("quant_method", "unknown")).lower()
    if method not in FORMATS:
        raise UnsupportedQuantizationError(
            f"the target is stored in {method} quantization, which this engine does not load (it loads "
            f"MXFP4 and block-wise FP8); run it with {ELSEWHERE}, or use an unquantized checkpoint")
    model_type = config.get("model_type", "unknown")
    if method == "mxfp4" and model_type != "gpt_oss":
        # transformers' MXFP4 loader replaces gpt-oss's expert module and no other
        raise UnsupportedQuantizationError(
            f"the target stores MXFP4 weights in a {model_type} model; transformers loads MXFP4 for gpt-oss "
            f"only; run it with {ELSEWHERE}")
    if method == "fp8" and str(settings.get("store_dtype", "fp8")).lower() != "fp8":
        # MiMo-V2.5-Pro-FP4 keeps its experts in MXFP4 inside an FP8 config (store_dtype "mxfp4", scales
        # named weight_scale): no transformers quantizer reads that layout
        raise UnsupportedQuantizationError(
            f"the target stores its experts as {settings['store_dtype']} inside block-wise FP8 "
            f"(quantization_config.store_dtype), which transformers cannot load; run it with {ELSEWHERE}")
    if method == "fp8" and not settings.get("weight_block_size"):
        raise UnsupportedQuantizationError(
            "the target is stored in per-tensor FP8 (quant_method fp8 without weight_block_size); this engine "
            f"loads block-wise FP8 only; run it with {ELSEWHERE}")
    fmt = FORMATS[method]
    return TargetQuantization(fmt, dequantized=not runs_natively(fmt, kernels))


def device_kernels(device: torch.device) -> DeviceKernels:
    """The facts ``plan_quantization`` needs about ``device``, asked of torch and the installation."""
    import importlib.util

    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return DeviceKernels(device.type, capability, importlib.util.find_spec("kernels") is not None)


def loading_config(settings: dict, plan: TargetQuantization):
    """The transformers quantization config to load with: the checkpoint's own settings (its
    skip lists included: MiMo's ``ignored_layers`` are read as ``modules_to_not_convert``), with
    ``dequantize`` set as planned. Passed explicitly so that transformers neither guesses nor warns."""
    from transformers import FineGrainedFP8Config, Mxfp4Config

    loader = Mxfp4Config if plan.format.method == "mxfp4" else FineGrainedFP8Config
    return loader.from_dict({**settings, "dequantize": plan.dequantized})


def check_dequantizable(directory: Path, settings: dict, plan: TargetQuantization) -> None:
    """transformers' FP8 dequantizer takes the block size from the grid of scales (side //
    blocks), which is right for whole blocks and for a side shorter than one block, but cuts a
    side with a last partial block into wrong blocks: 192 rows in two 128-row blocks are read as
    two blocks of 96, silently, and 320 as an error with a page of report. Refused here in one
    line, from the safetensors headers alone, before any weight is read."""
    if plan.format.method != "fp8" or not plan.dequantized:
        return
    from safetensors import safe_open

    rows_block, cols_block = (int(side) for side in settings["weight_block_size"])
    for path in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            names = set(handle.keys())
            for name in sorted(names):
                if not name.endswith("weight_scale_inv") or name.removesuffix("_scale_inv") not in names:
                    continue
                shape = handle.get_slice(name.removesuffix("_scale_inv")).get_shape()
                if len(shape) >= 2 and (partial(shape[-2], rows_block) or partial(shape[-1], cols_block)):
                    raise UnsupportedQuantizationError(
                        f"the target's block-wise FP8 weight {name.removesuffix('_scale_inv')} is "
                        f"{shape[-2]}x{shape[-1]}, not whole {rows_block}x{cols_block} blocks, and transformers "
                        f"cannot dequantize it on a device without FP8 kernels; run it with {ELSEWHERE}")


def partial(side: int, block: int) -> bool:
    """More than one block along ``side``, the last one not whole."""
    return side > block and side % block != 0


def widen_to(model, dtype: torch.dtype) -> None:
    """Cast the weights dequantization left in another dtype (transformers writes MXFP4 as bf16;
    tensors it renames while dequantizing FP8 keep their stored dtype) to ``dtype``, leaving in
    fp32 what transformers keeps in fp32 for an unquantized load in ``dtype``: the modules a model
    lists in ``_keep_in_fp32_modules_strict`` under fp16 or bf16, and ``_keep_in_fp32_modules``
    under fp16. The loaded model then computes in the dtypes its unquantized twin would."""
    keep = set()
    if dtype in (torch.float16, torch.bfloat16):
        keep |= set(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if dtype == torch.float16:
        keep |= set(getattr(model, "_keep_in_fp32_modules", None) or ())
    with torch.no_grad():
        for module_name, module in model.named_modules():
            for name, tensor in list(module.named_parameters(recurse=False)):
                wanted = torch.float32 if keep.intersection(f"{module_name}.{name}".split(".")) else dtype
                if tensor.is_floating_point() and tensor.dtype != wanted:
                    setattr(module, name, torch.nn.Parameter(tensor.to(wanted), requires_grad=False))


@contextlib.contextmanager
def quiet_transformers():
    """transformers' MXFP4 loader warns on every CPU load that it dequantizes "to bf16", which is
    not what happens here (``widen_to`` follows); its warnings are held back while it loads."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


@dataclass(frozen=True)
class PairBytes:
    stored: float  # on disk: what a download takes
    loaded: float  # the weights once loaded


def pair_bytes(quantized_parameters: float, other_parameters: float, draft_parameters: float,
               method: str | None, kept_quantized: bool, compute_bytes: float = BF16_BYTES,
               stored_other_bytes: float = BF16_BYTES) -> PairBytes:
    """What a pair's weights take stored and once loaded, in bytes. ``quantized_parameters`` are
    the target's weights in the stored format ``method`` ("mxfp4", "fp8"; None: unquantized);
    ``other_parameters`` the rest of the target (embeddings, attention, norms, stored in bf16 as
    published); the draft is stored in bf16. Loaded: as stored where the device computes in the
    format (``kept_quantized``), else every weight in ``compute_bytes``. Weights only: the KV
    cache and activations come on top. gpt-oss-20b (19.1e9 expert weights in MXFP4, 1.8e9 others)
    takes 13.8 GB stored and 41.8 GB dequantized to bf16."""
    fmt = FORMATS.get(method) if method else None
    per_weight = fmt.stored_bytes if fmt else stored_other_bytes
    stored_target = quantized_parameters * per_weight + other_parameters * stored_other_bytes
    stored = stored_target + draft_parameters * BF16_BYTES
    if fmt is not None and kept_quantized:
        loaded_target = quantized_parameters * fmt.stored_bytes + other_parameters * compute_bytes
    else:
        loaded_target = (quantized_parameters + other_parameters) * compute_bytes
    return PairBytes(stored, loaded_target + draft_parameters * compute_bytes)
