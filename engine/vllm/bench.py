"""``bench --engine vllm``: plain decoding (a vLLM server without a draft) against DFlash (the
DFlash server) on the same prompts and settings, alternating, after a warm-up; optionally the
local engine's plain and DFlash runs on the same prompts in the same run (``local``), for a
side-by-side table. The summary has the local bench's fields; a path vLLM has no counterpart for
(transformers' ``generate()``) is ``None``."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..acceptance import AcceptanceCounts
from ..bench import BenchPrompt, PathTotals, run_dflash, spread
from ..config import SamplingConfig
from ..errors import InvalidRequestError
from ..events import Failed, Finished
from ..repetition import is_loop


def run_plain(engine, prompt_ids, sampling: SamplingConfig) -> Finished:
    """Plain decoding through the engine's own baseline (vLLM: its server without a draft)."""
    finished = None
    for event in engine.generate(prompt_ids, replace(sampling, block_size=1), None, slot_details=False,
                                 speculative=False):
        if isinstance(event, Failed):
            raise InvalidRequestError(f"generation failed: {event.message}")
        if isinstance(event, Finished):
            finished = event
    return finished


@dataclass
class SideBySide:
    rows: list[dict] = field(default_factory=list)
    paths: dict = field(default_factory=lambda: {name: PathTotals() for name in PATHS})
    taus: dict = field(default_factory=lambda: {"vllm_dflash": [], "local_dflash": []})
    positions: AcceptanceCounts = field(default_factory=AcceptanceCounts)  # vLLM DFlash


PATHS = ("vllm_plain", "vllm_dflash", "local_plain", "local_dflash")


def measure_prompt(engine, local, item: BenchPrompt, sampling: SamplingConfig, result: SideBySide) -> dict:
    ids = engine.encode(item.prompt, raw=item.raw)
    sampling_i = engine.check_request(ids, sampling)
    runs = {"vllm_plain": run_plain(engine, ids, sampling_i)}
    runs["vllm_dflash"], cycles = run_dflash(engine, ids, sampling_i, None)
    if local is not None:
        runs["local_plain"] = run_plain(local, ids, sampling_i)
        runs["local_dflash"], _ = run_dflash(local, ids, sampling_i, None)
    for name, finished in runs.items():
        result.paths[name].add(finished.new_tokens, finished.total_ms / 1000)
    for name in ("vllm_dflash", "local_dflash"):
        if name in runs:
            result.taus[name].extend(runs[name].acceptance_lengths)
    for cycle in cycles:
        result.positions.add(cycle.block_size, cycle.accepted, cycle.tau)
    plain, dflash = runs["vllm_plain"], runs["vllm_dflash"]
    ids_seen = {tuple(f.token_ids) for f in runs.values()}
    row = {
        "name": item.name, "prompt": item.label[:80], "raw": item.raw, "tokens": dflash.new_tokens,
        "hf_tokens_per_s": None, "block1_tokens_per_s": round(plain.tokens_per_s, 3),
        "dflash_tokens_per_s": round(dflash.tokens_per_s, 3),
        "speedup": round(dflash.tokens_per_s / plain.tokens_per_s, 3) if plain.tokens_per_s else 0.0,
        "mean_acceptance_length": round(dflash.mean_acceptance_length, 3),
        "per_position_acceptance": [round(p, 3) for p in dflash.per_position_acceptance],
        "identical": len(ids_seen) == 1, "loop": is_loop(list(dflash.token_ids)), "finish_reason": dflash.reason,
        "plain_paths_disagree": False,
    }
    if local is not None:
        row["local_block1_tokens_per_s"] = round(runs["local_plain"].tokens_per_s, 3)
        row["local_dflash_tokens_per_s"] = round(runs["local_dflash"].tokens_per_s, 3)
    result.rows.append(row)
    return row


def bench_vllm(engine, prompts: list[BenchPrompt], sampling: SamplingConfig, progress=None, local=None) -> dict:
    """``engine``: a VLLMEngine; ``local``: a LocalEngine on the same pair, or None."""
    if not engine.speculative:
        raise InvalidRequestError("bench --engine vllm needs a DFlash server (a draft): this one does not speculate")
    warm_ids = engine.encode(prompts[0].prompt, raw=prompts[0].raw)
    short = engine.check_request(warm_ids, replace(sampling, max_new_tokens=min(16, sampling.max_new_tokens)))
    for candidate in filter(None, (engine, local)):  # starts vLLM's plain server too
        run_plain(candidate, warm_ids, short)
        run_dflash(candidate, warm_ids, short, None)
    result = SideBySide()
    for number, item in enumerate(prompts, 1):
        row = measure_prompt(engine, local, item, sampling, result)
        if progress:
            progress(number, len(prompts), row)
    return summarize_vllm(result, sampling, engine, local is not None)


def summarize_vllm(result: SideBySide, sampling: SamplingConfig, engine, with_local: bool) -> dict:
    paths = {name: totals.as_dict() for name, totals in result.paths.items()}
    plain, df = paths["vllm_plain"], paths["vllm_dflash"]
    taus = result.taus["vllm_dflash"]
    dflash = dict(df, mean_acceptance_length=round(sum(taus) / len(taus), 4) if taus else 0.0,
                  per_position_acceptance=[round(p, 4) for p in result.positions.per_position_acceptance],
                  tau_histogram={str(t): taus.count(t) for t in range(1, engine.block_size + 1)})
    summary = {
        "model": engine.name, "engine": "vllm", "device": engine.info()["device"], "threads": None,
        "block_size": engine.block_size, "temperature": sampling.temperature,
        "max_new_tokens": sampling.max_new_tokens, "prompts": len(result.rows),
        "identical": sum(r["identical"] for r in result.rows), "loops": sum(r["loop"] for r in result.rows),
        "speedup": round(df["tokens_per_s"] / plain["tokens_per_s"], 3) if plain["tokens_per_s"] else 0.0,
        "ar": dict(plain, path="vLLM without a draft"), "hf_generate": None, "block1": plain, "dflash": dflash,
        "per_prompt": result.rows,
        "per_prompt_speedup": spread([r["speedup"] for r in result.rows]),
        "per_prompt_tau": spread([r["mean_acceptance_length"] for r in result.rows]),
        "plain_paths_disagree": [],  # one plain path on vLLM: nothing to disagree with
    }
    if with_local:
        local_taus = result.taus["local_dflash"]
        summary["local"] = {
            "block1": paths["local_plain"],
            "dflash": dict(paths["local_dflash"], mean_acceptance_length=round(sum(local_taus) / len(local_taus), 4)
                           if local_taus else 0.0),
            "speedup": round(paths["local_dflash"]["tokens_per_s"] / paths["local_plain"]["tokens_per_s"], 3)
            if paths["local_plain"]["tokens_per_s"] else 0.0,
        }
    return summary
