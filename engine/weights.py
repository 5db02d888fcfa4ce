"""Checks on weight files before any library reads them, and guards while a model runs.

- ``check_safetensors_file``: safetensors' own reader checks the header (its length, JSON, each
  tensor's dtype, shape and byte range, the file covering them exactly) without loading a
  tensor; a truncated download or a header that does not add up is refused here with the file's
  name and the reason in plain words, before transformers turns it into an obscure error.
- ``guard_logits``: the safetensors format does not check values, and fp16/bf16 can overflow;
  a forward hook on the output layer turns NaN/inf logits into ``NonFiniteLogitsError``, which
  ends the reply with an error (the text so far is kept).
- ``explain_failures``: an out-of-memory error mid-reply ends it with advice, and the cached
  blocks are released so that the next request can run.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError, safe_open

from .errors import CheckpointError, NonFiniteLogitsError
from .events import Failed

# safetensors' reasons (SafetensorError messages) in the words a user can act on
HEADER_PROBLEMS = {
    "incomplete metadata": "truncated (an interrupted download?) or followed by bytes no tensor accounts for",
    "header too large": "the header length does not fit the file (truncated, or not safetensors)",
    "header too small": "too short to be safetensors",
    "invalid JSON": "the header is not valid JSON",
    "invalid offset": "tensor byte ranges overlapping or leaving gaps",
    "invalid shape": "a tensor's shape and dtype do not match its bytes",
}
OOM_ADVICE = ("out of memory while generating: the reply so far is kept. Lower max new tokens, send a shorter "
              "prompt or start a new session (a long conversation fills the cache), or load the model in a "
              "smaller dtype or on a bigger device")


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def safetensors_files(directory: Path, what: str) -> list[Path]:
    """The ``*.safetensors`` files of a checkpoint folder; a folder with only pickle weights (or
    none) is refused: weights are never unpickled (loading a pickle can run any code). The one
    .pt file read is a MiMo draft's small mask embedding, with ``weights_only`` (engine.draft_files)."""
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
    try:
        with safe_open(str(path), framework="pt") as handle:  # reads and checks the header only
            handle.keys()
    except SafetensorError as exc:
        reason = str(exc).removeprefix("Error while deserializing header: ")
        words = next((plain for key, plain in HEADER_PROBLEMS.items() if key in reason), "not a safetensors file")
        raise CheckpointError(f"corrupt weights: {path}: {words} ({reason})") from None


def check_weight_files(directory: Path) -> None:
    for path in sorted(Path(directory).glob("*.safetensors")):
        check_safetensors_file(path)


def guard_logits(model) -> None:
    """Raise ``NonFiniteLogitsError`` from the output layer when its logits hold NaN or inf."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        return

    def check(module, inputs, output):
        check_finite_logits(output)

    head.register_forward_hook(check)


def check_finite_logits(logits) -> None:
    """``guard_logits``'s check, for a pass that runs without hooks (a compiled one)."""
    import torch

    # One fp32 sum is NaN/inf exactly when some logit is (finite logits cannot overflow it):
    # 40 us against 800 us for isfinite().all() on [8, 8192] logits, ~8 % of a cycle on CPU.
    total = logits.sum() if logits.dtype == torch.float32 else logits.float().sum()
    if not bool(torch.isfinite(total)):
        raise NonFiniteLogitsError(
            "numerical error: the model produced NaN/inf logits, so the reply stops here (its text so far is "
            "kept). Weights with NaN/inf values or an fp16/bf16 overflow cause this: try --dtype float32")


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
