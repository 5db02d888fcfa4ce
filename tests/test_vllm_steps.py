"""The vLLM client's pure parts: cycles rebuilt from per-step figures, the server command line."""

from pathlib import Path

import pytest

from engine.errors import InvalidRequestError
from engine.interface import Engine as EngineInterface
from engine.vllm import VLLMConfig
from engine.vllm import steps
from engine.vllm.server import plan_server

EMBEDDED = Path(__file__).resolve().parent.parent / "assets" / "models" / "tiny-coder"


def test_acceptance_lengths_cut_the_last_step_to_the_emitted_tokens():
    # 1 prefill token + (3+1) + (7+1) + a last step of 7 accepted cut to 2 tokens by the length limit
    assert steps.acceptance_lengths(15, [3, 7, 7]) == (4, 8, 2)
    assert steps.acceptance_lengths(1, [5]) == ()
    assert steps.acceptance_lengths(4, [0, 0, 0]) == (1, 1, 1)


def test_per_position_acceptance_counts_drafted_slots_only():
    rates = steps.per_position_acceptance([3, 0, 7], [7, 7, 7])
    assert rates[0] == pytest.approx(2 / 3) and rates[2] == pytest.approx(2 / 3) and rates[3] == pytest.approx(1 / 3)
    assert len(rates) == 7


def test_chunk_steps_without_speculation_are_single_tokens_and_merged_blocks_split():
    assert steps.chunk_steps(3, 8, speculative=False) == [0, 0, 0]
    assert steps.chunk_steps(5, 8, speculative=True) == [4]
    assert steps.chunk_steps(10, 8, speculative=True) == [7, 1]


def test_make_cycle_knows_only_accepted_drafts():
    cycle = steps.make_cycle(2, [11, 12, 13], ["a", "b", "c"], 2, 8, anchor=10, anchor_position=40, elapsed_ms=5.0)
    assert cycle.tau == 3 and cycle.bonus == 13 and cycle.draft_tokens == (11, 12)
    assert cycle.rejected == () and cycle.slots == () and cycle.origins() == ("accepted", "accepted", "bonus")
    assert cycle.context_length == 43
    cut = steps.make_cycle(3, [11, 12], ["a", "b"], 5, 8, anchor=10, anchor_position=40, elapsed_ms=5.0)
    assert cut.bonus is None and cut.origins() == ("accepted", "accepted")


def test_server_plan_speculates_with_block_minus_one_and_per_request_metrics():
    config = VLLMConfig(target=str(EMBEDDED / "target"), tensor_parallel_size=2, extra_args=("--seed", "3"))
    plan = plan_server(config, Path("/venv/bin/python"), EMBEDDED / "target", EMBEDDED / "draft", 8123, cpu=True,
                       served_name="tiny-coder")
    argv = list(plan.argv)
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    spec = argv[argv.index("--speculative-config") + 1]
    assert '"method": "dflash"' in spec and '"num_speculative_tokens": 7' in spec and plan.block_size == 8
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    # the CPU build compiles as it does for its own users (inductor, traced once); --enforce-eager only when asked
    assert "--enforce-eager" not in argv and argv[argv.index("--dtype") + 1] == "float32"
    assert argv[argv.index("--max-model-len") + 1] == "1024"  # the tiny target's window
    assert argv[-2:] == ["--seed", "3"] and plan.env["VLLM_CPU_KVCACHE_SPACE"]
    plain = plan_server(config, Path("/p"), EMBEDDED / "target", None, 8124, cpu=False, served_name="t")
    assert "--speculative-config" not in plain.argv and "--enforce-eager" not in plain.argv and plain.block_size == 1
    assert "--per-request-spec-decode-metrics" not in plain.argv  # vLLM refuses it without speculation


def test_config_is_checked_at_the_edge():
    assert VLLMConfig().validate().target is None  # the embedded pair
    with pytest.raises(InvalidRequestError, match="http"):
        VLLMConfig(url="gpu-box:8000").validate()
    with pytest.raises(InvalidRequestError, match="block size"):
        VLLMConfig(target="t", block_size=1).validate()


def test_both_engines_implement_the_interface():
    from engine.runtime import LocalEngine
    from engine.vllm import VLLMEngine

    for cls in (LocalEngine, VLLMEngine):
        for member in ("name", "block_size", "speculative", "has_chat_template", "capabilities", "info", "encode",
                       "decode", "check_request", "generate", "close"):
            assert hasattr(cls, member), (cls, member)
    assert {"generate", "check_request", "encode"} <= set(dir(EngineInterface))


def test_engine_options_become_a_vllm_config_and_a_catalog():
    from app.cli import build_parser
    from app.cmd_serve import app_config
    from app.options import vllm_config
    from app.wiring import available_models

    args = build_parser().parse_args([
        "generate", "--engine", "vllm", "--engine-url", "http://gpu-box:8000/v1", "--engine-api-key", "k",
        "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2", "--vllm-args", "--gpu-memory-utilization 0.9",
        "--vllm-args", "--seed 1", "--block-size", "1", "hi"])
    config = vllm_config(args)
    assert config.url == "http://gpu-box:8000/v1" and config.api_key == "k"
    assert (config.tensor_parallel_size, config.pipeline_parallel_size) == (4, 2)
    assert config.extra_args == ("--gpu-memory-utilization", "0.9", "--seed", "1")
    assert config.block_size is None  # block 1 is plain decoding, not a server setting
    assert vllm_config(build_parser().parse_args(["generate", "hi"])) is None

    serve = app_config(build_parser().parse_args(["serve", "--no-browser", "--engine", "vllm", "--engine-url",
                                                   "http://127.0.0.1:8000"]))
    assert serve.vllm.url == "http://127.0.0.1:8000"
    assert [c.key for c in available_models(serve)] == ["vLLM at http://127.0.0.1:8000"]


def test_a_stored_vllm_reply_says_what_vllm_does_not_report():
    from engine.events import event_to_dict
    from ui.chat.render import render_token_view
    from ui.chat.trace import ReplyTrace

    cycles = [event_to_dict(steps.make_cycle(1, [5, 6, 7], ["a", "b", "c"], 2, 8, anchor=4, anchor_position=10,
                                             elapsed_ms=3.0))]
    vllm = ReplyTrace.from_stored("xabc", cycles, {"settings": {"engine": "vllm"}, "status": "complete"})
    assert "vLLM does not report rejected drafts" in vllm.engine_note
    assert vllm.estimated_speedup() is None  # no draft/verify timings: no cost-based estimate
    html = render_token_view(vllm)
    assert "vLLM does not report rejected drafts" in html and 'class="tok" data-origin="rejected"' not in html
    assert html.count('class="tok" data-origin="accepted"') == 2
    local = ReplyTrace.from_stored("xabc", cycles, {"settings": {"engine": "local"}, "status": "complete"})
    assert local.engine_note == "" and local.measured_timings


def test_vllm_streams_are_read_as_the_sse_spec_frames_them():
    """Comments, an event whose data spans two lines, an empty keep-alive, then [DONE]."""
    import httpx

    from engine.errors import InvalidRequestError
    from engine.vllm.client import sse_events

    def stream(text: str) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=text.encode())

    body = (': keep-alive\n\ndata: {"choices": [{"token_ids": [1, 2]}]}\n\n'
            'data: {"choices":\ndata:  [{"token_ids": [3]}]}\n\nevent: ping\ndata:\n\n'
            'data: [DONE]\n\ndata: {"choices": [{"token_ids": [9]}]}\n\n')
    assert [e["choices"][0]["token_ids"] for e in sse_events(stream(body))] == [[1, 2], [3]]
    with pytest.raises(InvalidRequestError, match="too long"):
        list(sse_events(stream('data: {"error": {"message": "prompt too long"}}\n\n')))


def test_bench_times_vllm_through_its_own_non_streaming_api():
    """`bench --engine vllm` sends vLLM one plain /v1/completions request per reply, as an OpenAI
    client does, and reads τ from vLLM's own per-request metrics (no vLLM needed here)."""
    import json

    import httpx

    from engine.config import SamplingConfig
    from engine.vllm.bench import run_api
    from engine.vllm.client import Endpoint, ServedModel

    sent = []

    def vllm(request: httpx.Request) -> httpx.Response:
        sent.append((request.url.path, request.headers.get("authorization"), json.loads(request.content)))
        return httpx.Response(200, json={"choices": [{"token_ids": [5, 6, 7, 8, 9, 10, 11]}],
                                         "metrics": {"speculative_decoding": {"per_step_accepted": [3, 7]}}})

    class Engine:
        def request_body(self, served, prompt_ids, sampling):
            return {"model": served.endpoint.model, "prompt": prompt_ids, "stream": True,
                    "stream_options": {"include_usage": True}, "return_token_ids": True}

    served = ServedModel(Endpoint("http://vllm.test", "pair", "key"), 2048, "pair", 8)
    with httpx.Client(transport=httpx.MockTransport(vllm)) as http:
        run = run_api(Engine(), served, [1, 2], SamplingConfig(max_new_tokens=7), http)
    path, auth, body = sent[0]
    assert (path, auth) == ("/v1/completions", "Bearer key")
    assert body["stream"] is False and "stream_options" not in body and body["prompt"] == [1, 2]
    assert run.token_ids == (5, 6, 7, 8, 9, 10, 11) and run.new_tokens == 7 and run.seconds > 0
    assert run.taus == (4, 2)  # 1 prefill token + 4 + 2 = 7: the last step cut to what was emitted


def test_bench_lets_each_vllm_server_go_idle_before_timing_another_path(monkeypatch):
    """A vLLM worker busy-polls for a second after each request, and both servers' workers share a
    core on the CPU build: every switch to another process's path waits first (no vLLM needed)."""
    from types import SimpleNamespace

    from engine.bench import BenchPrompt
    from engine.config import SamplingConfig
    from engine.vllm import bench

    order = []
    plain_model, served = object(), object()

    def finished():
        return SimpleNamespace(new_tokens=3, total_ms=10.0, token_ids=[4, 5, 6], tokens_per_s=300.0,
                               acceptance_lengths=[3], per_position_acceptance=[1.0], reason="length")

    def run_api(engine, model, ids, sampling, http):
        order.append("vllm " + ("plain" if model is plain_model else "dflash"))
        return bench.ApiRun((4, 5, 6), 0.01, (3,))

    def run_plain(engine, ids, sampling):
        order.append(f"{engine.kind} plain")
        return finished()

    def run_dflash(engine, ids, sampling, fallback):
        order.append(f"{engine.kind} dflash")
        return finished(), []

    monkeypatch.setattr(bench, "run_api", run_api)
    monkeypatch.setattr(bench, "run_plain", run_plain)
    monkeypatch.setattr(bench, "run_dflash", run_dflash)
    monkeypatch.setattr(bench, "settle", lambda: order.append("wait"))
    client = SimpleNamespace(kind="client", served=served, plain_model=lambda: plain_model,
                             encode=lambda prompt, raw: [1, 2], check_request=lambda ids, sampling: sampling)
    local = SimpleNamespace(kind="local")
    bench.measure_prompt(client, local, BenchPrompt("add two numbers"), SamplingConfig(max_new_tokens=3),
                         bench.SideBySide(), http=None)
    assert order == ["vllm plain", "wait", "vllm dflash", "wait", "client plain", "wait", "client dflash", "wait",
                     "local plain", "local dflash"]
    assert bench.SERVER_IDLE_S > 1.0  # vLLM's busy-poll lasts 1 s
