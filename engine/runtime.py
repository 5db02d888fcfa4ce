"""``LocalEngine``: loaded models plus prompt encoding, request validation and generation, in
this process with torch. It implements ``engine.interface.Engine`` (as does the vLLM client);
``Engine`` stays its name here for the code that loads it directly."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import torch

from .chat_formats import ChatFormat, ChatOptions, chat_format
from .config import EngineConfig, FallbackConfig, SamplingConfig
from .compiled import CompiledPath
from .costs import CycleCosts, measure
from .decode import generate
from .events import Event, mark_context_full
from .fallback import MemorySlot
from .interface import LOCAL_CAPABILITIES, Capabilities
from .loading import LoadedModels, describe, load_models
from .prompts import Message, encode_prompt, fit_request, has_chat_template
from .weights import explain_failures


class LocalEngine:
    def __init__(self, models: LoadedModels, compile: bool = False):
        self.models = models
        self.compiled: CompiledPath | None = start_compiled_path(models) if compile else None
        self._hf_copy = None  # bench: the target transformers' compiled generate() runs (no hooks)
        self._hf_caches: dict = {}  # ... and its static caches per length
        self._costs: CycleCosts | None = None  # set by measure_costs (the app calls it after loading)
        self._costs_lock = threading.Lock()
        self._fallback_memory: dict[tuple, MemorySlot] = {}  # per block size and sampling settings

    @classmethod
    def load(cls, config: EngineConfig, progress=None) -> "LocalEngine":
        return cls(load_models(config, progress), compile=config.compile)

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
        return has_chat_template(self.tokenizer)

    @property
    def capabilities(self) -> Capabilities:
        return LOCAL_CAPABILITIES

    @property
    def chat_format(self) -> ChatFormat:
        return chat_format(self.tokenizer)

    def info(self) -> dict:
        return dict(describe(self.models), **self.path_info())

    def path_info(self) -> dict:
        """Which path answers now ('compiled', 'eager (compiling: 1 of 4 passes…)', 'eager') and what the
        compiled one cost: compile seconds, graphs, recompiles after warm-up."""
        compiled = self.compiled
        if compiled is None:
            return {"path": "eager"}
        return {"path": compiled.label, "compile_state": compiled.state, "compile_error": compiled.error,
                "compile": compiled.report.as_dict(), "recompiles": compiled.recompiles}

    def close(self) -> None:
        """Stops the compile thread; the models go with the object."""
        if self.compiled is not None:
            self.compiled.close()

    # ---------------------------------------------------------------- prompts
    def encode(self, prompt: str | list[Message], raw: bool = False, chat: ChatOptions | None = None) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, raw, chat)

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def check_request(self, prompt_ids: list[int], sampling: SamplingConfig) -> SamplingConfig:
        """Validate settings and the prompt against the context window; returns the settings to
        use (max_new_tokens shortened to what the window still holds)."""
        return fit_request(prompt_ids, sampling, self.models.context_window)

    # ---------------------------------------------------------------- generation
    def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingConfig,
        fallback: FallbackConfig | None = None,
        cancel: threading.Event | None = None,
        slot_details: bool = True,
        speculative: bool = True,
        compiled: bool = True,
    ) -> Iterator[Event]:
        """``compiled``: the compiled path when it is on and ready (False: eager, for bench)."""
        sampling = self.check_request(prompt_ids, sampling)
        draft = self.models.draft if speculative else None
        max_block = sampling.block_size or self.block_size
        # for the chat's speed estimate (tau / cycle cost in plain steps), once costs are measured
        steps = self.plain_steps(max_block) if draft is not None and max_block > 1 else None
        # replies with the same settings hand the fallback policy's estimates on to the next; the
        # eager path (bench's) keeps its own, since its cycles and plain steps cost more
        eager_only = not compiled and self.compiled is not None
        key = (max_block, sampling.temperature, sampling.top_p, sampling.top_k, sampling.proposal, eager_only)
        memory = self._fallback_memory.setdefault(key, MemorySlot()) if draft is not None else None
        events = generate(
            self.models.target, draft, prompt_ids, sampling, tokenizer=self.tokenizer,
            stop_token_ids=self.models.stop_token_ids, fallback=fallback, cancel=cancel,
            slot_details=slot_details, plain_steps=steps, fallback_memory=memory, backend=self.compiled if compiled else None,
        )
        return mark_context_full(explain_failures(events, self.models.device), self.models.context_window)

    def _hf_static_cache(self, length: int):
        from transformers import StaticCache

        from .compiled import weight_sharing_copy

        if self._hf_copy is None:  # its own copy: transformers' compile must not touch the compiled path's
            self._hf_copy = weight_sharing_copy(self.models.target)
        size = next((b for b in (512, 1024, 2048, 4096, 8192, 16384, 32768) if length <= b), length)
        if size not in self._hf_caches:
            self._hf_caches[size] = StaticCache(config=self._hf_copy.config, max_cache_len=size)
        return self._hf_copy, self._hf_caches[size]

    def _hf_compile_config(self):
        from transformers import CompileConfig

        config = CompileConfig(fullgraph=False, dynamic=False,
                               mode="reduce-overhead" if self.models.device.type == "cuda" else "default")
        config._compile_all_devices = True  # transformers compiles on CUDA only unless told
        return config

    def measure_costs(self, max_block: int | None = None) -> CycleCosts | None:
        """Measure what a verify and a draft pass cost at the block sizes replies use (plain,
        the fallback's reduced block, the draft's, up to ``max_block``, default twice the
        draft's): 9 rounds at a 128-token context, about a second for the embedded pair. The
        app does it once after loading; replies then carry ``Cycle.cost_in_plain_steps``."""
        if self.models.draft is None:
            return None
        top = max_block or 2 * self.block_size
        sizes = {1, min(4, top), min(self.block_size, top), top}
        # the compile thread gives way meanwhile: beside a compile, the GIL would time the compile
        beside = self.compiled.give_way.while_running() if self.compiled is not None else contextlib.nullcontext()
        with self._costs_lock, beside:
            context = max(1, min(128, self.models.context_window - max(sizes)))  # a short window: shorter
            self._costs = measure(self.models, context=context, sizes=sorted(sizes), repeats=9)
            return self._costs

    def plain_steps(self, max_block: int) -> dict[int, float] | None:
        """A cycle's measured cost in plain steps for every block 1..``max_block`` (interpolated
        between the measured sizes), or None before ``measure_costs``."""
        costs = self._costs
        if costs is None:
            return None
        return {b: round(costs.plain_steps(b), 3) for b in range(1, max_block + 1)}

    @torch.inference_mode()
    def hf_generate(self, prompt_ids: list[int], sampling: SamplingConfig,
                    compiled: bool = False) -> tuple[list[int], float]:
        """transformers' own ``generate()`` (the peer a user would otherwise use): ids, seconds.
        ``compiled``: its own compiled path, a static cache and ``torch.compile`` of the decode
        step (``compile_config``), on a hook-free copy of the target sharing its weights (the
        logits guard's hook would break its graph); one cache of the bucket's length is reused,
        so that a new prompt length does not recompile."""
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
        if compiled:
            target, cache = self._hf_static_cache(len(prompt_ids) + sampling.max_new_tokens)
            cache.reset()
            kwargs.update(past_key_values=cache, compile_config=self._hf_compile_config())
        start = time.perf_counter()
        out = target.generate(inputs, **kwargs)
        if self.models.device.type == "cuda":
            torch.cuda.synchronize()
        return out[0, len(prompt_ids):].tolist(), time.perf_counter() - start


def start_compiled_path(models: LoadedModels) -> CompiledPath:
    """Start compiling the passes a reply at the draft's block needs, in the background; CUDA
    gets CUDA graphs (``reduce-overhead``)."""
    max_block = models.draft.block_size if models.draft is not None else 1
    mode = "reduce-overhead" if models.device.type == "cuda" else None
    return CompiledPath(models.target, models.draft, max_block, mode=mode).start(max_length=512)


Engine = LocalEngine  # the name the app, bench and tests have always used
