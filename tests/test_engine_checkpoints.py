"""Loading real-format checkpoints: the z-lab draft format round trip, and every bad
checkpoint giving its own clear error."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from app.cli import main
from engine.config import EngineConfig, SamplingConfig
from engine.draft import load_draft
from engine.errors import CheckpointError, IncompatibleDraftError
from engine.events import Finished
from engine.runtime import Engine
from tests.tiny_models import save_tiny_pair

Z_LAB_KEYS = {
    "fc.weight", "hidden_norm.weight", "norm.weight",
    "layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight",
    "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight", "layers.0.self_attn.q_norm.weight", "layers.0.self_attn.k_norm.weight",
    "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
}


@pytest.fixture()
def pair(tmp_path):
    return save_tiny_pair(tmp_path)


def engine_for(target_dir, draft_dir):
    return Engine.load(EngineConfig(target=str(target_dir), draft=str(draft_dir)))


def final(engine, prompt="def add(a, b):", **kw):
    events = list(engine.generate(engine.encode(prompt, raw=True), SamplingConfig(max_new_tokens=kw.pop("n", 24), **kw)))
    assert isinstance(events[-1], Finished), events[-1]
    return events[-1]


def test_saved_draft_is_in_z_lab_format(pair):
    _, draft_dir, target, draft, _ = pair
    assert set(load_file(str(draft_dir / "model.safetensors"))) == Z_LAB_KEYS
    config = json.loads((draft_dir / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["block_size"] == 8
    assert config["dflash_config"]["mask_token_id"] == draft.mask_token_id
    assert config["dflash_config"]["target_layer_ids"] == draft.target_layer_ids
    assert config["num_target_layers"] == target.config.num_hidden_layers


def test_draft_round_trip_gives_identical_outputs(pair):
    target_dir, draft_dir, target, draft, _ = pair
    loaded = load_draft(draft_dir)
    for name, tensor in draft.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0)
    noise = torch.randn(1, 8, draft.config.hidden_size)
    ctx = torch.randn(1, 5, draft.fc.in_features)
    pos = torch.arange(13)[None]
    torch.testing.assert_close(loaded(noise, ctx, pos), draft(noise, ctx, pos), rtol=0, atol=0)
    a = final(engine_for(target_dir, draft_dir))
    b = final(engine_for(target_dir, draft_dir), block_size=1)
    assert a.token_ids == b.token_ids


def test_block_size_inside_dflash_config_and_model_prefix(pair, tmp_path):
    target_dir, draft_dir, *_ = pair
    moved = tmp_path / "repo" / "dflash"  # MiMo-style subfolder
    shutil.copytree(draft_dir, moved)
    config = json.loads((moved / "config.json").read_text())
    config["dflash_config"]["block_size"] = config.pop("block_size") // 2
    (moved / "config.json").write_text(json.dumps(config))
    weights = load_file(str(moved / "model.safetensors"))
    save_file({f"model.{k}": v for k, v in weights.items()}, str(moved / "model.safetensors"))
    draft = load_draft(moved)
    assert draft.block_size == 4


def test_bad_checkpoints_give_clear_errors(pair, tmp_path):
    target_dir, draft_dir, target, *_ = pair
    with pytest.raises(CheckpointError, match="not found"):
        engine_for(target_dir, tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no such directory"):
        Engine.load(EngineConfig(target=str(tmp_path / "missing-target")))

    pickled = tmp_path / "pickled"
    shutil.copytree(draft_dir, pickled)
    (pickled / "model.safetensors").unlink()
    torch.save({"fc.weight": torch.zeros(1)}, pickled / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pickle"):
        engine_for(target_dir, pickled)

    no_config = tmp_path / "noconfig"
    shutil.copytree(draft_dir, no_config)
    (no_config / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        engine_for(target_dir, no_config)

    def variant(name, edit):
        path = tmp_path / name
        shutil.copytree(draft_dir, path)
        config = json.loads((path / "config.json").read_text())
        edit(config)
        (path / "config.json").write_text(json.dumps(config))
        return path

    layers = target.config.num_hidden_layers
    rows = target.get_input_embeddings().weight.shape[0]
    with pytest.raises(IncompatibleDraftError, match="beyond the target"):
        engine_for(target_dir, variant("layers", lambda c: (c["dflash_config"].update(target_layer_ids=[layers + 3]), c.update(num_target_layers=None))))
    with pytest.raises(IncompatibleDraftError, match="mask_token_id"):
        engine_for(target_dir, variant("mask", lambda c: c["dflash_config"].update(mask_token_id=rows + 5)))
    with pytest.raises(IncompatibleDraftError, match="vocabulary"):
        engine_for(target_dir, variant("vocab", lambda c: c.update(vocab_size=rows * 2)))
    with pytest.raises(IncompatibleDraftError, match="layer target"):
        engine_for(target_dir, variant("depth", lambda c: c.update(num_target_layers=layers + 10)))
    # a wider draft: config and weights agree with each other but not with the target
    wide = tmp_path / "wide"
    wide.mkdir()
    from engine.draft import DFlashDraftModel, new_draft_config, save_draft
    config = new_draft_config(target.config, 1, 8, rows - 1)
    config.hidden_size *= 2
    config.head_dim = config.hidden_size // config.num_attention_heads
    save_draft(DFlashDraftModel(config), wide)
    with pytest.raises(IncompatibleDraftError, match="hidden size"):
        engine_for(target_dir, wide)
    # weights that do not match their own config
    broken = variant("broken", lambda c: c.update(intermediate_size=c["intermediate_size"] * 2))
    with pytest.raises(CheckpointError, match="shape"):
        engine_for(target_dir, broken)


def test_a_library_the_target_needs_is_named_in_one_line(pair, monkeypatch):
    """A vision-language checkpoint whose vision tower needs a library this environment lacks
    (Gemma 3n's needs timm): transformers says so over several lines."""
    import transformers

    target_dir, *_ = pair

    def needs_timm(*_args, **_kwargs):
        raise ImportError("\nTimmWrapperModel requires the timm library but it was not found in your environment. "
                          "You can install it with pip:\n`pip install timm`. Please note that you may need to "
                          "restart your runtime after installation.\n")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", needs_timm)
    with pytest.raises(CheckpointError) as refused:
        Engine.load(EngineConfig(target=str(target_dir), speculative=False))
    message = str(refused.value)
    assert "\n" not in message and "requires the timm library" in message and "`pip install timm`" in message


def test_cli_reports_errors_without_traceback(pair, tmp_path, capsys):
    target_dir, *_ = pair
    code = main(["generate", "--target", str(target_dir), "--draft", str(tmp_path / "missing"), "hi"])
    assert code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_cli_generate_json(pair, capsys):
    target_dir, draft_dir, *_ = pair
    code = main(["generate", "--target", str(target_dir), "--draft", str(draft_dir), "--max-new-tokens", "20",
                 "--json", "def add(a, b):"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) >= {"text", "token_ids", "acceptance_lengths", "tokens_per_s", "finish_reason"}
    assert 1 + sum(result["acceptance_lengths"]) == len(result["token_ids"])
    engine = engine_for(target_dir, draft_dir)
    assert result["token_ids"] == list(final(engine, n=20, block_size=1).token_ids)


def test_cli_bench_json(pair, tmp_path, capsys):
    target_dir, draft_dir, *_ = pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):", "kind": "complete"}\n{"prompt": "class Stack:", "kind": "complete"}\n'
                       '{"messages": [{"role": "user", "content": "Add two numbers."}]}\n')
    code = main(["bench", "--target", str(target_dir), "--draft", str(draft_dir), "--prompts", str(prompts),
                 "--max-new-tokens", "16", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["prompts"] == 3 and result["identical"] == 3
    assert {"tokens", "seconds", "tokens_per_s"} <= set(result["ar"]) and {"tokens", "seconds", "tokens_per_s"} <= set(result["dflash"])
    assert "mean_acceptance_length" in result["dflash"] and "per_position_acceptance" in result["dflash"]
    assert result["speedup"] > 0
    speedups = sorted(row["speedup"] for row in result["per_prompt"])
    assert result["per_prompt_speedup"]["median"] == speedups[1]
    assert (result["per_prompt_speedup"]["min"], result["per_prompt_speedup"]["max"]) == (speedups[0], speedups[-1])
    assert result["plain_paths_disagree"] == [r["name"] for r in result["per_prompt"] if r["plain_paths_disagree"]]
    # chat requests and code prefixes each get their own figures; they add up to the aggregate
    kinds = result["by_kind"]
    assert {k: v["prompts"] for k, v in kinds.items()} == {"chat": 1, "prefix": 2}
    assert sum(v["identical"] for v in kinds.values()) == result["identical"]
    assert all(v["mean_acceptance_length"] >= 1.0 and v["speedup"] > 0 for v in kinds.values())
    assert min(v["mean_acceptance_length"] for v in kinds.values()) <= result["dflash"]["mean_acceptance_length"] \
        <= max(v["mean_acceptance_length"] for v in kinds.values())


def test_cli_bench_labels_custom_prompts_by_their_words_and_explains_its_columns(pair, tmp_path, capsys):
    target_dir, draft_dir, *_ = pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):", "kind": "complete"}\n'
                       '{"name": "stack", "prompt": "class Stack:", "kind": "complete"}\n')
    assert main(["bench", "--target", str(target_dir), "--draft", str(draft_dir), "--prompts", str(prompts),
                 "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    for column in ("hf", "block1", "dflash"):  # each column is said once, before the first line
        assert any(line.split()[:1] == [column] for line in out.splitlines()), column
    progress = [line for line in out.splitlines() if line.startswith("[")]
    assert progress[0].startswith("[1/2] def add(a, b):") and progress[1].startswith("[2/2] stack")


def test_bench_repeat_runs_every_path_n_times_and_keeps_the_fastest(pair, monkeypatch):
    from engine import bench as bench_module
    from engine.bench import BenchPrompt, Run, bench, fastest
    from engine.errors import InvalidRequestError

    assert fastest([Run("a", 10, 1.0), Run("b", 10, 0.5), Run("c", 12, 0.8)]) == "b"  # tokens per second decides
    engine = engine_for(*pair[:2])
    calls = {"hf": 0, "loop": 0}
    real_hf, real_run = engine.hf_generate, bench_module.run_dflash

    def hf(ids, sampling):
        calls["hf"] += 1
        return real_hf(ids, sampling)

    def loop(*args):
        calls["loop"] += 1
        return real_run(*args)

    monkeypatch.setattr(engine, "hf_generate", hf)
    monkeypatch.setattr(bench_module, "run_dflash", loop)
    prompts = [BenchPrompt("def add(a, b):", raw=True), BenchPrompt("Add two numbers.")]
    result = bench(engine, prompts, SamplingConfig(max_new_tokens=8), repeat=3)
    # one warm-up of each path, then 3 runs of each path per prompt
    assert calls == {"hf": 1 + 3 * 2, "loop": 2 + 2 * 3 * 2}
    assert result["repeat"] == 3 and result["identical"] == 2
    with pytest.raises(InvalidRequestError, match="repeat"):
        bench(engine, prompts, SamplingConfig(max_new_tokens=8), repeat=0)


def test_bench_warms_up_on_fixed_blocks_so_no_fallback_memory_reaches_the_timed_replies(pair, monkeypatch):
    """The warm-up is a 16-token reply: with the fallback on it, a badly drafted opening turned
    speculation off and the policy's memory started the timed replies there."""
    from engine import bench as bench_module
    from engine.bench import BenchPrompt, bench
    from engine.config import FallbackConfig

    engine = engine_for(*pair[:2])
    calls = []
    real_run = bench_module.run_dflash

    def loop(engine_, ids, sampling, fallback, *rest):
        calls.append((sampling.block_size, sampling.max_new_tokens, fallback))
        return real_run(engine_, ids, sampling, fallback, *rest)

    monkeypatch.setattr(bench_module, "run_dflash", loop)
    fallback = FallbackConfig()
    bench(engine, [BenchPrompt("Add two numbers.")], SamplingConfig(max_new_tokens=24, block_size=8), fallback)
    warm_up = [call for call in calls if call[1] != 24]
    timed = [call for call in calls if call[1] == 24]
    assert {block for block, _, _ in warm_up} == {1, 4, 8}  # every size the fallback may pick is warm
    assert all(used is None for _, _, used in warm_up)
    assert [used for block, _, used in timed if block == 8] == [fallback]


def test_generate_refuses_a_bad_request_when_called_before_any_event(pair):
    """The Engine interface promise callers rely on (ui.chat.generation checks nothing itself)."""
    from engine.errors import InvalidRequestError

    engine = engine_for(*pair[:2])
    with pytest.raises(InvalidRequestError, match="block_size must be between 1 and 16"):
        engine.generate(engine.encode("def f():", raw=True), SamplingConfig(block_size=17))  # not iterated


def test_replies_carry_the_measured_cycle_cost_once_costs_are_measured(pair):
    from engine.events import Cycle

    engine = engine_for(*pair[:2])
    ids = engine.encode("def add(a, b):", raw=True)

    def costs_on_cycles():
        return [e.cost_in_plain_steps for e in engine.generate(ids, SamplingConfig(max_new_tokens=12)) if isinstance(e, Cycle)]

    assert set(costs_on_cycles()) == {None}  # nothing measured yet: no estimate rather than a guess
    measured = engine.measure_costs()
    assert set(measured.verify_ms) >= {1, engine.block_size} and measured.verify_ms[1] > 0
    steps = engine.plain_steps(engine.block_size)
    assert steps[1] == 1.0 and all(s > 0 for s in steps.values())
    assert set(costs_on_cycles()) <= set(steps.values()) and None not in costs_on_cycles()


def test_the_next_reply_with_the_same_settings_starts_from_the_fallback_policys_memory(pair):
    from engine.config import FallbackConfig
    from engine.events import Cycle

    engine = engine_for(*pair[:2])
    ids = engine.encode("def add(a, b):", raw=True)

    def blocks(**settings):
        sampling = SamplingConfig(max_new_tokens=40, **settings)
        return [e.block_size for e in engine.generate(ids, sampling, FallbackConfig()) if isinstance(e, Cycle)]

    first = blocks()
    assert first.count(1) > len(first) // 2  # the random draft never pays: the reply runs mostly off
    assert first[0] == engine.block_size  # a fresh start is at full block
    assert blocks()[0] == 1  # the same settings again: start where the last reply ran most (off)
    assert blocks(temperature=0.5, seed=1)[0] == engine.block_size  # other settings: a fresh start
