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
    mask_id = target.config.get_text_config().vocab_size - 1  # the last embedding row
    config = new_draft_config(target.config, layers, block_size, mask_id, target_layer_ids=target_layer_ids)
    if sliding_window is not None:
        config.layer_types = ["sliding_attention"] * layers
        config.sliding_window = sliding_window
        config.use_sliding_window = True
    return DFlashDraftModel(config).eval()


TEXT = (
    "def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, item):\n        self.items.append(item)\n"
    "for i in range(10):\n    print(i, 'héllo wörld ✓ 漢字 🙂')\n" * 4
)


def tiny_tokenizer(vocab_size: int = 300):
    """A byte-level BPE tokenizer (transformers-loadable) trained on a few lines of code."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def save_tiny_pair(root, block_size: int = 8, draft_layers: int = 1):
    """target/ (safetensors + tokenizer) and draft/ (z-lab format) under ``root``."""
    from pathlib import Path

    from engine.draft import save_draft

    root = Path(root)
    tokenizer = tiny_tokenizer()
    vocab = len(tokenizer) + 16  # padded embedding, like Qwen3: the mask row lies past the tokenizer
    target = tiny_target(vocab=vocab)
    target.config.eos_token_id = tokenizer.eos_token_id
    target.generation_config.eos_token_id = tokenizer.eos_token_id
    target.save_pretrained(root / "target", safe_serialization=True)
    tokenizer.save_pretrained(root / "target")
    torch.manual_seed(2)
    config = new_draft_config(target.config, draft_layers, block_size, vocab - 1)
    draft = DFlashDraftModel(config).eval()
    save_draft(draft, root / "draft")
    return root / "target", root / "draft", target, draft, tokenizer
