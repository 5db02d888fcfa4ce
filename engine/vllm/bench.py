"""``bench --engine vllm``: plain decoding (a vLLM server without a draft) against DFlash (the
DFlash server) on the same prompts and settings, alternating, after a warm-up; optionally the
local engine's plain and DFlash runs on the same prompts in the same run (``local``), for a
side-by-side table. The summary has the local bench's fields; a path vLLM has no counterpart for
(transformers' ``generate()``) is ``None``.

vLLM is timed the way its users run it: one non-streaming request to its own OpenAI-compatible
``/v1/completions`` on a kept-alive connection, from sending the request to the whole reply. The
Studio's own client (streaming, rebuilding a Cycle per verify step for the page) runs the same
prompts too, and its time is reported apart as ``studio_client``, with its overhead per reply:
a figure for the Studio's vLLM mode, not for vLLM.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from ..acceptance import AcceptanceCounts
from ..bench import BenchPrompt, PathTotals, run_dflash, spread
from ..config import SamplingConfig
from ..errors import InvalidRequestError
from ..events import Failed, Finished
from ..repetition import is_loop
from .client import checked_json
from .steps import acceptance_lengths


@dataclass(frozen=True)
class ApiRun:
    """One reply from vLLM's own API: its tokens, the wall time of the request, τ per step."""

    token_ids: tuple[int, ...]
    seconds: float
    taus: tuple[int, ...]

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)


def run_api(engine, served, prompt_ids, sampling: SamplingConfig, http) -> ApiRun:
    """One non-streaming ``/v1/completions`` request, as an OpenAI client sends it (``http``: an
    ``httpx.Client``, so the connection is kept alive between requests as such a client keeps it)."""
    body = dict(engine.request_body(served, prompt_ids, sampling), stream=False)
    body.pop("stream_options", None)
    started = time.perf_counter()
    response = http.post(served.endpoint.url + "/v1/completions", json=body, headers=served.endpoint.headers())
    seconds = time.perf_counter() - started
    data = checked_json(response, "vLLM /v1/completions")
    ids = tuple(int(t) for t in data["choices"][0].get("token_ids") or ())
    spec = (data.get("metrics") or {}).get("speculative_decoding") or {}
    accepted = spec.get("per_step_accepted")
    taus = acceptance_lengths(len(ids), accepted) if accepted is not None else (1,) * max(len(ids) - 1, 0)
    return ApiRun(ids, seconds, taus)


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
    positions: AcceptanceCounts = field(default_factory=AcceptanceCounts)  # vLLM DFlash (the client's cycles)
    overhead_s: list = field(default_factory=list)  # per reply: the Studio client's time minus the API's


PATHS = ("vllm_plain", "vllm_dflash", "client_plain", "client_dflash", "local_plain", "local_dflash")


# After each request a vLLM worker busy-polls its queue for 1 s (vLLM's shm_broadcast), and on the
# CPU build every server's worker is pinned to the same core: the next path waits that long so that
# none is timed while another server's worker still spins beside it.
SERVER_IDLE_S = 1.2


def settle() -> None:
    time.sleep(SERVER_IDLE_S)


def _rate(tokens: int, seconds: float) -> float:
    return round(tokens / seconds, 3) if seconds else 0.0


def measure_prompt(engine, local, item: BenchPrompt, sampling: SamplingConfig, result: SideBySide, http) -> dict:
    ids = engine.encode(item.prompt, raw=item.raw)
    sampling_i = engine.check_request(ids, sampling)
    api = {"vllm_plain": run_api(engine, engine.plain_model(), ids, sampling_i, http)}
    settle()
    api["vllm_dflash"] = run_api(engine, engine.served, ids, sampling_i, http)
    settle()
    client = {"client_plain": run_plain(engine, ids, sampling_i)}
    settle()
    client["client_dflash"], cycles = run_dflash(engine, ids, sampling_i, None)
    if local is not None:
        settle()
        client["local_plain"] = run_plain(local, ids, sampling_i)
        client["local_dflash"], _ = run_dflash(local, ids, sampling_i, None)
    for name, run in api.items():
        result.paths[name].add(run.new_tokens, run.seconds)
    for name, finished in client.items():
        result.paths[name].add(finished.new_tokens, finished.total_ms / 1000)
    for name in ("client_plain", "client_dflash"):
        result.overhead_s.append(client[name].total_ms / 1000 - api[name.replace("client", "vllm")].seconds)
    result.taus["vllm_dflash"].extend(api["vllm_dflash"].taus)
    if "local_dflash" in client:
        result.taus["local_dflash"].extend(client["local_dflash"].acceptance_lengths)
    for cycle in cycles:
        result.positions.add(cycle.block_size, cycle.accepted, cycle.tau)
    plain, dflash = api["vllm_plain"], api["vllm_dflash"]
    ids_seen = {run.token_ids for run in api.values()} | {tuple(f.token_ids) for f in client.values()}
    taus = dflash.taus
    row = {
        "name": item.name, "prompt": item.label[:80], "raw": item.raw, "tokens": dflash.new_tokens,
        "hf_tokens_per_s": None, "block1_tokens_per_s": _rate(plain.new_tokens, plain.seconds),
        "dflash_tokens_per_s": _rate(dflash.new_tokens, dflash.seconds),
        "speedup": round(plain.seconds / dflash.seconds * dflash.new_tokens / plain.new_tokens, 3)
        if dflash.seconds and plain.new_tokens else 0.0,
        "mean_acceptance_length": round(sum(taus) / len(taus), 3) if taus else 0.0,
        "per_position_acceptance": [round(p, 3) for p in client["client_dflash"].per_position_acceptance],
        "identical": len(ids_seen) == 1, "loop": is_loop(list(dflash.token_ids)),
        "finish_reason": client["client_dflash"].reason, "plain_paths_disagree": False,
        "client_block1_tokens_per_s": round(client["client_plain"].tokens_per_s, 3),
        "client_dflash_tokens_per_s": round(client["client_dflash"].tokens_per_s, 3),
    }
    if local is not None:
        row["local_block1_tokens_per_s"] = round(client["local_plain"].tokens_per_s, 3)
        row["local_dflash_tokens_per_s"] = round(client["local_dflash"].tokens_per_s, 3)
    result.rows.append(row)
    return row


def bench_vllm(engine, prompts: list[BenchPrompt], sampling: SamplingConfig, progress=None, local=None) -> dict:
    """``engine``: a VLLMEngine; ``local``: a LocalEngine on the same pair, or None."""
    if not engine.speculative:
        raise InvalidRequestError("bench --engine vllm needs a DFlash server (a draft): this one does not speculate")
    import httpx

    warm_ids = engine.encode(prompts[0].prompt, raw=prompts[0].raw)
    short = engine.check_request(warm_ids, replace(sampling, max_new_tokens=min(16, sampling.max_new_tokens)))
    result = SideBySide()
    with httpx.Client(timeout=httpx.Timeout(engine.config.request_timeout_s, connect=10.0)) as http:
        for candidate in filter(None, (engine, local)):  # starts vLLM's plain server too
            run_plain(candidate, warm_ids, short)
            run_dflash(candidate, warm_ids, short, None)
        for served in (engine.plain_model(), engine.served):
            run_api(engine, served, warm_ids, short, http)
        settle()
        for number, item in enumerate(prompts, 1):
            row = measure_prompt(engine, local, item, sampling, result, http)
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
        "timed_by": "vLLM's own /v1/completions, non-streaming, kept-alive connection",
        "studio_client": {
            "block1": paths["client_plain"], "dflash": paths["client_dflash"],
            "overhead_ms_per_reply": round(1000 * sum(result.overhead_s) / len(result.overhead_s), 2)
            if result.overhead_s else 0.0,
        },
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
