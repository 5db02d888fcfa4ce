"""A draft checkpoint's files: its safetensors weights, and MiMo's ``mask_embedding.pt``.

``mask_embedding.pt`` is the one pickle file a published draft needs: MiMo's drafts ship the mask
slots' embedding in it (the target's own row for the mask token is near zero, so a draft that
skipped it would propose from a near-zero embedding). It is read with
``torch.load(weights_only=True)``, which unpickles tensors and plain containers only and refuses
anything that would run code; what it holds is then checked (a tensor of the hidden size, or
``{"embedding": tensor, "mask_token_id": id}`` with the config's id).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from .errors import CheckpointError
from .weights import check_safetensors_file, safetensors_files

MASK_EMBEDDING_FILE = "mask_embedding.pt"


def read_weights(directory: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of the draft's ``*.safetensors`` files, names without a ``model.`` prefix, read
    straight onto ``device`` (no copy of the weights in host memory on the way to a GPU)."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in safetensors_files(directory, "draft"):
        check_safetensors_file(file)
        try:
            state.update(load_file(str(file), device=str(torch.device(device))))
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"cannot read {file}: {exc}") from exc
    return {k.removeprefix("model."): v for k, v in state.items()}


def read_mask_embedding(directory: Path, mask_token_id: int, hidden_size: int) -> torch.Tensor | None:
    """The mask slots' embedding [hidden] from ``mask_embedding.pt``, or None without the file."""
    path = directory / MASK_EMBEDDING_FILE
    if not path.is_file():
        return None
    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as exc:
        raise CheckpointError(f"{path} is refused: it is not a plain tensor file that loads without running code "
                              f"({type(exc).__name__})") from None
    if isinstance(value, dict):
        if value.get("mask_token_id", mask_token_id) != mask_token_id:
            raise CheckpointError(f"{path} is for mask_token_id {value.get('mask_token_id')}, the draft config says "
                                  f"{mask_token_id}")
        value = value.get("embedding")
    if not isinstance(value, torch.Tensor) or value.numel() != hidden_size or not value.is_floating_point():
        raise CheckpointError(f"{path} must hold one embedding of {hidden_size} floats")
    return value.reshape(hidden_size)
