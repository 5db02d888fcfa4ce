"""vLLM as the Studio's second engine, for real: the CPU build serving DFlash with the embedded
pair (one server for the whole run, the ``vllm_engine`` fixture). Every check compares with the
local engine at run time, never with stored ids (the embedded pair may be retrained)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from engine.config import FallbackConfig, SamplingConfig
from engine.errors import InvalidRequestError
from engine.events import Cycle, Failed, Finished, Started

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [  # (prompt, raw): chat prompts through the template, and raw code prefixes
    ("Write a Python function that reverses a string.", False),
    ("Explain what a list comprehension is, with an example.", False),
    ("How do I read a JSON file in Python?", False),
    ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", True),
    ("class Stack:\n    \"\"\"A simple last-in, first-out stack.\"\"\"\n\n    def __init__(self):\n", True),
]
GREEDY = SamplingConfig(max_new_tokens=64)


def run(engine, prompt_ids, sampling=GREEDY, **kwargs):
    events = list(engine.generate(prompt_ids, sampling, FallbackConfig(enabled=False), **kwargs))
    failed = [e for e in events if isinstance(e, Failed)]
    assert not failed, failed[0].message
    return events


@pytest.mark.parametrize("prompt, raw", PROMPTS, ids=[f"p{i}" for i in range(len(PROMPTS))])
def test_greedy_token_ids_equal_the_local_engine(vllm_engine, local_engine, prompt, raw):
    ids = vllm_engine.encode(prompt, raw=raw)
    assert ids == local_engine.encode(prompt, raw=raw)
    ours = run(local_engine, ids)[-1]
    theirs = run(vllm_engine, ids)[-1]
    assert isinstance(theirs, Finished)
    assert list(theirs.token_ids) == list(ours.token_ids)
    assert theirs.text == ours.text and theirs.reason == ours.reason


@pytest.mark.parametrize("prompt, raw", PROMPTS[:3], ids=["p0", "p1", "p2"])
def test_acceptance_lengths_are_consistent_with_the_emitted_tokens(vllm_engine, prompt, raw):
    events = run(vllm_engine, vllm_engine.encode(prompt, raw=raw))
    started, cycles, finished = events[0], [e for e in events if isinstance(e, Cycle)], events[-1]
    assert isinstance(started, Started) and started.speculative and started.block_size == vllm_engine.block_size == 8
    taus = list(finished.acceptance_lengths)
    assert finished.cycles == len(taus) and 1 + sum(taus) == len(finished.token_ids)
    assert all(1 <= tau <= vllm_engine.block_size for tau in taus)
    if vllm_engine.merged_chunks == 0:  # chunks matched vLLM's per-step list: the cycles are exact
        assert [c.tau for c in cycles] == taus
    emitted = [started.first_token] + [t for c in cycles for t in c.emitted]
    assert emitted == list(finished.token_ids)
    assert started.first_text + "".join(c.emitted_text for c in cycles) == finished.text
    for cycle in cycles:  # only what vLLM reports: accepted drafts and the target's own token
        assert cycle.rejected == () and cycle.slots == ()
        assert cycle.draft_tokens == cycle.emitted[: cycle.accepted]
        assert cycle.origins().count("bonus") == (1 if cycle.bonus is not None else 0)
    assert len(finished.per_position_acceptance) == vllm_engine.block_size - 1
    assert all(0.0 <= p <= 1.0 for p in finished.per_position_acceptance)
    assert finished.mean_acceptance_length > 1.5  # the embedded draft does draft (greedy τ ≈ 5 locally)
    assert finished.tokens_per_s > 0 and finished.prefill_ms > 0


def test_sampled_replies_add_up(vllm_engine):
    """T > 0: vLLM verifies drafts by rejection sampling; the accounting holds all the same. (A seed
    does not make vLLM's speculative replies repeatable: measured here, two runs with seed 7 differ.)"""
    ids = vllm_engine.encode(PROMPTS[0][0])
    finished = run(vllm_engine, ids, replace(GREEDY, temperature=0.8, top_p=0.95, seed=7, max_new_tokens=32))[-1]
    assert isinstance(finished, Finished) and 1 + sum(finished.acceptance_lengths) == finished.new_tokens


def test_stop_ends_the_reply_and_the_server_keeps_serving(vllm_engine):
    ids = vllm_engine.encode(PROMPTS[1][0])
    cancel = threading.Event()
    events = []
    for event in vllm_engine.generate(ids, replace(GREEDY, max_new_tokens=400), None, cancel):
        events.append(event)
        if isinstance(event, Cycle):
            cancel.set()
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.reason == "cancelled" and finished.new_tokens < 400
    assert isinstance(run(vllm_engine, ids)[-1], Finished)


def test_bad_requests_are_refused_with_a_clear_message(vllm_engine):
    ids = vllm_engine.encode(PROMPTS[0][0])
    with pytest.raises(InvalidRequestError, match="fixes the block size"):
        vllm_engine.generate(ids, replace(GREEDY, block_size=4))
    with pytest.raises(InvalidRequestError, match="context window is 1024"):
        vllm_engine.check_request(list(range(5, 1100)), GREEDY)
    assert vllm_engine.check_request(ids, replace(GREEDY, max_new_tokens=5000)).max_new_tokens == 1024 - len(ids) - 1


def test_generate_cli_through_a_running_server_prints_the_local_token_ids(vllm_engine, local_engine):
    """`generate --engine vllm --engine-url` against the fixture's server gives the local engine's greedy token ids."""
    prompt = "Write a function that checks whether a number is prime."
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "app.cli", "generate", "--engine", "vllm", "--engine-url",
               vllm_engine.served.endpoint.url + "/v1", "--raw", "--json", "--temperature", "0",
               "--max-new-tokens", "64", prompt]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    local = run(local_engine, local_engine.encode(prompt, raw=True))[-1]
    assert summary["token_ids"] == list(local.token_ids)
    assert summary["engine"] == "vllm" and summary["block_size"] == 8
    assert 1 + sum(summary["acceptance_lengths"]) == len(summary["token_ids"])


def test_a_dead_server_url_is_a_clear_error():
    from engine.errors import EngineUnavailableError
    from engine.vllm import VLLMConfig, VLLMEngine
    from engine.vllm.server import free_port

    with pytest.raises(EngineUnavailableError, match="cannot reach the vLLM server"):
        VLLMEngine.open(VLLMConfig(url=f"http://127.0.0.1:{free_port()}"))


def test_bench_and_compare_measure_plain_decoding_on_a_second_vllm_server(vllm_engine, local_engine):
    """bench --engine vllm's fields are the local bench's; plain decoding runs on a vLLM server
    without a draft (started here, once), and every path (vLLM's API, the Studio's client, the
    local engine; plain and DFlash) gives the same greedy tokens."""
    from engine.bench import BenchPrompt
    from engine.vllm.bench import bench_vllm
    from ui.teach.compare import run_comparison

    prompts = [BenchPrompt(p, raw, f"p{i}") for i, (p, raw) in enumerate(PROMPTS[:2])]
    summary = bench_vllm(vllm_engine, prompts, SamplingConfig(max_new_tokens=24), local=local_engine)
    for key in ("model", "device", "block_size", "temperature", "max_new_tokens", "prompts", "identical", "loops",
                "speedup", "ar", "hf_generate", "block1", "dflash", "per_prompt", "per_prompt_speedup",
                "per_prompt_tau", "plain_paths_disagree"):
        assert key in summary, key
    assert summary["identical"] == 2 and summary["engine"] == "vllm" and summary["hf_generate"] is None
    assert summary["dflash"]["mean_acceptance_length"] > 1.5 and summary["block1"]["tokens_per_s"] > 0
    assert summary["local"]["dflash"]["tokens_per_s"] > 0 and summary["ar"]["path"] == "vLLM without a draft"
    assert vllm_engine.plain_server is not None and vllm_engine.plain_server.alive()
    # vLLM timed through its own non-streaming API; the Studio's streaming client apart, same tokens
    assert summary["timed_by"].startswith("vLLM's own /v1/completions, non-streaming")
    client = summary["studio_client"]
    assert client["dflash"]["tokens"] == summary["dflash"]["tokens"] and client["block1"]["tokens_per_s"] > 0
    assert isinstance(client["overhead_ms_per_reply"], float)
    assert all("client_dflash_tokens_per_s" in row for row in summary["per_prompt"])

    settings = {"max_new_tokens": 24, "temperature": 0.0, "block_size": 8}
    plain, dflash = run_comparison(vllm_engine, PROMPTS[0][0], False, settings)
    assert plain.error is None and dflash.error is None and plain.token_ids == dflash.token_ids
    assert plain.mean_tau == 1.0 and dflash.mean_tau > 1.5
