"""Capture the target's hidden states at ``target_layer_ids`` with forward hooks, so that
no forward has to materialise every layer (``output_hidden_states=True`` would)."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


def decoder_layers(target: nn.Module) -> nn.ModuleList:
    """The decoder layer list of a transformers causal LM (``model.layers`` in Qwen/Llama)."""
    base = target.get_decoder() if hasattr(target, "get_decoder") else getattr(target, "model", target)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise TypeError(f"cannot find decoder layers in {type(target).__name__}")
    return layers


def final_norm(target: nn.Module) -> nn.Module | None:
    base = target.get_decoder() if hasattr(target, "get_decoder") else getattr(target, "model", target)
    return getattr(base, "norm", None)


class FeatureCapture:
    """Hooks on the chosen decoder layers; ``take()`` returns their outputs concatenated on the
    last dimension, [b, n, k*H], and clears them.

    transformers (5.x) reports ``hidden_states[-1]`` AFTER the final norm, so for the last layer
    we apply the norm too: drafts trained on ``output_hidden_states`` then see the same tensor.
    """

    def __init__(self, target: nn.Module, layer_ids: list[int]):
        self.layers = decoder_layers(target)
        self.layer_ids = list(layer_ids)
        self.last_layer = len(self.layers) - 1
        self.norm = final_norm(target)
        self.enabled = True
        self._outputs: dict[int, torch.Tensor] = {}
        self._handles = []

    def _hook(self, layer_id: int):
        def hook(_module, _args, output):
            if self.enabled:
                hidden = output[0] if isinstance(output, tuple) else output
                self._outputs[layer_id] = hidden

        return hook

    def attach(self) -> "FeatureCapture":
        for layer_id in sorted(set(self.layer_ids)):
            self._handles.append(self.layers[layer_id].register_forward_hook(self._hook(layer_id)))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._outputs.clear()

    def clear(self) -> None:
        """Drop what the hooks hold (a reply that ended mid-cycle)."""
        self._outputs.clear()

    def take(self) -> torch.Tensor:
        parts = []
        for layer_id in self.layer_ids:
            hidden = self._outputs[layer_id]
            if layer_id == self.last_layer and self.norm is not None:
                hidden = self.norm(hidden)
            parts.append(hidden)
        self._outputs.clear()
        return torch.cat(parts, dim=-1)


@contextmanager
def capture_hidden(target: nn.Module, layer_ids: list[int]):
    """``with capture_hidden(target, ids) as cap: target(x); feats = cap.take()``."""
    capture = FeatureCapture(target, layer_ids).attach()
    try:
        yield capture
    finally:
        capture.detach()


@torch.no_grad()
def target_features(target: nn.Module, input_ids: torch.Tensor, layer_ids: list[int], **kwargs) -> tuple[torch.Tensor, object]:
    """One target forward; returns (features [b, n, k*H], the model output)."""
    with capture_hidden(target, layer_ids) as capture:
        output = target(input_ids=input_ids, **kwargs)
        return capture.take(), output
