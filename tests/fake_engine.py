"""``FakeEngine``: a scriptable stand-in for ``engine.runtime.Engine`` (simonw/llm's MockModel
pattern) that drives UI, app and browser tests in milliseconds without torch models.

    engine = FakeEngine(delay_s=0.05)
    engine.enqueue(FakeReply("def f():\\n    return 1\\n", accept=(3, 0, 7)))
    for event in engine.generate(engine.encode("hi"), SamplingConfig(), FallbackConfig(), cancel):
        ...

Each cycle emits ``accept[i]`` leading drafts (capped at block - 1) plus one bonus token and
shows the remaining drafts as rejected; ``fallback_at`` scripts fallback changes; ``fail_after``
ends the reply with a ``Failed`` event; ``cancel`` is honoured before every cycle (and during
the per-cycle delay). Unscripted replies use ``default_reply``.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

from engine.config import FallbackConfig, SamplingConfig
from engine.prompts import fit_request
from engine.events import Cycle, DraftSlot, Failed, FallbackDecision, Finished, Started

PIECE = re.compile(r"\s+|\w+|[^\w\s]")
DEFAULT_TEXT = (
    "Here is a function:\n\n```python\ndef fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n```\n\n"
    "It runs in O(n) time & uses <constant> memory.\n"
)
WRONG_GUESSES = ("foo", " =", "(", "self", "\n", " if", "_", "1")


def pieces(text: str) -> list[str]:
    return PIECE.findall(text)


@dataclass
class FakeReply:
    text: str = DEFAULT_TEXT
    accept: tuple[int, ...] = (3, 1, 6, 0, 2, 4)  # accepted drafts per cycle, cycled
    fallback_at: dict[int, tuple[int, str, str]] = field(default_factory=lambda: {
        4: (4, "reduced", "τ 2.5 over last 4 cycles; block 8 → 4, expected 1.3× → 1.5×"),
    })  # cycle -> (next block size, state, reason); applied only when fallback is enabled
    fail_after: int | None = None  # cycles before a Failed event
    failure: str = "the fake engine broke on purpose"
    delay_s: float | None = None  # per cycle; None: the engine's delay


class FakeEngine:
    """Quacks like ``engine.runtime.Engine`` for the app: name, block_size, encode, check_request, generate."""

    def __init__(self, name: str = "fake-coder", block_size: int = 8, delay_s: float = 0.0,
                 context_window: int = 4096, default_reply: FakeReply | None = None):
        self.name = name
        self.block_size = block_size
        self.speculative = block_size > 1
        self.has_chat_template = True
        self.delay_s = delay_s
        self.context_window = context_window
        self.default_reply = default_reply or FakeReply()
        self._script: list[FakeReply] = []
        self.calls: list[dict] = []  # one per generate(): prompt_ids, sampling, fallback
        self.running = threading.Event()  # set while a generation runs (tests check "one at a time")
        self.max_concurrent = 0
        self._active = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ scripting
    def enqueue(self, *replies: FakeReply | str) -> None:
        for reply in replies:
            self._script.append(FakeReply(reply) if isinstance(reply, str) else reply)

    def info(self) -> dict:
        return {"name": self.name, "device": "cpu", "dtype": "float32", "target_parameters": 0,
                "draft_parameters": 0, "block_size": self.block_size, "context_window": self.context_window}

    # ------------------------------------------------------------------ the Engine surface
    def encode(self, prompt, raw: bool = False) -> list[int]:
        if isinstance(prompt, str):
            text = prompt
        else:
            text = "\n".join(f"<{m['role']}>{m['content']}" for m in prompt) + "\n<assistant>"
        self.last_prompt = text
        return [hash(p) % 50000 for p in pieces(text)] or [0]

    def decode(self, ids) -> str:
        return " ".join(map(str, ids))

    def check_request(self, prompt_ids: list[int], sampling: SamplingConfig) -> SamplingConfig:
        return fit_request(list(prompt_ids), sampling, self.context_window)  # the real engines' own check

    def generate(self, prompt_ids, sampling: SamplingConfig, fallback: FallbackConfig | None = None,
                 cancel: threading.Event | None = None, **_ignored):
        sampling = self.check_request(list(prompt_ids), sampling)  # raises now, like the real engine
        reply = self._script.pop(0) if self._script else self.default_reply
        self.calls.append({"prompt_ids": list(prompt_ids), "sampling": sampling, "fallback": fallback,
                           "prompt_text": getattr(self, "last_prompt", None)})
        return self._run(reply, sampling, fallback or FallbackConfig(enabled=False), cancel, len(prompt_ids))

    def _run(self, reply: FakeReply, sampling, fallback, cancel, prompt_tokens):
        with self._lock:
            self._active += 1
            self.max_concurrent = max(self.max_concurrent, self._active)
        self.running.set()
        try:
            yield from self._events(reply, sampling, fallback, cancel, prompt_tokens)
        finally:
            with self._lock:
                self._active -= 1
                if not self._active:
                    self.running.clear()

    def _events(self, reply, sampling, fallback, cancel, prompt_tokens):
        delay = self.delay_s if reply.delay_s is None else reply.delay_s
        todo = pieces(reply.text)[: sampling.max_new_tokens]
        t0 = time.perf_counter()
        max_block = sampling.block_size or self.block_size
        block = max_block
        yield Started(prompt_tokens, sampling.max_new_tokens, max_block, sampling.temperature, 1, todo[0], 1.0,
                      max_block > 1)
        truncated = len(pieces(reply.text)) > len(todo)
        emitted_all, taus, reason, pos = [todo[0]], [], "length" if truncated else "stop", 1
        while pos < len(todo):
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            if reply.fail_after is not None and len(taus) >= reply.fail_after:
                yield Failed("RuntimeError", reply.failure)
                return
            if delay:
                if cancel is not None and cancel.wait(delay):
                    reason = "cancelled"
                    break
                if cancel is None:
                    time.sleep(delay)
            index = len(taus) + 1
            accepted = min(reply.accept[(index - 1) % len(reply.accept)], block - 1, len(todo) - pos - 1)
            accepted = max(accepted, 0)
            emitted = todo[pos: pos + accepted + 1]
            n_rejected = block - 1 - accepted if len(emitted) == accepted + 1 else 0
            rejected = [WRONG_GUESSES[(index + k) % len(WRONG_GUESSES)] for k in range(n_rejected)]
            drafts = emitted[:accepted] + rejected
            slots = tuple(
                DraftSlot(token=100 + j, text=piece, draft_top=((100 + j, piece, round(0.9 - 0.1 * j, 2)),),
                          target_prob=0.95 if j < accepted else 0.05,
                          target_token=100 + j, verdict="accepted" if j < accepted else ("rejected" if j == accepted else "unverified"))
                for j, piece in enumerate(drafts)
            )
            next_block, state, changed, why = block, "fixed", False, ""
            if fallback.enabled:
                state = "full" if block == max_block else ("off" if block == 1 else "reduced")
                if index in reply.fallback_at:
                    next_block, state, why = reply.fallback_at[index]
                    changed = next_block != block
            yield Cycle(
                index=index, block_size=block, anchor=1, anchor_position=prompt_tokens + pos - 1,
                draft_tokens=tuple(range(100, 100 + len(drafts))), accepted=accepted,
                bonus=7 if len(emitted) == accepted + 1 else None, emitted=tuple(range(len(emitted))),
                emitted_pieces=tuple(emitted), rejected=tuple(range(len(rejected))), rejected_pieces=tuple(rejected),
                slots=slots, draft_ms=2.0 if block > 1 else 0.0, verify_ms=4.0 + 0.5 * block,
                fallback=FallbackDecision(next_block, state, changed, why),
                context_length=prompt_tokens + pos + len(emitted), new_context_features=len(emitted),
            )
            emitted_all.extend(emitted)
            taus.append(len(emitted))
            pos += len(emitted)
            block = next_block
        total_ms = (time.perf_counter() - t0) * 1000 + 1.0
        yield Finished(reason=reason, token_ids=tuple(range(len(emitted_all))), text="".join(emitted_all),
                       acceptance_lengths=tuple(taus), prompt_tokens=prompt_tokens, prefill_ms=1.0,
                       decode_ms=total_ms - 1.0, total_ms=total_ms, cycles=len(taus))


def fake_studio(engine: FakeEngine | None = None, db_path=None, load_delay_s: float = 0.0, ui: bool = True,
                others: tuple[FakeEngine, ...] = (), **config):
    """A ``Studio`` (app.wiring) on a FakeEngine and a store (in memory unless ``db_path``);
    with ``ui=False`` just the ``UIContext`` (handler tests need no page). ``others``: more
    engines the model menu offers (by their names), after ``engine``."""
    from app.config import AppConfig
    from app.wiring import ModelChoice, build_context, build_studio
    from storage import SessionStore

    engine = engine or FakeEngine()
    broken = FakeEngine(name="broken")

    def loader(choice, progress):
        steps = 5
        for i in range(steps):
            progress(i / steps, f"loading step {i + 1}/{steps}")
            time.sleep(load_delay_s / steps)
        if choice.key == "incompatible-pair":
            from engine.errors import IncompatibleDraftError

            raise IncompatibleDraftError("draft does not fit the target: hidden size 64 ≠ target's 128")
        return next((e for e in (engine, *others) if e.name == choice.key), broken)

    catalog = [ModelChoice(engine.name, None, None), *(ModelChoice(e.name, None, None) for e in others),
               ModelChoice("incompatible-pair", "t", "d")]
    store = SessionStore(db_path) if db_path else SessionStore()
    config.setdefault("open_browser", False)
    config.setdefault("flush_interval_s", 0.2)
    build = build_studio if ui else build_context
    return build(AppConfig(**config), store=store, loader=loader, catalog=catalog)
