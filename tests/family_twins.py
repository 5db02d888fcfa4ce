"""Tiny random twins of the target families real DFlash drafts are published for, built from
transformers' own classes: the same layer kinds, caches, routing and scales as the real
checkpoints, at a size that decodes in milliseconds on a CPU.

Windows are short (``WINDOW``) so that a few dozen generated tokens pass every window many
times; linear-attention layers are interleaved with full attention as in the real models.
"""

from __future__ import annotations

import torch
import transformers as tf
from huggingface_hub.errors import StrictDataclassFieldValidationError

VOCAB = 96
WINDOW = 12  # sliding windows of the twins: a 7-token prompt + 40 tokens passes each three times
LINEAR = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]


def _common(**overrides) -> dict:
    settings = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    settings.update(overrides)
    return settings


def _linear_attention(**overrides) -> dict:
    return _common(layer_types=LINEAR, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                   linear_value_head_dim=16, linear_conv_kernel_dim=4, **overrides)


_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)

# family -> (what it stands for, config class, model class, config settings)
FAMILIES = {
    "llama": ("Llama 3.1", tf.LlamaConfig, tf.LlamaForCausalLM, _common(rope_theta=500000.0)),
    "qwen3": ("Qwen3 4B/8B", tf.Qwen3Config, tf.Qwen3ForCausalLM, _common()),
    "qwen3_moe": ("Qwen3-Coder-30B-A3B", tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM,
                  _common(decoder_sparse_step=1, **_MOE)),
    "qwen3_5": ("Qwen3.5 / Qwen3.6 dense", tf.Qwen3_5TextConfig, tf.Qwen3_5ForCausalLM, _linear_attention()),
    "qwen3_5_moe": ("Qwen3.5 / Qwen3.6 MoE", tf.Qwen3_5MoeTextConfig, tf.Qwen3_5MoeForCausalLM,
                    _linear_attention(shared_expert_intermediate_size=32, **_MOE)),
    "qwen3_next": ("Qwen3-Next, Qwen3-Coder-Next", tf.Qwen3NextConfig, tf.Qwen3NextForCausalLM,
                   _linear_attention(shared_expert_intermediate_size=32, decoder_sparse_step=1, **_MOE)),
    "olmo_hybrid": ("OLMo hybrid (Gated DeltaNet + attention)", tf.OlmoHybridConfig, tf.OlmoHybridForCausalLM,
                    _linear_attention(num_key_value_heads=4)),
    "gemma3": ("Gemma 3", tf.Gemma3TextConfig, tf.Gemma3ForCausalLM,
               _common(sliding_window=WINDOW, final_logit_softcapping=30.0, query_pre_attn_scalar=16,
                       layer_types=["sliding_attention"] * 3 + ["full_attention"])),
    "gpt_oss": ("gpt-oss 20b/120b", tf.GptOssConfig, tf.GptOssForCausalLM,
                _common(sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2,
                        layer_types=["sliding_attention", "full_attention"] * 2)),
    "deepseek_v3": ("Kimi-K2.5's text model (DeepSeek-V3: latent attention, MoE)", tf.DeepseekV3Config,
                    tf.DeepseekV3ForCausalLM,
                    _common(head_dim=8, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                            qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                            moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1)),
    "mimo_v2_flash": ("MiMo-V2-Flash / V2.5", tf.MiMoV2FlashConfig, tf.MiMoV2FlashForCausalLM,
                      _common(sliding_window=WINDOW)),
}


def family_twin(family: str, seed: int = 0, sharpness: float = 8.0, **overrides):
    """A random twin of ``family`` in fp32, eval mode. ``sharpness`` scales the LM head: the
    greedy tests want clear winners (no near-ties), the sampling tests real uncertainty."""
    _, config_class, model_class, settings = FAMILIES[family]
    torch.manual_seed(seed)
    model = model_class(config_class(**{**settings, **overrides})).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return model


# Every other architecture transformers ships, shrunk the same way: what a user might load as a
# target although no draft is published for it. Settings a config does not have are skipped, so
# one table serves GPT-2's n_embd as well as Llama's hidden_size.
_SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
              bos_token_id=None, eos_token_id=None, pad_token_id=None, sliding_window=WINDOW,
              n_embd=64, n_layer=4, n_head=4, d_model=64, n_positions=512, n_inner=128, ffn_dim=128,
              moe_intermediate_size=32, num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
              shared_expert_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
              ffn_hidden_size=128, rotary_dim=8, word_embed_proj_dim=64, attention_chunk_size=WINDOW)
_LATENT_ATTENTION = dict(head_dim=8, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                         qk_nope_head_dim=16, v_head_dim=16, n_group=1, topk_group=1)
# sparse attention (DSA) keeps the 8 best-scored earlier keys of each query, so that a reply of 47
# tokens drops some: the indexer's choice is part of what a verify must reproduce
_SPARSE_ATTENTION = dict(_LATENT_ATTENTION, index_topk=8, index_head_dim=16, index_n_heads=2)
_PER_TYPE = {name: _LATENT_ATTENTION for name in ("axk1", "deepseek_v2", "deepseek_v3", "glm4_moe_lite", "minicpm3",
                                                 "youtu")}
_PER_TYPE.update({name: _SPARSE_ATTENTION for name in ("axk2", "deepseek_v32", "glm_moe_dsa")})


def _gemma4_text_config(layer_types=("sliding_attention",) * 3 + ("full_attention",), **settings):
    """Gemma 4's head_dim is set per layer kind (a heterogeneous config): given whole, not shrunk."""
    return tf.Gemma4TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=len(layer_types), num_attention_heads=4, num_key_value_heads=2,
                               head_dim=16, global_head_dim=32, sliding_window=WINDOW, layer_types=list(layer_types),
                               vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=16,
                               max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2, **settings)


def _gemma3n_text_config():
    """Gemma 3n: four copies of the hidden state between layers (AltUp), a per-layer input, and
    its last two layers attending with the keys and values of earlier layers (no cache of their
    own), as its E2B/E4B checkpoints do."""
    return tf.Gemma3nTextConfig(vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=64,
                                hidden_size_per_layer_input=16, intermediate_size=128, num_hidden_layers=6,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
                                layer_types=["sliding_attention", "full_attention"] * 3, num_kv_shared_layers=2,
                                laurel_rank=8, altup_num_inputs=4, activation_sparsity_pattern=[0.0] * 6,
                                max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _gemma4_shared_kv_config():
    """Gemma 4's E models: the last layers share the keys and values of earlier ones."""
    return _gemma4_text_config(("sliding_attention", "sliding_attention", "full_attention") * 2,
                               num_kv_shared_layers=3)


_WHOLE_CONFIGS = {"gemma4_text": _gemma4_text_config, "gemma3n_text": _gemma3n_text_config,
                  "gemma4_text (shared KV)": _gemma4_shared_kv_config}


def any_family_twin(model_type: str, seed: int = 0, sharpness: float = 8.0):
    """A tiny random twin of any causal LM transformers knows by ``model_type`` (or of a variant
    named in ``_WHOLE_CONFIGS``), in fp32, eval mode."""
    if model_type in _WHOLE_CONFIGS:
        return _random_model(_WHOLE_CONFIGS[model_type](), seed, sharpness)
    config = tf.AutoConfig.for_model(model_type)
    text = config.get_text_config()
    for name, value in {**_SMALL, **_PER_TYPE.get(model_type, {})}.items():
        if hasattr(text, name) and not isinstance(getattr(text, name), (list, dict)):
            try:
                setattr(text, name, value)
            except (AttributeError, StrictDataclassFieldValidationError):  # derived (Falcon's head_dim), or never None
                pass
    layer_types = getattr(text, "layer_types", None)
    if isinstance(layer_types, list) and layer_types and len(layer_types) != text.num_hidden_layers:
        text.layer_types = (layer_types * text.num_hidden_layers)[:text.num_hidden_layers]
    return _random_model(config, seed, sharpness)


def _random_model(config, seed: int, sharpness: float):
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpness)
    return model
