"""Reading a draft's ``config.json``: which published form it is, and what each key does.

Every key a published draft config carries falls in one of three classes (``classify_keys``):
honoured (the model or the loader reads it and it changes what the draft does); known and
ignored, with the reason beside it (metadata, and training-only settings such as
``num_anchors`` and ``loss_decay_gamma``); or refused by name, because it changes the math in a
way this engine does not do (``v_head_dim`` other than ``head_dim``, a quantised draft). A key
this engine does not know stops the load too (``CheckpointError`` naming it) instead of being
dropped: a silently ignored key gives a draft that loads, runs and proposes badly for no visible
reason. Where the serving engines disagree, the choice made is written next to the key
(``CHOICES``) and in docs/checkpoints.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import Qwen3Config

from .errors import CheckpointError

ARCHITECTURES = {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2"}
HONOURED, IGNORED = "honoured", "ignored"

# What each honoured key changes (the model and the loader read every key listed here;
# tests/test_draft_forms.py changes each one in every published config and checks that the
# draft's output, its loading or its pairing with the target changes with it).
ARCHITECTURE = "shapes the draft network"
ATTENTION = "decides which keys each draft query sees"
ROPE = "rotary position embedding"
PROPOSAL = "how proposals are read from the draft"
PAIRING = "checked against the target when the pair is loaded"
DESCRIPTIVE = "describes the file, no effect on a draft forward (generation and training metadata)"
TRAINING_ONLY = "a training setting, read by the trainer only; a forward never reads it"

# Known keys that change nothing in a draft's forward, with why (tests check that changing them
# changes nothing). Valid at the top level and inside dflash_config.
IGNORED_KEYS = {
    "model_type": DESCRIPTIVE + "; every form is Qwen3 decoder layers, whatever it says (gpt_oss, qwen3)",
    "auto_map": DESCRIPTIVE + "; remote code is never run",
    "transformers_version": DESCRIPTIVE,
    "dtype": DESCRIPTIVE + "; the dtype comes from --dtype",
    "torch_dtype": DESCRIPTIVE + "; the dtype comes from --dtype",
    "bos_token_id": DESCRIPTIVE + "; the target's tokenizer decides",
    "eos_token_id": DESCRIPTIVE + "; the target's tokenizer decides",
    "pad_token_id": DESCRIPTIVE,
    "initializer_range": DESCRIPTIVE + " (weights are loaded, never initialised)",
    "use_cache": DESCRIPTIVE + "; the draft always caches its context keys/values",
    "attention_dropout": DESCRIPTIVE + " (dropout is off at inference)",
    "initial_context_length": DESCRIPTIVE + "; yarn's original length is read from rope_scaling",
    **{key: DESCRIPTIVE + " (a generic transformers config field)" for key in (
        "_name_or_path", "chunk_size_feed_forward", "id2label", "label2id", "is_encoder_decoder", "problem_type",
        "output_attentions", "output_hidden_states", "return_dict")},
    "num_anchors": TRAINING_ONLY + " (block starts sampled per training sequence)",
    "loss_decay_gamma": TRAINING_ONLY + " (how fast the training loss weight decays along the block)",
    "backbone_rotary_base": "the target backbone's RoPE base; context and block keys rotate with rope_theta, as "
                            "vLLM and SGLang do (ik_llama.cpp rotates context keys with this base instead)",
}

TOP_LEVEL_KEYS = {
    "architectures": "selects the draft form (DFlashDraftModel or DFlash2DraftModel)",
    "max_position_embeddings": ROPE + " (yarn and dynamic scaling read it)",
    "hidden_size": ARCHITECTURE, "intermediate_size": ARCHITECTURE,
    "v_head_dim": ARCHITECTURE + " (equal to head_dim only: values as wide as keys; refused otherwise)",
    "num_hidden_layers": ARCHITECTURE,
    "num_attention_heads": ARCHITECTURE, "num_key_value_heads": ARCHITECTURE, "head_dim": ARCHITECTURE,
    "rms_norm_eps": ARCHITECTURE, "attention_bias": ARCHITECTURE + " (q/k/v/o projection biases)",
    "hidden_act": ARCHITECTURE + " (silu only: refused otherwise)",
    "vocab_size": ARCHITECTURE + "; " + PAIRING,
    "tie_word_embeddings": ARCHITECTURE + " (an own lm_head absent from the weights is the own embed_tokens)",
    "rope_theta": ROPE, "rope_scaling": ROPE + " (yarn, linear, dynamic, ...)", "rope_parameters": ROPE,
    "partial_rotary_factor": ROPE + " (only the first part of each head rotates)",
    "layer_types": ATTENTION + " (sliding layers get a window; causal unless is_causal says otherwise)",
    "sliding_window": ATTENTION + " (window of sliding layers)",
    "use_sliding_window": ATTENTION + " (with no layer_types, Qwen3Config makes the layers from max_window_layers "
                                      "on sliding, as transformers and vLLM read it; explicit layer_types decide)",
    "max_window_layers": ATTENTION + " (see use_sliding_window)",
    "is_causal": ATTENTION + " (forces every layer causal or bidirectional inside the block)",
    "num_target_layers": PAIRING,
    "target_hidden_size": ARCHITECTURE + " (width of the target features fc reads); " + PAIRING,
    "draft_vocab_size": PROPOSAL + " (own lm_head rows, mapped to target ids by d2t)",
    "eagle_aux_hidden_state_layer_ids": "which target layers feed the draft (layer L's input = layer L-1's "
                                        "output), read before target_layer_ids as vLLM does",
    "is_neox_style": ROPE + " (true only: refused otherwise)",
    "rope_is_neox_style": ROPE + " (true only: refused otherwise)",
    "add_swa_attention_sink_bias": ATTENTION + " (learned per-head sink; dflash_config.attention_sink_bias wins)",
    "quantization_config": "refused: a quantised draft is not supported (it silently drops acceptance to ~0)",
}

# Keys read from dflash_config first, then from the top level (z-lab v1 puts block_size on top).
DFLASH_KEYS = {
    "block_size": "the trained block: the draft always drafts a whole one",
    "mask_token_id": "the id of the mask slots; " + PAIRING,
    "target_layer_ids": "which target layers feed the draft; " + PAIRING,
    "num_target_layers": PAIRING,
    "causal": ATTENTION + " (after is_causal, before the per-layer default)",
    "use_swa": ATTENTION + " (a window on every layer when layer_types has no sliding layer)",
    "swa_window_size": ATTENTION + " (the window, before sliding_window)",
    "attention_sink_bias": ATTENTION + " (learned per-head sink joining the softmax denominator)",
    "attention_value_scale": ARCHITECTURE + " (values scaled before attention; see CHOICES)",
    "input_embedding_scale": ARCHITECTURE + " (block embeddings scaled)",
    "output_multiplier": PROPOSAL + " (logits scaled)",
    "final_logit_softcapping": PROPOSAL + " (tanh soft cap on logits)",
    "proposal_vocab_size": PROPOSAL + " (only ids below it are proposed)",
    "proposal_ids": PROPOSAL + " (only these ids are proposed)",
    "conv_kernel_size": ARCHITECTURE + " (DFlash2: taps of the grouped dynamic convolution)",
    "conv_group_size": ARCHITECTURE + " (DFlash2: channels sharing one dynamic coefficient)",
    "selector_rank": ARCHITECTURE + " (DFlash2: rank of the candidate selector's scorer)",
    "selector_top_k": PROPOSAL + " (DFlash2: candidates per slot)",
    "use_aux_hidden_state": "target features feed the draft (true only: refused otherwise)",
}

# Where the engines disagree, what this engine does (also in docs/checkpoints.md).
CHOICES = {
    "attention_value_scale": "values are multiplied by it, as SGLang, ik_llama.cpp and the MiMo backbone's own "
                             "attention do (vLLM ignores it)",
    "backbone_rotary_base": "context and block keys rotate with rope_theta, as vLLM and SGLang do "
                            "(ik_llama.cpp rotates context keys with backbone_rotary_base)",
    "use_swa": "a draft with no layer_types and use_swa gets the window on every layer, bidirectional inside "
               "the block, as vLLM does (SGLang seems not to window it)",
    "eagle_aux_hidden_state_layer_ids": "read before target_layer_ids (vLLM's order); a config whose two lists "
                                        "name different layers is refused",
}


def draft_setting(config, name: str, default=None):
    """A DFlash key from ``dflash_config`` first, then the top level (z-lab v1 puts block_size there)."""
    extra = getattr(config, "dflash_config", None) or {}
    if name in extra and extra[name] is not None:
        return extra[name]
    value = getattr(config, name, None)
    return default if value is None else value


def classify_keys(raw: dict, weights: set[str] | frozenset[str] = frozenset()) -> dict[str, tuple[str, str]]:
    """Each key of a raw draft config (``dflash_config.X`` for nested ones) -> (HONOURED or IGNORED,
    why). ``weights``: the names of the checkpoint's tensors where they are known (whether it has
    its own embed_tokens decides what tie_word_embeddings does). An unknown key, or a known key
    with a value this engine cannot honour, raises ``CheckpointError`` naming it."""
    nested = raw.get("dflash_config") or {}
    if not isinstance(nested, dict):
        raise CheckpointError("draft config: dflash_config must be a JSON object")
    classes, unknown = {}, []
    for name, key in [(key, key) for key in raw if key != "dflash_config"] + [(f"dflash_config.{key}", key)
                                                                               for key in nested]:
        nested_key = name.startswith("dflash_config.")
        if key in IGNORED_KEYS:
            classes[name] = (IGNORED, IGNORED_KEYS[key])
        elif key in DFLASH_KEYS or (not nested_key and key in TOP_LEVEL_KEYS):
            classes[name] = (HONOURED, DFLASH_KEYS.get(key) or TOP_LEVEL_KEYS[key])
        else:
            unknown.append(name)
    if "dflash_config" in raw:
        classes["dflash_config"] = (HONOURED, "holds the DFlash keys below")
    if unknown:
        raise CheckpointError(f"draft config has keys this engine does not know: {', '.join(unknown)}; it refuses "
                              "them rather than run a draft whose meaning it would change by ignoring them")
    refuse_values(raw, nested)
    for name, why in unused_here(raw, nested, weights).items():
        if classes.get(name, (IGNORED,))[0] == HONOURED:
            classes[name] = (IGNORED, why)
    return classes


def key_handlers(raw: dict) -> dict[str, str]:
    """Why each key of a raw draft config is honoured or ignored (see ``classify_keys``)."""
    return {name: why for name, (_, why) in classify_keys(raw).items()}


def unused_here(raw: dict, nested: dict, weights) -> dict[str, str]:
    """Honoured keys that this particular config makes inert, with why: a window size where no
    layer slides, a RoPE length where no scaling reads it. Reported as ignored, so that what a
    config's keys are said to do is what they do."""
    merged = {**raw, **nested}
    unused = {}
    rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type == "default":
        unused["max_position_embeddings"] = "no rope scaling reads it (plain RoPE needs no length)"
    elif rope_type in ("yarn", "linear") and rope.get("factor") and (rope_type == "linear" or rope.get(
            "original_max_position_embeddings")):
        unused["max_position_embeddings"] = "rope_scaling's own factor and original length set the scaling"
    layer_types = raw.get("layer_types")
    layers_slide = any(t == "sliding_attention" for t in layer_types or [])
    if layer_types is None and raw.get("use_sliding_window"):  # Qwen3Config makes the layers from these
        layers_slide = raw.get("num_hidden_layers", 1) > raw.get("max_window_layers", 28)
    if layer_types is not None:
        unused["max_window_layers"] = "layer_types lists each layer's kind, which decides"
    elif not raw.get("use_sliding_window"):
        unused["max_window_layers"] = "use_sliding_window is off: no layer is made sliding"
    swa_everywhere = bool(merged.get("use_swa")) and not layers_slide
    if not layers_slide and not swa_everywhere:
        unused["sliding_window"] = "no layer slides"
        unused["use_sliding_window"] = unused.get("use_sliding_window", "no layer slides")
    if nested.get("swa_window_size") and (swa_everywhere or layers_slide):
        unused["sliding_window"] = "dflash_config.swa_window_size sets the window"
    if "embed_tokens.weight" not in weights:
        unused["tie_word_embeddings"] = "the draft has no embed_tokens of its own: the target's head is used"
    elif "lm_head.weight" in weights:
        unused["tie_word_embeddings"] = "the draft ships its own lm_head: nothing is tied"
    for name, key in (("is_neox_style", "is_neox_style"), ("rope_is_neox_style", "rope_is_neox_style")):
        if raw.get(key) is True:
            unused[name] = "true is the only RoPE layout there is here (false is refused)"
    if merged.get("use_aux_hidden_state") is True:
        for name in ("use_aux_hidden_state", "dflash_config.use_aux_hidden_state"):
            unused[name] = "true is what every DFlash draft does (false is refused)"
    if raw.get("v_head_dim") is not None:
        unused["v_head_dim"] = "equal to head_dim: values are as wide as keys, as every draft layer has them"
    for key in DFLASH_KEYS:
        if key in raw and key in nested:
            unused[key] = f"dflash_config.{key} is read first"
    return {name: why for name, why in unused.items() if name.removeprefix("dflash_config.") in merged}


def refuse_values(raw: dict, nested: dict) -> None:
    """Known keys whose value asks for something this engine does not do."""
    problems = []
    if raw.get("quantization_config"):
        problems.append("quantization_config: quantised drafts are not supported")
    head_dim = raw.get("head_dim") or (raw.get("hidden_size", 0) // max(1, raw.get("num_attention_heads", 1)))
    if raw.get("v_head_dim") is not None and raw["v_head_dim"] != head_dim:
        problems.append(f"v_head_dim {raw['v_head_dim']} differs from head_dim {head_dim}: values narrower or wider "
                        "than keys change every attention output, and draft layers have values as wide as keys")
    if raw.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {raw['hidden_act']!r}: only silu draft layers exist")
    for key in ("is_neox_style", "rope_is_neox_style"):
        if raw.get(key) is False:
            problems.append(f"{key} false: interleaved RoPE drafts are not supported")
    if {**raw, **nested}.get("use_aux_hidden_state") is False:
        problems.append("use_aux_hidden_state false: a draft that reads no target features is not DFlash")
    layer_types = raw.get("layer_types")
    if layer_types and any(t not in ("sliding_attention", "full_attention") for t in layer_types):
        problems.append(f"layer_types {sorted(set(layer_types))}: only sliding_attention and full_attention exist")
    if layer_types and len(layer_types) != raw.get("num_hidden_layers", len(layer_types)):
        problems.append(f"layer_types has {len(layer_types)} entries for {raw.get('num_hidden_layers')} layers")
    if problems:
        raise CheckpointError("draft config refused: " + "; ".join(problems))


def read_draft_config(directory: Path) -> tuple[Qwen3Config, str]:
    """(the draft's config as a Qwen3Config, its form: "dflash" or "dflash2")."""
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"no config.json in draft directory {directory}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"draft config {path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"draft config {path} is not a JSON object")
    return config_from_dict(raw, str(directory))


def config_from_dict(raw: dict, where: str = "draft") -> tuple[Qwen3Config, str]:
    arch = raw.get("architectures") or ["DFlashDraftModel"]
    forms = [ARCHITECTURES[a] for a in arch if a in ARCHITECTURES]
    if not forms:
        raise CheckpointError(f"{where} is not a DFlash draft (architectures: {arch}); known forms: "
                              f"{', '.join(ARCHITECTURES)}")
    classify_keys(raw)
    values = {k: v for k, v in raw.items() if k not in ("auto_map", "transformers_version", "model_type")}
    try:
        config = Qwen3Config(**values)
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"draft config in {where} is inconsistent: {exc}") from exc
    return config, forms[0]
