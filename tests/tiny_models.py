"""Tiny random Qwen3 targets and DFlash drafts, built in memory for engine tests."""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from engine.draft import DFlashDraftModel, new_draft_config

VOCAB = 96
MASK_ID = VOCAB - 1  # a real embedding row that ordinary decoding never produces on purpose


def tiny_target(seed: int = 0, layers: int = 4, hidden: int = 64, vocab: int = VOCAB) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    model = Qwen3ForCausalLM(config)
    # sharpen the output so greedy decoding has clear winners (ties would make tests flaky)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def tiny_draft(target, seed: int = 1, layers: int = 1, block_size: int = 8, sliding_window: int | None = None,
               target_layer_ids=None) -> DFlashDraftModel:
    torch.manual_seed(seed)
    config = new_draft_config(target.config, layers, block_size, MASK_ID, target_layer_ids=target_layer_ids)
    if sliding_window is not None:
        config.layer_types = ["sliding_attention"] * layers
        config.sliding_window = sliding_window
        config.use_sliding_window = True
    return DFlashDraftModel(config).eval()


def copy_head_draft(target, block_size: int = 8) -> DFlashDraftModel:
    """A draft that is right most of the time: trained for a few steps would be slow, so we
    make acceptance non-trivial by construction in tests that need accepted tokens (see
    tests that use teacher-forced targets instead)."""
    return tiny_draft(target, block_size=block_size)
