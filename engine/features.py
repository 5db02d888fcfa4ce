"""Capture the target's hidden states at ``target_layer_ids`` with forward hooks, so that
no forward has to materialise every layer (``output_hidden_states=True`` would)."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


# Where causal LMs keep their decoder stack and its final norm: Llama-style ``model.layers`` and
# ``model.norm``; GPT-2, Falcon, BLOOM, GPT-J and CodeGen ``transformer.h`` and ``ln_f``; GPT-NeoX
# ``final_layer_norm``; Phi ``final_layernorm``; MPT ``blocks`` and ``norm_f``; OPT ``model.decoder``.
_LAYER_LISTS = ("layers", "h", "blocks")
_FINAL_NORMS = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f")


def _decoder(target: nn.Module) -> tuple[nn.Module, nn.ModuleList] | None:
    """The module that holds the decoder layers, and the layer list."""
    candidates = [target.get_decoder() if hasattr(target, "get_decoder") else None,
                  getattr(target, "model", None), getattr(target, "base_model", None), target]
    seen: list[nn.Module] = []
    while candidates:
        base = candidates.pop(0)
        if not isinstance(base, nn.Module) or any(base is s for s in seen):
            continue
        seen.append(base)
        for name in _LAYER_LISTS:
            layers = getattr(base, name, None)
            if isinstance(layers, nn.ModuleList) and len(layers):
                return base, layers
        # one level down: Llama 4's ``get_decoder()`` is the causal LM itself, OPT's ``model.decoder``
        candidates += [getattr(base, "model", None), getattr(base, "decoder", None)]
    return None


def decoder_layers(target: nn.Module) -> nn.ModuleList:
    """The decoder layer list of a transformers causal LM (``model.layers`` in Qwen/Llama)."""
    found = _decoder(target)
    if found is None:
        raise TypeError(f"cannot find decoder layers in {type(target).__name__}")
    return found[1]


def final_norm(target: nn.Module) -> nn.Module | None:
    found = _decoder(target)
    if found is None:
        return None
    return next((norm for name in _FINAL_NORMS if isinstance(norm := getattr(found[0], name, None), nn.Module)), None)


def active_stream(target: nn.Module) -> int | None:
    """Gemma 3n passes ``altup_num_inputs`` copies of the hidden state from layer to layer
    ([copies, b, n, H]); its layers compute on one of them (``altup_active_idx``), and that copy
    is the layer's hidden state for a draft. None for every model with one hidden state."""
    text = target.config.get_text_config()
    if (getattr(text, "altup_num_inputs", None) or 1) > 1:
        return int(getattr(text, "altup_active_idx", 0))
    return None


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
        self.stream = active_stream(target)
        self.enabled = True
        self._outputs: dict[int, torch.Tensor] = {}
        self._handles = []

    def _hook(self, layer_id: int):
        def hook(_module, _args, output):
            if self.enabled:
                hidden = output[0] if isinstance(output, (tuple, list)) else output  # GPT-1's blocks return a list
                if self.stream is not None and hidden.dim() == 4:
                    hidden = hidden[self.stream]
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
