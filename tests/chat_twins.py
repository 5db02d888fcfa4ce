"""Reasoning models' chat formats in tests: tokenizers that carry each family's special tokens and
its PUBLISHED chat template (stored verbatim in tests/data/chat_templates, see its README), twins
of the targets built on them, and a scripted engine that replies with chosen token ids.

A random twin never writes ``<think>`` or a harmony channel by itself, so the replies whose
reasoning the tests follow are scripted token streams built from the tokenizer
(``ScriptedChatEngine``); the prompts are always rendered by the real published templates.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from engine.config import FallbackConfig, SamplingConfig
from engine.detok import IncrementalDetokenizer
from engine.events import Cycle, DraftSlot, FallbackDecision, Finished, Started
from engine.loading import LoadedModels, stop_tokens
from engine.prompts import encode_prompt, fit_request
from engine.chat_formats import chat_format
from engine.runtime import LocalEngine

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"

# family -> (template file, special tokens, tokens that decode as text (Qwen's think markers), eos)
FORMATS = {
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], ["<think>", "</think>"],
              "<|im_end|>"),
    "qwen3_5": ("Qwen3.5-4B.jinja", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], ["<think>", "</think>"],
                "<|im_end|>"),
    "qwen3_coder": ("Qwen3-Coder.jinja", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], [], "<|im_end|>"),
    "gpt_oss": ("openai-gpt-oss-120b.jinja",
                ["<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                 "<|constrain|>", "<|return|>", "<|call|>"], [], "<|return|>"),
    "llama": ("meta-llama-Llama-3.1-8B-Instruct.jinja",
              ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
               "<|eom_id|>", "<|python_tag|>"], [], "<|eot_id|>"),
}
CORPUS = (
    "You are ChatGPT, a large language model trained by OpenAI. Knowledge cutoff: 2024-06 Current date: "
    "Reasoning: low medium high # Valid channels: analysis, commentary, final. Channel must be included for "
    "every message. system user assistant developer Cutting Knowledge Date: December 2023 Today Date: 26 Jul 2024 "
    "The user wants a function. Let me plan it: add two numbers and return the sum. "
    "def add(a, b):\n    return a + b\n Write add in Python. Here it is. 0123456789\n\n"
) * 3


def template_text(family: str) -> str:
    return (TEMPLATES / FORMATS[family][0]).read_text()


def chat_tokenizer(family: str):
    """A small byte-level BPE tokenizer with ``family``'s special tokens and published template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    _, specials, text_markers, eos = FORMATS[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS], trainer)
    tok.add_tokens([AddedToken(marker, special=False, normalized=False) for marker in text_markers])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, additional_special_tokens=specials)
    fast.chat_template = template_text(family)
    return fast


def chat_twin_engine(family: str, twin: str, block_size: int = 4) -> LocalEngine:
    """A ``LocalEngine`` on a random twin of ``twin`` (tests/family_twins.py) that speaks
    ``family``'s chat format, with a tiny random draft."""
    from tests.family_twins import family_twin
    from tests.tiny_models import tiny_draft

    tokenizer = chat_tokenizer(family)
    target = family_twin(twin, vocab_size=len(tokenizer))
    draft = tiny_draft(target, block_size=block_size)
    draft.mask_token_id = tokenizer.convert_tokens_to_ids("<|endoftext|>") if family != "llama" else 0
    return LocalEngine(LoadedModels(target, tokenizer, draft, torch.device("cpu"), torch.float32, f"{family}-twin",
                                    stop_tokens(target, tokenizer), 512))


class ScriptedChatEngine:
    """An engine on a real tokenizer and its published template that replies with scripted token
    ids: the prompt goes through the template as the local engine renders it (thinking, effort),
    and each reply's tokens arrive in cycles of ``accept`` drafts plus a bonus, with one rejected
    draft shown after each accepted run."""

    capabilities = None  # the local engine's (engine.interface.capabilities_of)
    speculative = True
    has_chat_template = True

    def __init__(self, family: str, name: str | None = None, block_size: int = 4, delay_s: float = 0.0,
                 accept: tuple[int, ...] = (2, 0, 3, 1)):
        self.tokenizer = chat_tokenizer(family)
        self.name = name or f"{family}-scripted"
        self.block_size = block_size
        self.delay_s = delay_s
        self.accept = accept
        self.replies: list[list[int]] = []
        self.prompts: list[str] = []  # each request's prompt as the template rendered it
        self.lock = threading.Lock()

    @property
    def chat_format(self):
        return chat_format(self.tokenizer)

    def reply_ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def enqueue(self, text: str) -> None:
        """A reply written in the format itself ("<think>…</think>answer<|im_end|>")."""
        self.replies.append(self.reply_ids(text))

    def info(self) -> dict:
        return {"name": self.name, "device": "cpu", "dtype": "float32", "block_size": self.block_size,
                "context_window": 4096}

    def encode(self, prompt, raw: bool = False, chat=None) -> list[int]:
        ids = encode_prompt(self.tokenizer, prompt, raw, chat)
        self.prompts.append(self.tokenizer.decode(ids, skip_special_tokens=False))
        return ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def check_request(self, prompt_ids, sampling: SamplingConfig) -> SamplingConfig:
        return fit_request(list(prompt_ids), sampling, 4096)

    def close(self) -> None:
        return None

    def generate(self, prompt_ids, sampling: SamplingConfig, fallback: FallbackConfig | None = None,
                 cancel: threading.Event | None = None, **_ignored):
        sampling = self.check_request(prompt_ids, sampling)
        with self.lock:
            tokens = self.replies.pop(0) if self.replies else self.reply_ids("Hello.")
        return self._events(list(prompt_ids), tokens[: sampling.max_new_tokens], sampling, cancel)

    def _events(self, prompt_ids, tokens, sampling, cancel):
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids)
        block = sampling.block_size or self.block_size
        yield Started(len(prompt_ids), sampling.max_new_tokens, block, sampling.temperature, tokens[0],
                      detok.push(tokens[0]), 1.0, block > 1)
        pos, taus, reason = 1, [], "length"
        wrong = self.tokenizer.convert_tokens_to_ids("<|endoftext|>")
        while pos < len(tokens):
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            if self.delay_s:
                time.sleep(self.delay_s)
            index = len(taus) + 1
            accepted = max(0, min(self.accept[(index - 1) % len(self.accept)], block - 1, len(tokens) - pos - 1))
            emitted = tokens[pos: pos + accepted + 1]
            rejected = [wrong] * (block - 1 - accepted)
            rejected_pieces = detok.peek(emitted[:accepted] + rejected)[accepted:]
            pieces = [detok.push(t) for t in emitted]
            slots = tuple(DraftSlot(t, p, ((t, p, 0.9),), 0.9 if j < accepted else 0.1, t,
                                    "accepted" if j < accepted else "rejected")
                          for j, (t, p) in enumerate(zip(emitted[:accepted] + rejected, pieces[:accepted] + rejected_pieces)))
            yield Cycle(index, block, tokens[pos - 1], len(prompt_ids) + pos - 1, tuple(emitted[:accepted] + rejected),
                        accepted, emitted[-1], tuple(emitted), tuple(pieces), tuple(rejected), tuple(rejected_pieces),
                        slots, 1.0, 2.0, FallbackDecision(block, "fixed"), len(prompt_ids) + pos + len(emitted),
                        len(emitted))
            taus.append(len(emitted))
            pos += len(emitted)
        else:
            reason = "stop"
        kept = tokens[:pos]
        yield Finished(reason, tuple(kept), self.decode(kept), tuple(taus), len(prompt_ids), 1.0, 3.0 * len(taus),
                       1.0 + 3.0 * len(taus), len(taus))
