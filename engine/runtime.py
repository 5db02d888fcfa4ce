"""``Engine``: loaded models plus prompt encoding, request validation and generation.
The one object the app, the CLI and the benchmark hold."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import torch

from .config import EngineConfig, FallbackConfig, SamplingConfig
from .decode import generate
from .errors import InvalidRequestError
from .events import Event
from .loading import LoadedModels, describe, load_models

Message = dict  # {"role": "user"|"assistant"|"system", "content": str}


class Engine:
    def __init__(self, models: LoadedModels):
        self.models = models

    @classmethod
    def load(cls, config: EngineConfig, progress=None) -> "Engine":
        return cls(load_models(config, progress))

    # ---------------------------------------------------------------- facts
    @property
    def name(self) -> str:
        return self.models.name

    @property
    def tokenizer(self):
        return self.models.tokenizer

    @property
    def block_size(self) -> int:
        return self.models.draft.block_size if self.models.draft is not None else 1

    @property
    def speculative(self) -> bool:
        return self.models.draft is not None

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def info(self) -> dict:
        return describe(self.models)

    # ---------------------------------------------------------------- prompts
    def encode(self, prompt: str | list[Message], raw: bool = False) -> list[int]:
        """Chat messages (or a single user prompt) through the chat template when there is one;
        raw text otherwise or when ``raw``."""
        if isinstance(prompt, str) and (raw or not self.has_chat_template):
            return list(self.tokenizer(prompt, add_special_tokens=not self.has_chat_template)["input_ids"])
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if not self.has_chat_template:
            text = "\n\n".join(m["content"] for m in messages)
            return list(self.tokenizer(text)["input_ids"])
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def check_request(self, prompt_ids: list[int], sampling: SamplingConfig) -> SamplingConfig:
        """Validate settings and the prompt against the context window; returns the settings to
        use (max_new_tokens shortened to what the window still holds)."""
        sampling.validate(max_block_size=64)
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty")
        window = self.models.context_window
        room = window - len(prompt_ids) - 1
        if room < 1:
            raise InvalidRequestError(
                f"the prompt is {len(prompt_ids)} tokens; this model's context window is {window} tokens. "
                "Shorten it or start a new session."
            )
        if sampling.max_new_tokens > room:
            sampling = replace(sampling, max_new_tokens=room)
        return sampling

    # ---------------------------------------------------------------- generation
    def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingConfig,
        fallback: FallbackConfig | None = None,
        cancel: threading.Event | None = None,
        slot_details: bool = True,
        speculative: bool = True,
    ) -> Iterator[Event]:
        sampling = self.check_request(prompt_ids, sampling)
        draft = self.models.draft if speculative else None
        return generate(
            self.models.target, draft, prompt_ids, sampling, tokenizer=self.tokenizer,
            stop_token_ids=self.models.stop_token_ids, fallback=fallback, cancel=cancel,
            slot_details=slot_details,
        )

    @torch.inference_mode()
    def hf_generate(self, prompt_ids: list[int], sampling: SamplingConfig) -> tuple[list[int], float]:
        """transformers' own ``generate()`` (the peer a user would otherwise use): ids, seconds."""
        target = self.models.target
        inputs = torch.tensor([prompt_ids], device=self.models.device)
        kwargs = dict(max_new_tokens=sampling.max_new_tokens, eos_token_id=self.models.stop_token_ids or None,
                      pad_token_id=self.models.stop_token_ids[0] if self.models.stop_token_ids else 0,
                      attention_mask=torch.ones_like(inputs))
        if sampling.temperature > 0:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=sampling.top_k or None)
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        start = time.perf_counter()
        out = target.generate(inputs, **kwargs)
        if self.models.device.type == "cuda":
            torch.cuda.synchronize()
        return out[0, len(prompt_ids):].tolist(), time.perf_counter() - start
