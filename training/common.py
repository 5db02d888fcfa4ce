"""Small helpers shared by the training commands: seeding, time-budgeted cosine schedule, one
optimizer update, a training clock, atomic checkpoints, a JSON-lines log, a progress bar, a
thread governor, and bf16 autocast where a run trains on CUDA."""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.errors import InvalidRequestError
from engine.files import write_atomically, write_text_atomically


def set_seed(seed: int) -> torch.Generator:
    """Seed python/torch and return a dedicated generator for data sampling."""
    random.seed(seed)
    torch.manual_seed(seed)
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


def set_threads(n: int | None) -> None:
    if n:
        torch.set_num_threads(n)


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def mixed_precision(device: torch.device):
    """bf16 autocast for the forward passes on CUDA (fp32 weights and optimizer state); nothing
    on other devices, where fp32 is both exact and the faster choice on the CPUs measured."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def cosine_lr(progress: float, base_lr: float, warmup: float, min_ratio: float = 0.1,
              decay_start: float | None = None) -> float:
    """Learning rate at a training progress in [0, 1]: linear warmup, the peak held until
    ``decay_start`` (default: right after warmup), then cosine to min_ratio at the end."""
    progress = min(max(progress, 0.0), 1.0)
    if warmup > 0 and progress < warmup:
        return base_lr * max(progress / warmup, 0.02)
    start = warmup if decay_start is None else max(warmup, decay_start)
    if progress < start:
        return base_lr
    t = (progress - start) / max(1e-9, 1.0 - start)
    return base_lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t)))


def decay_start(budget: Budget, decay_minutes: float | None) -> float | None:
    """Where the learning rate leaves its peak, as training progress: None for a cosine over the
    whole run; with ``decay_minutes``, that many minutes before the time budget ends
    (warmup-stable-decay). A held peak lets a long run be lengthened when it resumes, and any of
    its checkpoints be cooled into a model by resuming a copy of its work directory with
    ``--max-minutes`` set to the checkpoint's minutes plus ``decay_minutes``."""
    if not decay_minutes:
        return None
    if not budget.max_minutes:
        raise InvalidRequestError("--decay-minutes needs --max-minutes (the decay ends with the budget)")
    return max(0.0, 1.0 - decay_minutes / budget.max_minutes)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def optimizer_update(opt: torch.optim.Optimizer, loss: torch.Tensor, parameters, grad_clip: float) -> float:
    """Backward, clip, step; the gradient norm before clipping."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
    opt.step()
    return float(grad_norm)


@dataclass
class TrainClock:
    """A run's steps, work done (tokens or blocks) and training seconds. Evaluation and
    checkpoint time is not training time: ``checkpointed()`` restarts the step timer."""

    step: int = 0
    work: int = 0
    elapsed: float = 0.0
    last_checkpoint: float = 0.0
    _tick: float = field(default_factory=time.time)

    def advance(self, work: int) -> float:
        """One step that did ``work``; the seconds it took."""
        now = time.time()
        seconds, self._tick = now - self._tick, now
        self.step += 1
        self.work += work
        self.elapsed += seconds
        return seconds

    def checkpoint_due(self, minutes: float) -> bool:
        return self.elapsed - self.last_checkpoint >= minutes * 60

    def checkpointed(self) -> None:
        self.last_checkpoint = self.elapsed
        self._tick = time.time()


@dataclass
class Budget:
    """When to stop: whichever of max_steps / max_tokens / max_minutes comes first.
    ``progress`` is the fraction done (0..1) and drives the LR schedule, so a time-limited run
    still anneals to the end."""

    max_steps: int | None = None
    max_tokens: int | None = None
    max_minutes: float | None = None

    def progress(self, step: int, tokens: int, elapsed_s: float) -> float:
        parts = []
        if self.max_steps:
            parts.append(step / self.max_steps)
        if self.max_tokens:
            parts.append(tokens / self.max_tokens)
        if self.max_minutes:
            parts.append(elapsed_s / (60.0 * self.max_minutes))
        if not parts:
            raise ValueError("set at least one of --max-steps, --max-tokens, --max-minutes")
        return min(1.0, max(parts))


class JsonlLog:
    """Append-only JSON-lines log (one object per event; every record has 'event' and 'time')."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: str, **fields) -> dict:
        rec = {"event": event, "time": round(time.time(), 3), **fields}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        return rec

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


def save_checkpoint(path: Path, state: dict) -> None:
    """Atomic torch.save (write then rename), so an interrupted save never corrupts a resume."""
    write_atomically(path, lambda temporary: torch.save(state, temporary))


def load_checkpoint(path: Path) -> dict | None:
    path = Path(path)
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def write_json(path: Path, obj) -> None:
    write_text_atomically(path, json.dumps(obj, indent=2) + "\n")


class Progress:
    """tqdm bar over progress in permille, with tokens/s, loss and ETA in the postfix."""

    def __init__(self, desc: str, enabled: bool = True, initial: float = 0.0):
        from tqdm import tqdm

        self.bar = tqdm(total=1000, desc=desc, disable=not enabled, unit="‰", dynamic_ncols=True,
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt}‰ [{elapsed}<{remaining}{postfix}]",
                        initial=int(initial * 1000), mininterval=2.0)
        self.t0 = time.time()
        self.p0 = initial

    def update(self, progress: float, **postfix) -> None:
        n = int(progress * 1000)
        if n > self.bar.n:
            self.bar.update(n - self.bar.n)
        done = progress - self.p0
        if done > 0:
            eta = (time.time() - self.t0) * (1.0 - progress) / done
            postfix["eta"] = f"{eta / 60:.1f}m"
        self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        self.bar.close()


class ThreadGovernor:
    """Pick the torch thread count by measured speed. On a shared 2-core machine, a second busy
    process makes 2 OpenMP threads spin and collapse (20x slower); 1 thread then wins. Every
    ``period`` steps the median rate of the current setting is recorded, and the faster setting
    is chosen, probing the other one every ``probe_every`` periods."""

    def __init__(self, max_threads: int | None, period: int = 6, probe_every: int = 4):
        self.max = max(1, max_threads or torch.get_num_threads())
        self.options = [self.max, 1] if self.max > 1 else [1]
        self.rates: dict[int, float | None] = {n: None for n in self.options}
        self.current = self.max
        self.period, self.probe_every = period, probe_every
        self.samples: list[float] = []
        self.periods = 0
        torch.set_num_threads(self.current)

    def step(self, rate: float) -> int:
        if len(self.options) == 1:
            return self.current
        self.samples.append(rate)
        if len(self.samples) < self.period:
            return self.current
        vals = sorted(self.samples[1:])  # the first step after a switch is noisy
        self.rates[self.current] = vals[len(vals) // 2]
        self.samples = []
        self.periods += 1
        other = self.options[1] if self.current == self.options[0] else self.options[0]
        if self.rates[other] is None or self.periods % self.probe_every == 0:
            choice = other
        else:
            choice = max(self.options, key=lambda n: self.rates[n] or 0.0)
        if choice != self.current:
            self.current = choice
            torch.set_num_threads(choice)
        return self.current
