"""`train tokenizer`: byte-level BPE (HF tokenizers) on Python source, saved so that
``AutoTokenizer.from_pretrained(dir)`` works, with a chat template and reserved special tokens."""

from __future__ import annotations

import json
import time
from pathlib import Path

EOS = "<|endoftext|>"
MASK = "<|mask|>"
PAD = "<|pad|>"
END = "<|end|>"
SPECIAL_TOKENS = [EOS, MASK, PAD, "<|system|>", "<|user|>", "<|assistant|>", END]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def render_chat(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """Pure-python twin of CHAT_TEMPLATE (used to build training text; tested to match)."""
    text = "".join(f"<|{m['role']}|>\n{m['content']}{END}\n" for m in messages)
    return text + ("<|assistant|>\n" if add_generation_prompt else "")


def _iter_texts(files, read):
    for p in files:
        yield read(p)


def train_tokenizer(out: Path, corpus: Path | None = None, vocab_size: int = 8192,
                    min_frequency: int = 2, seed: int = 0, log=print) -> Path:
    """Train and save; returns out. Skips work if out already holds a tokenizer of this size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from .corpus import read_source, split_files

    from engine.errors import InvalidRequestError

    smallest = 256 + len(SPECIAL_TOKENS)  # every byte and the special tokens, before any merge
    if vocab_size <= smallest:
        raise InvalidRequestError(f"--vocab-size {vocab_size} leaves no room for merges: the {smallest - 256} special "
                                  f"tokens and the 256 bytes take {smallest}; give more (8192 is the default)")
    out = Path(out)
    meta_path = out / "training_meta.json"
    if (out / "tokenizer.json").exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("vocab_size") == vocab_size:
            log(f"tokenizer already trained in {out} (vocab {vocab_size}); nothing to do")
            return out
    t0 = time.time()
    train_files, held = split_files(corpus)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=True)
    tok.train_from_iterator(_iter_texts(train_files, read_source), trainer=trainer,
                            length=len(train_files))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD,
                                   mask_token=MASK, unk_token=None, bos_token=None,
                                   additional_special_tokens=SPECIAL_TOKENS[3:])
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 1024
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    meta = {"vocab_size": vocab_size, "actual_vocab": tok.get_vocab_size(), "seed": seed,
            "train_files": len(train_files), "heldout_files": len(held),
            "seconds": round(time.time() - t0, 1), "special_tokens": SPECIAL_TOKENS}
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    log(f"tokenizer: {tok.get_vocab_size()} tokens from {len(train_files)} files "
        f"in {meta['seconds']} s -> {out}")
    return out


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def stop_token_ids(tokenizer) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(END), tokenizer.convert_tokens_to_ids(EOS)]
