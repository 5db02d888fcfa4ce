"""Checks on weight files before any library reads them, and guards while a model runs.

- ``check_safetensors_file``: a safetensors file is an 8-byte header length, a JSON header
  naming each tensor's dtype, shape and byte range, then the bytes. A truncated download, a
  header that does not add up, or a bloated header is refused here with the file's name, before
  transformers or safetensors turn it into an obscure error (or a crash).
- ``guard_logits``: the safetensors format does not check values, and fp16/bf16 can overflow;
  a forward hook on the output layer turns NaN/inf logits into ``NonFiniteLogitsError``, which
  ends the reply with an error (the text so far is kept).
- ``explain_failures``: an out-of-memory error mid-reply ends it with advice, and the cached
  blocks are released so that the next request can run.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from .errors import CheckpointError, NonFiniteLogitsError
from .events import Failed

HEADER_LIMIT = 100 * 1024 * 1024  # safetensors' own cap
MAX_TENSORS = 200_000
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}
OOM_ADVICE = ("out of memory while generating: the reply so far is kept. Lower max new tokens, send a shorter "
              "prompt or start a new session (a long conversation fills the cache), or load the model in a "
              "smaller dtype or on a bigger device")


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def safetensors_files(directory: Path, what: str) -> list[Path]:
    """The ``*.safetensors`` files of a checkpoint folder; a folder with only pickle weights (or
    none) is refused: DFlash Studio never unpickles (loading a pickle can run any code)."""
    files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    if files:
        return files
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES) if directory.is_dir() else []
    if pickles:
        raise CheckpointError(f"{what} in {directory} has only pickle weights ({', '.join(pickles)}); "
                              "DFlash Studio loads safetensors only, never pickle")
    raise CheckpointError(f"no *.safetensors weights in {what} directory {directory}")


def check_safetensors_file(path: Path) -> None:
    """Refuse a truncated or inconsistent safetensors file with a message naming it and why."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise CheckpointError(f"corrupt weights: {path} is {size} bytes, too short to be safetensors")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > HEADER_LIMIT or header_len > size - 8:
            raise CheckpointError(f"corrupt weights: {path} declares a {header_len}-byte header in a {size}-byte "
                                  "file (truncated, or not safetensors)")
        try:
            header = json.loads(handle.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"corrupt weights: the header of {path} is not valid JSON ({exc})") from None
    if not isinstance(header, dict) or len(header) > MAX_TENSORS:
        raise CheckpointError(f"corrupt weights: the header of {path} is not a table of at most {MAX_TENSORS} tensors")
    data_size = size - 8 - header_len
    end = _check_tensors(path, header, data_size)
    if end < data_size:
        raise CheckpointError(f"corrupt weights: {path} has {data_size - end} bytes no tensor accounts for")


def _check_tensors(path: Path, header: dict, data_size: int) -> int:
    ranges = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        problem = _tensor_problem(info, data_size)
        if problem:
            raise CheckpointError(f"corrupt weights: tensor {name!r} in {path}: {problem}")
        ranges.append((info["data_offsets"][0], info["data_offsets"][1], name))
    ranges.sort()
    position = 0
    for start, stop, name in ranges:
        if start != position:
            raise CheckpointError(f"corrupt weights: tensor {name!r} in {path} starts at byte {start}, expected "
                                  f"{position} (overlapping or missing data)")
        position = stop
    return position


def _tensor_problem(info, data_size: int) -> str:
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        return "its entry lacks dtype, shape or data_offsets"
    offsets, shape = info["data_offsets"], info["shape"]
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) and o >= 0 for o in offsets)
            or offsets[1] < offsets[0]):
        return f"bad data_offsets {offsets!r}"
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        return f"bad shape {shape!r}"
    width = DTYPE_BYTES.get(info["dtype"])
    if width is None:
        return f"unknown dtype {info['dtype']!r}"
    if offsets[1] > data_size:
        return f"its bytes end at {offsets[1]} but the file holds {data_size} (truncated file)"
    if offsets[1] - offsets[0] != math.prod(shape) * width:
        return f"shape {shape} of {info['dtype']} needs {math.prod(shape) * width} bytes, the file gives " \
               f"{offsets[1] - offsets[0]}"
    return ""


def check_weight_files(directory: Path) -> None:
    for path in sorted(Path(directory).glob("*.safetensors")):
        check_safetensors_file(path)


def guard_logits(model) -> None:
    """Raise ``NonFiniteLogitsError`` from the output layer when its logits hold NaN or inf."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        return

    def check(module, inputs, output):
        # One fp32 sum is NaN/inf exactly when some logit is (finite logits cannot overflow it):
        # 40 us against 800 us for isfinite().all() on [8, 8192] logits, ~8 % of a cycle on CPU.
        total = output.sum() if output.dtype == torch.float32 else output.float().sum()
        if not bool(torch.isfinite(total)):
            raise NonFiniteLogitsError(
                "numerical error: the model produced NaN/inf logits, so the reply stops here (its text so far is "
                "kept). Weights with NaN/inf values or an fp16/bf16 overflow cause this: try --dtype float32")

    head.register_forward_hook(check)


def explain_failures(events, device=None):
    """Pass ``events`` through; an out-of-memory ``Failed`` gets advice and frees the cached memory."""
    for event in events:
        if isinstance(event, Failed) and event.kind in ("OutOfMemoryError", "MemoryError"):
            _release_memory(device)
            event = Failed(kind=event.kind, message=f"{OOM_ADVICE} ({event.message})")
        yield event


def _release_memory(device) -> None:
    import gc

    import torch

    gc.collect()
    if device is not None and getattr(device, "type", "") == "cuda":
        torch.cuda.empty_cache()
