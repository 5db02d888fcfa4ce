"""One config dataclass per concern, validated once at the edge (``validate()``)."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidRequestError

PROPOSALS = ("sample", "argmax")  # SamplingConfig.proposal


@dataclass(frozen=True)
class EngineConfig:
    """Which models to load and where. ``None`` target/draft means the default shipped pair (engine.shipped)."""

    target: str | None = None  # local directory or hub repo id
    draft: str | None = None  # local directory, hub repo id, or "repo/subfolder" (e.g. MiMo's dflash/)
    device: str | None = None  # None: cuda if available, else cpu
    dtype: str | None = None  # None: bfloat16 on cuda, float32 on cpu
    speculative: bool = True  # False: load no draft at all
    threads: int | None = None  # CPU threads for torch; None: 1 for small models on CPU (see loading.pick_threads)
    name: str | None = None  # what the pair is called (shown, stored); None: engine.shipped.pair_name of the paths
    # the compiled path (engine/compiled.py): static caches and torch.compile, compiled in the
    # background while the eager path answers; the command line turns it on where it pays
    compile: bool = False


# The largest block any engine accepts, in every edge (UI slider, CLI, API): the published DFlash
# drafts use 8 or 16, and a verify block longer than that costs more than its drafts can win back.
MAX_BLOCK_SIZE = 16


@dataclass(frozen=True)
class SamplingConfig:
    """Per-request generation settings."""

    max_new_tokens: int = 256
    block_size: int | None = None  # None: the draft's own block size
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    # T > 0 only: where the draft tokens come from. "sample": drawn from the draft's own
    # distribution q at this temperature/top-p/top-k; "argmax": the draft's argmax (one-hot q).
    # Both are lossless (speculative sampling); they differ in how often drafts are accepted.
    proposal: str = "sample"

    def validate(self, max_block_size: int = MAX_BLOCK_SIZE) -> "SamplingConfig":
        problems = []
        if not (1 <= self.max_new_tokens <= 32768):
            problems.append(f"max_new_tokens must be between 1 and 32768 (got {self.max_new_tokens})")
        if self.block_size is not None:
            upper = min(max_block_size, MAX_BLOCK_SIZE)
            if not (1 <= self.block_size <= upper):
                problems.append(f"block_size must be between 1 and {upper} (got {self.block_size})")
        if not (0.0 <= self.temperature <= 5.0):
            problems.append(f"temperature must be between 0 and 5 (got {self.temperature})")
        if not (0.0 < self.top_p <= 1.0):
            problems.append(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.proposal not in PROPOSALS:
            problems.append(f"proposal must be one of {', '.join(PROPOSALS)} (got {self.proposal!r})")
        if self.top_k < 0:
            problems.append(f"top_k must be 0 (off) or positive (got {self.top_k})")
        if problems:
            raise InvalidRequestError("; ".join(problems))
        return self


@dataclass(frozen=True)
class FallbackConfig:
    """Dynamic fallback: choose the next block size from {full, reduced, 1} by expected speed."""

    enabled: bool = True
    reduced_block_size: int = 4
    window: int = 32  # cycles in the rolling estimate of tau per block size
    hysteresis: float = 1.20  # switch only when the expected gain is >= 20 % (acceptance is bursty)
    floor: float = 0.95  # ... unless the block in use is expected slower than this x plain decoding
    probe_every: int = 4  # fewest cycles below full before probing full again
    probe_every_max: int = 128  # most cycles below full before the next probe
    probe_budget: float = 0.01  # a probe's expected loss <= this share of the time waited for it (3 %: 0.96x at T=0.7)
    probe_cycles: int = 2
    measure_plain_step: bool = True  # the second cycle is one plain step: measures the cost unit
    min_cycles_before_switch: int = 4
    preset: str | None = None  # "code" | "math" | "agent": a fixed tau threshold per kind of task
