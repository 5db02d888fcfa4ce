"""The compiled path: ``torch.compile`` of the verify and of the draft pass on static caches
(engine/backends.py ``StaticBackend``), compiled in a background thread while the eager path
answers, then used by every reply that fits a compiled bucket.

- What runs compiled is a copy of the target that shares its weights (no second copy of any
  tensor): feature hooks that an eager reply attaches to the loaded target while a pass is being
  traced would otherwise be traced into it.
- One lock guards the copy and its caches: a reply takes it without waiting (when a compile holds
  it, the reply answers eagerly); a compile waits for the reply in progress.
- Replies come first (``GiveWay``): while an eager reply runs, the compile thread pauses at its
  next Python call. Tracing a pass holds the GIL most of the time, and an eager reply beside it,
  whose every op gives the GIL up and then waits to take it back, ran 10–60× slower (measured:
  docs/performance.md).
- Shapes are fixed per (length bucket, width): a verify of the policy's block (full, reduced,
  one token) and a draft pass of the draft's block; each is compiled once, run twice at warm-up
  (the second run proves that it does not recompile), and counted. ``recompiles`` counts graphs
  compiled during replies after warm-up (torch._dynamo's graph counter, read under the lock).
- On CUDA the mode is ``reduce-overhead``: inductor captures the compiled passes in CUDA graphs;
  their outputs live in the graph's memory, so they are copied out before the next replay.
- Inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``, default under the temp folder) is left
  on: a second start compiles from it in a fraction of the time (``bench --compile`` measures).
- A compile that fails is logged with its traceback and the eager path stays (``state`` says
  ``failed`` and ``error`` why); nothing is swallowed.
- A process that exits while the compile thread is inside torch aborts ("terminate called without
  an active exception", exit code 134). So an exit (a command's error, the end of a script, Ctrl-C)
  first stops the compile after the pass in progress and waits for it (``atexit``).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import itertools
import logging
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .backends import (EagerBackend, StaticBackend, draft_pass, has_linear_attention, static_disagreement,
                       verify_pass)
from .fallback import reduced_size
from .rope_limits import verify_limits
from .static_cache import StaticDraftCache
from .target_cache import logit_drift

log = logging.getLogger(__name__)

STATES = ("off", "compiling", "ready", "failed", "unsupported")


def weight_sharing_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``module`` whose parameters and buffers are the original's tensors, with
    no hooks: the logits guard's check (``engine.weights``) would break every compiled graph in
    two, so the static session checks the logits itself."""
    memo = {id(tensor): tensor for tensor in itertools.chain(module.parameters(), module.buffers())}
    clone = copy.deepcopy(module, memo)
    for sub in clone.modules():
        for hooks in (sub._forward_hooks, sub._forward_pre_hooks, sub._forward_hooks_with_kwargs,
                      sub._forward_hooks_always_called, sub._forward_pre_hooks_with_kwargs):
            hooks.clear()
    return clone


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@dataclass
class CompileReport:
    """What compiling took: seconds per (kind, bucket, width), and the total."""

    seconds: dict = field(default_factory=dict)
    graphs: int = 0

    @property
    def total_seconds(self) -> float:
        return round(sum(self.seconds.values()), 2)

    def as_dict(self) -> dict:
        return {"total_seconds": self.total_seconds, "graphs": self.graphs,
                "passes": {f"{kind} {bucket}x{width}": round(s, 2) for (kind, bucket, width), s in self.seconds.items()}}


class GiveWay:
    """Lets eager replies run at full speed beside the compile thread: its trace function
    (``at_call``, installed with ``sys.settrace`` in that thread only) runs at each new Python
    frame there, and while a reply runs it waits for the reply to end. The wait lasts ``pause``
    seconds at most and is then followed by ``run`` seconds of compiling, so that a lock the
    paused compile holds and a reply needs is let go, and a steady stream of replies slows the
    compile instead of stopping it. Its cost: compiling takes about 1.2× as long (measured,
    docs/performance.md)."""

    def __init__(self, pause: float = 0.25, run: float = 0.02):
        self.pause, self.run = pause, run
        self.running = 0  # eager replies (and other eager work) in progress
        self._changed = threading.Condition()
        self._closed = False
        self._run_until = 0.0

    def started(self) -> None:
        with self._changed:
            self.running += 1

    def ended(self) -> None:
        with self._changed:
            self.running -= 1
            self._changed.notify_all()

    @contextlib.contextmanager
    def while_running(self):
        """For other eager work that must not share the GIL with a compile (measuring costs)."""
        self.started()
        try:
            yield
        finally:
            self.ended()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def at_call(self, frame, event, arg) -> None:
        """The trace function: returns None, so no frame is traced line by line."""
        if self.running and time.monotonic() >= self._run_until:
            with self._changed:
                self._changed.wait_for(lambda: not self.running or self._closed, timeout=self.pause)
            self._run_until = time.monotonic() + self.run


class CompiledPath:
    """Compiles, in the background, the passes replies of ``max_block`` need, and hands out the
    static backend when they are ready. ``mode``: torch.compile's mode (None: inductor's
    default; ``reduce-overhead`` on CUDA: CUDA graphs)."""

    def __init__(self, target, draft, max_block: int, mode: str | None = None,
                 buckets: tuple[int, ...] | None = None, reduced_block: int = 4):
        self.draft = draft
        self.give_way = GiveWay()
        self.max_block = max_block
        self.mode = mode
        self.reduced_block = reduced_block
        self.state = "compiling"
        self.error: str | None = None
        self.recompiles = 0
        self.report = CompileReport()
        self._lock = threading.Lock()
        self._graphs_at_acquire = 0
        self._ready: set[tuple[str, int, int]] = set()
        self._queued: set[tuple[str, int, int]] = set()
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False
        # inductor writes the thread count into its CPU kernels when it compiles them: the
        # compile thread takes the loader's (one thread for a small model on a CPU)
        self.threads = torch.get_num_threads()
        self.backend = None
        if compile_turned_off():
            self.state, self.error = "off", "torch.compile is turned off in this process (TORCH_COMPILE_DISABLE)"
            return
        if (why := why_not_compiled(target)) is not None:
            self.state, self.error = "unsupported", why
            return
        copy_of_target = weight_sharing_copy(target)
        extra = {"buckets": buckets} if buckets else {}
        self.backend = StaticBackend(copy_of_target, draft, release=self._release, **extra)

    # ------------------------------------------------------------------ what replies ask
    @property
    def label(self) -> str:
        """For the model header: which path answers now, and while it compiles how far it got
        (under replies that never stop, compiling takes minutes: the count shows it moving)."""
        if self.state == "ready":
            return "compiled"
        if self.state == "compiling":
            return f"eager (compiling: {len(self._ready)} of {len(self._queued)} passes…)"
        return "eager"

    def widths(self, max_block: int) -> set[tuple[str, int]]:
        """The (kind, width) passes a reply at ``max_block`` runs: verifies of the full block,
        the fallback's reduced block and one token; a draft pass of the draft's own block."""
        verify = {1, max_block}
        reduced = reduced_size(self.reduced_block, max_block)
        if reduced:
            verify.add(reduced)
        passes = {("verify", w) for w in verify}
        if self.draft is not None and max_block > 1:
            passes.add(("draft", max(max_block, self.draft.block_size)))
        return passes

    name = "compiled"

    def open(self, target, draft, max_length: int, max_block: int):
        """A session for one reply (the decode loop's backend): on the static backend when its
        passes for this length are compiled and no compile holds it, else eager on ``target``.
        A pass not compiled yet is queued for the compile thread."""
        backend = self.acquire(max_length, max_block)
        if backend is None:
            self.give_way.started()
            try:
                return EagerBackend(release=self.give_way.ended).open(target, draft, max_length, max_block)
            except BaseException:
                self.give_way.ended()
                raise
        try:
            return backend.open(backend.target, draft, max_length, max_block)
        except BaseException:
            self._release()
            raise

    def acquire(self, max_length: int, max_block: int) -> StaticBackend | None:
        """The static backend, locked for one reply, or None (answer eagerly): not compiled
        yet, this length's bucket still compiling, or a compile in progress."""
        if self.backend is None or self.state in ("failed", "unsupported"):
            return None
        try:
            bucket = self.backend.bucket(max_length)
        except ValueError:
            return None
        wanted = {(kind, bucket, width) for kind, width in self.widths(max_block)}
        missing = wanted - self._ready
        if missing:
            self.queue(missing)
        if not wanted & self._ready or not self._lock.acquire(blocking=False):
            return None
        self._graphs_at_acquire = graphs_compiled()
        return self.backend

    def _release(self) -> None:
        self.recompiles += graphs_compiled() - self._graphs_at_acquire
        self._lock.release()

    # ------------------------------------------------------------------ the compile thread
    def start(self, max_length: int = 512) -> "CompiledPath":
        """Compile what a reply of ``max_length`` positions at the draft's block needs."""
        if self.backend is None:
            return self
        self._thread = threading.Thread(target=self._work, name="dflash-compile", daemon=True)
        self._thread.start()
        atexit.register(stop_at_exit, weakref.ref(self))
        bucket = self.backend.bucket(max_length)
        self.queue({(kind, bucket, width) for kind, width in self.widths(self.max_block)})
        return self

    def queue(self, passes) -> None:
        fresh = set(passes) - self._queued
        self._queued |= fresh
        for item in sorted(fresh, key=lambda p: (p[1], p[0] != "verify", -p[2])):
            self._jobs.put(item)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every queued pass is compiled (tests, bench): True when ready."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.state == "compiling" or (self._queued - self._ready and self.state == "ready"):
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return self.state == "ready"

    def close(self, wait: float = 1.0) -> None:
        """Stop compiling (after the pass in progress) and let the copy's hooks and caches go.
        Waits up to ``wait`` seconds for the compile thread to end: an idle one ends in
        milliseconds, and a process that exits while it is still inside torch aborts."""
        self._closed = True
        self._jobs.put(None)
        self.give_way.close()
        if self._thread is None or not self._thread.is_alive():
            self._release_backend()
        elif self._thread is not threading.current_thread():
            self._thread.join(wait)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the compile thread to end after ``close`` (a script about to exit: a thread
        still inside torch at exit aborts the process)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def stop_and_wait(self) -> None:
        """Stop compiling and wait for the thread to end (a process about to exit)."""
        if self._thread is not None and self._thread.is_alive():
            if not self._jobs.empty() or self.state == "compiling":
                log.warning("stopping: waiting for the compile in progress to end")
            self.close(wait=0)
            self.join()

    def _release_backend(self) -> None:
        if self.backend is not None:
            with self._lock:
                self.backend.close()

    def _work(self) -> None:
        torch.set_num_threads(self.threads)
        sys.settrace(self.give_way.at_call)  # this thread's calls only
        try:
            with self._lock:
                why = static_disagreement(self.backend)
            if why is not None:
                log.warning("replies stay on the eager path: %s", why)
                self.state, self.error = "unsupported", why
                self._release_backend()
                return
            while True:
                item = self._jobs.get()
                if item is None or self._closed:
                    self._release_backend()
                    return
                with self._lock:
                    self._compile(*item)
                if self._jobs.empty():
                    self.state = "ready"
        except CompiledMismatch as exc:
            log.warning("replies stay on the eager path: %s", exc)
            self.state, self.error = "unsupported", str(exc)
            self._release_backend()
        except Exception as exc:  # the eager path stays; the reason is logged with its traceback
            log.exception("compiling the decode passes failed; replies stay on the eager path")
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"

    def _compile(self, kind: str, bucket: int, width: int) -> None:
        # inductor's freezing (TORCHINDUCTOR_FREEZING=1, which CPU tuning guides recommend) folds
        # static-address tensors into constants: the draft cache's fill counters among them, so a
        # frozen draft pass would propose from a stale context (the verify stays exact, drafting
        # stops paying); measured, it also made the verify slower (docs/performance.md)
        import torch._inductor.config

        with torch._inductor.config.patch(freezing=False), torch.inference_mode():
            self._compile_pass(kind, bucket, width)

    def _compile_pass(self, kind: str, bucket: int, width: int) -> None:
        _allow_enough_graphs()
        backend = self.backend
        caches = backend.caches_for(bucket)
        target = backend.target
        device = target.device
        started, graphs = time.perf_counter(), graphs_compiled()
        # an eager prefill first: it allocates the static buffers (never inside a trace)
        prompt = torch.zeros(1, 8, dtype=torch.long, device=device)
        caches.target.reset()
        if backend.capture is not None:
            backend.capture.enabled = True
        try:
            target(input_ids=prompt, past_key_values=caches.target.cache, use_cache=True, logits_to_keep=1)
            caches.target.commit(8)
            features = backend.capture.take() if backend.capture is not None else None
            if kind == "verify":
                compiled = self._compiled(verify_pass(target, caches.target, backend.capture), )
                ids = torch.zeros(1, width, dtype=torch.long, device=device)
                for _ in range(2):  # the second run proves the first compiled for good
                    compiled(ids, torch.arange(8, 8 + width, device=device)[None])
                    caches.target.commit(8)
            else:
                draft_cache = caches.draft
                draft_cache.reset()
                draft_cache.passes = {}
                noise = torch.zeros(1, width, self.draft.config.hidden_size, device=device, dtype=features.dtype)
                draft_cache.run(self.draft, noise, features, 8)  # eager: allocates the draft's buffers
                compiled = self._compiled(draft_pass(self.draft), )
                draft_cache.passes = {width: compiled}
                for step in range(2):
                    draft_cache.run(self.draft, noise, features[:, :1], 9 + step)
                why = draft_disagreement(self.draft, draft_cache, compiled, noise, features)
                draft_cache.reset()
                if why is not None:
                    raise CompiledMismatch(why)
        finally:
            caches.target.reset()
            if backend.capture is not None:
                backend.capture.enabled = False
                backend.capture.clear()
        backend.passes[(kind, bucket, width)] = compiled
        if kind == "verify":  # the compiled forward against the eager one, before any reply runs it
            why = static_disagreement(backend, width=width, bucket=bucket, where="compiled")
            if why is not None:
                del backend.passes[(kind, bucket, width)]
                raise CompiledMismatch(why)
        self._ready.add((kind, bucket, width))
        self.report.seconds[(kind, bucket, width)] = time.perf_counter() - started
        self.report.graphs += graphs_compiled() - graphs
        log.info("compiled the %s pass for %d positions, width %d, in %.1f s", kind, bucket, width,
                 self.report.seconds[(kind, bucket, width)])

    def _compiled(self, fn: Callable) -> Callable:
        compiled = torch.compile(fn, dynamic=False, mode=self.mode)
        if self.mode != "reduce-overhead":
            return compiled

        def run(*args, **kwargs):  # CUDA graphs reuse their output memory on the next replay
            out = compiled(*args, **kwargs)
            return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in out) if isinstance(out, tuple) \
                else out.clone()

        return run


def compile_turned_off() -> bool:
    """TORCH_COMPILE_DISABLE=1 (torch._dynamo's ``disable``): torch.compile hands back each pass
    as it is, and the header would say "compiled" over eager passes."""
    import torch._dynamo

    return bool(torch._dynamo.config.disable)


def why_not_compiled(target) -> str | None:
    """Why ``target`` stays on the eager path from its config alone (None: it may compile)."""
    if has_linear_attention(target):
        return "linear-attention layers roll back eagerly"
    if rope := verify_limits(target.config).limits:
        # a static verify is padded past its real tokens, and the padding's positions would move
        # the frequencies the real tokens get
        return (f"its {rope[0].rope_type} rotary embedding changes with the furthest position of a forward, "
                "padding included")
    text = target.config.get_text_config()
    if "chunked_attention" in (getattr(text, "layer_types", None) or ()):
        # Llama 4: compiled, transformers' chunked mask on a static cache gives other logits than
        # eagerly (NaN on a twin; with temperature tuning off, from the first chunk boundary on)
        return "its chunked-attention layers compute otherwise when compiled"
    return None


def draft_disagreement(draft, cache: StaticDraftCache, compiled: Callable, noise: torch.Tensor,
                       features: torch.Tensor) -> str | None:
    """Why the compiled draft pass of ``noise``'s width computes otherwise than the eager draft
    (None when it does not). Both run on the same random context after a prompt's, at fill
    levels the warm-up did not use: a pass that kept the cache's counters from its trace (as
    inductor's freezing would) fails here. The target verifies every token either way, so a
    disagreeing draft would cost speed, not exactness; it is not used."""
    width = noise.shape[1]
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(noise.shape, generator=generator).to(noise)
    prompt, two, full = (torch.randn(1, count, features.shape[-1], generator=generator).to(features)
                         for count in (3, 2, width))
    hidden = []
    for passes in ({}, {width: compiled}):
        cache.reset()
        cache.passes = {}
        cache.run(draft, noise, prompt, 3)  # a prompt's context, eagerly
        cache.passes = passes
        hidden.append(torch.cat([cache.run(draft, noise, two, 5), cache.run(draft, noise, full, 5 + width)]))
    cache.reset()
    cache.passes = {width: compiled}
    drift = logit_drift(hidden[1], hidden[0])
    return None if drift is None else f"its compiled draft pass differs from the eager one by {drift:.1%} of its scale"


class CompiledMismatch(Exception):
    """A compiled pass computes otherwise than the eager path: replies stay eager."""


def _allow_enough_graphs() -> None:
    """A graph per (bucket, width) for each pass: more than dynamo's default of 8 per function,
    after which it would silently fall back to eager."""
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < 64:
            setattr(config, name, 64)
    if hasattr(config, "accumulated_recompile_limit") and config.accumulated_recompile_limit < 512:
        config.accumulated_recompile_limit = 512


def stop_at_exit(path: "weakref.ref[CompiledPath]") -> None:
    """atexit: a process must not end while the compile thread is inside torch (it aborts)."""
    compiled = path()
    if compiled is not None:
        compiled.stop_and_wait()
