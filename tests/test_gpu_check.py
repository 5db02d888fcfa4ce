"""scripts/gpu_check.sh at tiny scale on the CPU: one JSON line with the costs at every block
size, the identical share and tokens/s (on a GPU the same script runs the Qwen3-8B shape)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def load_check():
    """scripts/gpu_check.py as a module (registered first: its dataclasses look themselves up)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
SIZES = ["1", "2", "4", "8", "16"]


def run_check(*args: str, timeout: float) -> dict:
    """The script as a user runs it, in this interpreter (PYTHON: not the .venv it would make)."""
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run(["bash", "scripts/gpu_check.sh", "--tiny", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, out.stdout
    return json.loads(lines[0])


@pytest.mark.slow
def test_the_tiny_check_prints_one_json_line_with_sane_figures():
    result = run_check("--prompts", "6", "--no-compile", timeout=240)
    assert result["device"] == "cpu" and result["dtype"] == "float32" and result["weights"] == "random"
    assert list(result["verify_ms"]) == SIZES and all(ms > 0 for ms in result["verify_ms"].values())
    assert list(result["draft_ms"]) == SIZES[1:] and all(ms > 0 for ms in result["draft_ms"].values())
    # a cycle's cost in plain steps is its draft pass plus its verify, over one plain verify
    verify, draft, steps = result["verify_ms"], result["draft_ms"], result["cycle_in_plain_steps"]
    for size in SIZES:
        assert steps[size] == pytest.approx((verify[size] + draft.get(size, 0.0)) / verify["1"], abs=1e-3), size
    assert result["prompts"] == result["prompts_asked"] == 6
    # fp32: DFlash is lossless, every greedy reply equals plain decoding's
    assert result["identical"] == 6 and result["identical_share"] == 1.0
    assert result["plain_tokens_per_s"] > 0 and result["dflash_tokens_per_s"] > 0
    assert 1.0 <= result["mean_acceptance_length"] <= result["block_size"] == 16
    assert result["draft_parameters"] > 0 and result["target_parameters"] > result["draft_parameters"]
    assert 0 < result["seconds"] < 120
    assert result["compiled"] is None


@pytest.mark.slow
def test_the_tiny_check_compares_the_compiled_path_with_the_eager_one():
    """What the GPU check reports about the compiled path (CUDA graphs there; inductor's CPU
    kernels here): the same replies as the eager path, no recompile after warm-up, one graph per
    compiled pass, tokens/s of both."""
    result = run_check("--prompts", "2", "--max-new-tokens", "16", timeout=900)
    compiled = result["compiled"]
    assert compiled["ready"] is True and compiled["mode"] == "default", compiled
    assert compiled["prompts"] == result["prompts"] == 2
    assert compiled["identical_to_eager"] == 2 and compiled["identical"] == 2
    assert compiled["recompiles_after_warm_up"] == 0
    assert compiled["passes"] == 4  # verifies of 16, 4 and 1 token, a draft pass of 16
    assert compiled["graphs"] <= compiled["passes"]  # no pass split by a graph break
    assert compiled["plain_tokens_per_s"] > 0 and compiled["dflash_tokens_per_s"] > 0 and compiled["compile_s"] > 0


def test_the_full_shape_is_the_published_qwen3_8b_draft_config():
    """The full check's shape against the published config of Qwen3-8B's DFlash draft (stored in
    tests/data, source in tests/data/SOURCES.md), and its feature layers against the rule the
    engine spreads them by."""
    from engine.draft import default_target_layer_ids

    config = json.loads((ROOT / "tests" / "data" / "qwen3-8b-dflash-config.json").read_text())
    shape = load_check().QWEN3_8B
    assert (shape.vocab, shape.hidden, shape.intermediate, shape.layers, shape.heads, shape.kv_heads,
            shape.head_dim) == (config["vocab_size"], config["hidden_size"], config["intermediate_size"],
                                config["num_target_layers"], config["num_attention_heads"],
                                config["num_key_value_heads"], config["head_dim"])
    assert (shape.draft_layers, shape.block_size) == (config["num_hidden_layers"], config["block_size"])
    assert list(shape.draft_layer_ids) == default_target_layer_ids(shape.layers, shape.draft_layers)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the full check runs")
def test_without_a_gpu_the_full_check_says_so(capsys):
    check = load_check()
    with pytest.raises(SystemExit):
        check.parse_args([])
    assert "no CUDA device here" in capsys.readouterr().err
