"""The ``Engine`` interface: what the UI, the HTTP API, storage, bench and the CLI may ask of an
engine, whichever one it is. Two engines implement it: the local one
(``engine.runtime.LocalEngine``, torch in this process) and the vLLM client
(``engine.vllm.VLLMEngine``, DFlash served by vLLM over HTTP).

No torch here: the UI imports ``Capabilities`` to know what an engine can report.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .config import FallbackConfig, SamplingConfig
from .events import Event
from .prompts import Message


@dataclass(frozen=True)
class Capabilities:
    """What an engine's events carry and which controls it honours. A ``False`` means the
    events leave that part out (never invented); ``*_note`` says why, for the UI to show."""

    kind: str = "local"  # "local" | "vllm": stored in each reply's settings
    rejected_drafts: bool = True  # Cycle.rejected / DraftSlot verdicts beyond the accepted prefix
    draft_top: bool = True  # DraftSlot.draft_top (the draft's top-3 per slot)
    block_size_choice: bool = True  # a per-request block size below the draft's own
    fallback: bool = True  # per-request dynamic fallback (smaller blocks when drafting stops paying)
    timings: bool = True  # Cycle.draft_ms / verify_ms measured per cycle (else estimated from arrival)
    plain_decoding: str = "the same engine at block 1, with the draft switched off"  # how Compare measures plain decoding
    rejected_note: str = ""
    block_size_note: str = ""
    fallback_note: str = ""


LOCAL_CAPABILITIES = Capabilities()
VLLM_CAPABILITIES = Capabilities(
    kind="vllm", rejected_drafts=False, draft_top=False, block_size_choice=False, fallback=False, timings=False,
    plain_decoding="a second vLLM server for the same target without a draft (the Studio starts it on first use)",
    rejected_note="vLLM does not report rejected drafts (nor the draft's top-3): only the accepted drafts and the "
                  "target's own tokens are shown",
    block_size_note="vLLM fixes the block size when its server starts (num_speculative_tokens = block − 1); "
                    "block 1 runs plain decoding on a server without a draft",
    fallback_note="vLLM has no per-request fallback; its own dynamic option (num_speculative_tokens_per_batch_size "
                  "in --speculative-config) is chosen when the server starts",
)
CAPABILITIES = {c.kind: c for c in (LOCAL_CAPABILITIES, VLLM_CAPABILITIES)}  # by the kind stored in settings


@runtime_checkable
class Engine(Protocol):
    """One loaded target (+ draft), ready to answer requests one at a time."""

    @property
    def name(self) -> str: ...  # the model pair, as shown and stored

    @property
    def block_size(self) -> int: ...  # the draft's block size (1 without a draft)

    @property
    def speculative(self) -> bool: ...  # a draft is there

    @property
    def has_chat_template(self) -> bool: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def info(self) -> dict: ...  # name, device, dtype, parameters, block_size, context_window (what is known)

    def encode(self, prompt: str | list[Message], raw: bool = False) -> list[int]: ...

    def decode(self, token_ids) -> str: ...

    def check_request(self, prompt_ids: list[int], sampling: SamplingConfig) -> SamplingConfig:
        """Raise ``InvalidRequestError`` for bad settings or a prompt too long for the context
        window; return the settings to use (max_new_tokens shortened to what the window holds)."""
        ...

    def generate(self, prompt_ids: list[int], sampling: SamplingConfig, fallback: FallbackConfig | None = None,
                 cancel: threading.Event | None = None, slot_details: bool = True,
                 speculative: bool = True) -> Iterator[Event]:
        """``Started``, one ``Cycle`` per verify step, then ``Finished`` (reason "cancelled" once
        ``cancel`` is set) or ``Failed``. ``speculative=False`` decodes plainly (the baseline).
        The request goes through ``check_request`` when this is CALLED, before the first event:
        a bad request raises here, so callers need not check it again."""
        ...

    def close(self) -> None: ...  # release what the engine holds (a vLLM server it started)


def capabilities_of(engine) -> Capabilities:
    """An engine's capabilities; engines written before the interface report everything."""
    return getattr(engine, "capabilities", None) or LOCAL_CAPABILITIES
