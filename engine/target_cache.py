"""The target's cache, and how a verify is rolled back to the last accepted token.

A verify runs ``[anchor, drafts]`` through the target; after the first rejection the target's
state must be exactly what plain decoding would hold after the anchor and the accepted drafts.
Each kind of layer cache gets there its own way:

- full-attention K/V: crop the rejected positions;
- sliding-window K/V: the same crop; the layer keeps every new key until the crop (transformers'
  "past recording"), and the crop trims it back to the window, so keys still inside the window
  after a rollback are never lost. The crop runs after every verify, also when nothing was
  rejected: that trim is what keeps the cache and the window's attention mask the same size;
- linear-attention layers (Gated DeltaNet in Qwen3.5 / 3.6 / Next): the recurrent state after B
  tokens cannot be cropped. Before a verify their conv and recurrent states are copied; after a
  rejection they are put back and ONLY the linear-attention mixer is run again over the accepted
  tokens, from the inputs it received during the verify (captured by a hook). Causality makes
  those inputs what plain decoding would have given it. That costs the mixers' share of a forward
  over the accepted tokens, against a whole second target forward for re-verifying the prefix.

Any other layer cache is refused when the target is loaded (``check_rollback``), never guessed.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import (Cache, DynamicIndexedLayer, DynamicLayer, DynamicSlidingWindowLayer,
                                      LinearAttentionLayer, StaticLayer)

from .errors import UnsupportedTargetError
from .features import decoder_layers

ATTENTION_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer, StaticLayer)


def family_name(target) -> str:
    config = getattr(target, "config", None)
    return f"{type(target).__name__} ({getattr(config, 'model_type', '?')})"


def layer_caches(target) -> list:
    """The per-layer caches transformers builds for ``target``'s config (no forward needed)."""
    try:
        return list(DynamicCache(config=target.config).layers)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise UnsupportedTargetError(
            f"{family_name(target)}: its cache cannot be built as a DynamicCache ({type(exc).__name__}: {exc}); "
            f"DFlash cannot roll back its verify") from None


# Where a decoder layer keeps its linear-attention mixer, for the mixers proven to recompute
# exactly (Gated DeltaNet: Qwen3.5, Qwen3.6, Qwen3-Next, OLMo hybrid). A mixer is called as
# ``mixer(hidden_states=..., cache_params=cache, attention_mask=...)``.
LINEAR_MIXERS = ("linear_attn",)


def mixer_of(decoder_layer: nn.Module) -> nn.Module | None:
    """The linear-attention mixer of a decoder layer, or None when it has none DFlash knows."""
    for name in LINEAR_MIXERS:
        if isinstance(getattr(decoder_layer, name, None), nn.Module):
            return getattr(decoder_layer, name)
    return None


def shared_kv_layers(target) -> int:
    """How many last decoder layers attend with an earlier layer's keys and values and keep no
    cache of their own (Gemma 3n, Gemma 4's E models: ``num_kv_shared_layers``). Rolling back
    the layers that own a cache rolls them back too."""
    return int(getattr(target.config.get_text_config(), "num_kv_shared_layers", None) or 0)


def check_rollback(target) -> None:
    """Refuse, in one line naming the family and why, a target whose cache the loop cannot roll back."""
    caches = layer_caches(target)
    try:
        layers = decoder_layers(target)
    except TypeError as exc:
        raise UnsupportedTargetError(f"{family_name(target)}: {exc}; DFlash cannot tap its features") from None
    if caches and len(caches) != len(layers) - shared_kv_layers(target):
        raise UnsupportedTargetError(
            f"{family_name(target)}: {len(caches)} layer caches for {len(layers)} decoder layers (shared or "
            f"skipped caches); DFlash cannot roll back its verify")
    for index, layer_cache in enumerate(caches):
        kind = type(layer_cache)
        if kind in ATTENTION_LAYERS:
            continue
        if kind is DynamicIndexedLayer:
            raise UnsupportedTargetError(
                f"{family_name(target)}: layer {index} uses sparse attention (a DynamicIndexedLayer cache) whose "
                f"indexer, once the context passes index_topk positions, keeps other keys for a block of tokens "
                f"than for the same tokens one at a time; DFlash's verify would not give plain decoding's tokens")
        if kind is LinearAttentionLayer:
            if mixer_of(layers[index]) is None:
                mixers = ", ".join(name for name, _ in layers[index].named_children())
                raise UnsupportedTargetError(
                    f"{family_name(target)}: layer {index} keeps a recurrent state in a mixer DFlash cannot recompute "
                    f"after a rejected draft (its modules: {mixers}; supported: Gated DeltaNet linear attention)")
            continue
        raise UnsupportedTargetError(
            f"{family_name(target)}: layer {index} uses a {kind.__name__} cache, which DFlash cannot roll back "
            f"after a rejected draft (supported: full attention, sliding window, linear attention)")


def logit_drift(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """The largest difference between two computations of the same logits, relative to their
    scale, when it is more than the numerical noise of their dtype (a block forward and single
    steps add in another order); else None."""
    scale = max(1.0, float(want.abs().max()))
    drift = float((got.float() - want.float()).abs().max()) / scale
    return drift if drift > (1e-3 if want.dtype == torch.float32 else 5e-2) else None


def probe_tokens(target, count: int) -> list[int]:
    """``count`` varied token ids inside the target's vocabulary: the checks' fixed probe text."""
    vocab = target.config.get_text_config().vocab_size
    return [(7 * i + 3) % vocab for i in range(count)]


@torch.inference_mode()
def check_verify_contract(target, prompt_length: int = 7, block: int = 4) -> None:
    """Refuse a target on which a verify and its rollback would not give plain decoding's logits.

    Plain decoding feeds tokens one at a time; a verify feeds the anchor and the drafts as one
    block after the cache, then the rollback keeps the anchor only, and the next token goes on
    from there. Both ways are run on a short sequence and their logits compared. transformers'
    Moshi text model fails the first half (a block after its cache is attended otherwise than
    the same tokens one at a time), RecurrentGemma the second (its recurrent state lives in its
    layers, out of the cache's reach); the refusal names the family and which half failed.
    A few short forwards, run once when a pair is loaded."""
    vocab = target.config.get_text_config().vocab_size
    ids = probe_tokens(target, prompt_length + block)
    wrong = [(t + 1) % vocab for t in ids[prompt_length + 1:]]
    device = target.device

    def forward(cache, tokens: list[int], start: int) -> torch.Tensor:
        positions = torch.arange(start, start + len(tokens), device=device)[None]
        return target(input_ids=torch.tensor([tokens], device=device), position_ids=positions,
                      past_key_values=cache.cache, use_cache=True).logits[0]

    def after_prompt(feed) -> torch.Tensor:
        cache = TargetCache(target)
        try:
            target(input_ids=torch.tensor([ids[:prompt_length]], device=device), past_key_values=cache.cache,
                   use_cache=True, logits_to_keep=1)
            cache.commit(prompt_length)
            return feed(cache)
        finally:
            cache.close()

    def plain(cache):  # the anchor, then the next token, one at a time
        first = forward(cache, ids[prompt_length:prompt_length + 1], prompt_length)
        cache.commit(prompt_length + 1)
        return torch.cat([first, forward(cache, ids[prompt_length + 1:prompt_length + 2], prompt_length + 1)])

    def verified(cache):  # the anchor and wrong drafts as a block, all drafts rejected, then the next token
        cache.before_verify()
        first = forward(cache, ids[prompt_length:prompt_length + 1] + wrong, prompt_length)[:1]
        cache.commit(prompt_length + 1)
        return torch.cat([first, forward(cache, ids[prompt_length + 1:prompt_length + 2], prompt_length + 1)])

    want, got = after_prompt(plain), after_prompt(verified)
    if (drift := logit_drift(got[:1], want[:1])) is not None:
        why = reduced_matmul_precision(got.dtype)
        raise UnsupportedTargetError(
            f"{family_name(target)}: its logits for a block of tokens after its cache differ from those of the same "
            f"tokens one at a time (by {drift:.0%} of their scale)"
            + (f" because {why}" if why else "; DFlash's verify would not give plain decoding's tokens"))
    if (drift := logit_drift(got[1:], want[1:])) is not None:
        raise UnsupportedTargetError(
            f"{family_name(target)}: after a verify is rolled back, its next logits differ from plain decoding's "
            f"(by {drift:.0%} of their scale): it keeps a state the cache cannot roll back")


def reduced_matmul_precision(dtype: torch.dtype) -> str | None:
    """Why float32 products would round otherwise in a block than one token at a time: torch's
    float32 matmul precision set below "highest" (TF32 on a GPU, bfloat16 passes on a CPU with
    AMX, as CPU and GPU tuning guides suggest). None when it is torch's default or not float32."""
    precision = torch.get_float32_matmul_precision()
    if dtype != torch.float32 or precision == "highest":
        return None
    return (f"torch's float32 matmul precision is {precision!r} (torch.set_float32_matmul_precision): its "
            f"products round to fewer bits, and a block and single tokens round differently, so DFlash's verify "
            f"would not give plain decoding's tokens. Set it back to 'highest', torch's default")


def check_rollback_config(directory) -> None:
    """``check_rollback`` for the target saved in ``directory``, from its config alone, before
    any weight is read: the model is built on the meta device (no memory). A config transformers
    cannot read or build is left to the loader's own error."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(directory, trust_remote_code=False)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - the loader reports unreadable and unknown targets itself
        return
    check_rollback(model)


class TargetCache:
    """A DynamicCache for ``target`` plus what a rollback needs (see the module docstring).

    ``before_verify()`` before each verify forward of more than one token; ``commit(length)``
    after it, with the number of positions to keep (prompt + anchor + accepted drafts)."""

    def __init__(self, target):
        check_rollback(target)
        self.family = family_name(target)
        self.cache = self.new_cache(target)
        self.attention = [layer for layer in self.cache.layers if isinstance(layer, ATTENTION_LAYERS)]
        decoders = decoder_layers(target)
        self.linear = [(layer, mixer_of(decoders[i])) for i, layer in enumerate(self.cache.layers)
                       if isinstance(layer, LinearAttentionLayer)]
        self._snapshot: list | None = None
        self._inputs: dict[int, tuple[tuple, dict]] = {}
        self._verify_start = 0
        self._hooks = [mixer.register_forward_pre_hook(self._recorder(i), with_kwargs=True)
                       for i, (_, mixer) in enumerate(self.linear)]

    def new_cache(self, target) -> Cache:
        cache = DynamicCache(config=target.config)
        for layer in cache.layers:
            if isinstance(layer, DynamicSlidingWindowLayer):
                layer.activate_past_recording()
        return cache

    def _recorder(self, index: int):
        def record(_module, args, kwargs):
            if self._snapshot is not None:
                self._inputs[index] = (args, dict(kwargs))
        return record

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    def seq_length(self) -> int:
        return self.cache.get_seq_length()

    def before_verify(self) -> None:
        """Copy the linear-attention states (nothing to copy for attention-only targets)."""
        if not self.linear:
            return
        self._verify_start = self.seq_length()
        self._inputs.clear()
        self._snapshot = [({i: s.clone() for i, s in layer.conv_states.items() if s is not None},
                           {i: s.clone() for i, s in layer.recurrent_states.items() if s is not None})
                          for layer, _ in self.linear]

    def commit(self, length: int) -> None:
        """Keep the first ``length`` positions: crop attention, put linear-attention states back."""
        remove = self.seq_length() - length
        if remove < 0 and self.attention:
            raise UnsupportedTargetError(
                f"{self.family}: its forward kept {length + remove} of {length} positions in the cache it was "
                f"given (it keeps a state of its own, or none); DFlash cannot roll back its verify")
        self.keep_attention(length, remove)
        if self._snapshot is not None:
            kept = length - self._verify_start
            if remove > 0:
                self._recompute_linear(kept)
            self._snapshot = None
            self._inputs.clear()

    def keep_attention(self, length: int, remove: int) -> None:
        for layer in self.attention:
            # a layer no token reached (Mllama's cross-attention, text only) has nothing to crop
            if getattr(layer, "is_initialized", True):
                layer.crop(-remove)  # also when remove == 0: trims a sliding layer back to its window

    @torch.no_grad()
    def _recompute_linear(self, kept: int) -> None:
        for index, ((layer, mixer), (conv, recurrent)) in enumerate(zip(self.linear, self._snapshot)):
            for i, state in conv.items():
                layer.conv_states[i].copy_(state)
            for i, state in recurrent.items():
                layer.recurrent_states[i].copy_(state)
            if kept > 0:
                args, kwargs = self._inputs[index]
                mixer(*_first_positions(args, kept), **_first_positions_kw(kwargs, kept))


def _first_positions(args: tuple, kept: int) -> tuple:
    return tuple(_cut(a, kept) for a in args)


def _first_positions_kw(kwargs: dict, kept: int) -> dict:
    return {name: _cut(value, kept) for name, value in kwargs.items()}


def _cut(value, kept: int):
    """A [batch, positions, ...] tensor cut to its first ``kept`` positions; anything else as is
    (the cache object itself, flags; a 2-d padding mask is cut along its positions too)."""
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == 1 and value.shape[1] > kept:
        return value[:, :kept]
    return value
