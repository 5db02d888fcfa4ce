"""Targets published quantized (gpt-oss's MXFP4 experts, block-wise FP8 of Qwen3-FP8 and MiMo)
load through the project's loading path and transformers' own quantizers: on this CPU the weights
are dequantized and widened to the compute dtype, and they equal the stored tensors dequantized
here by the published layouts (tests/quantized_twins.py), bit for bit. Greedy DFlash on such a
target equals plain greedy of the same loaded target. A format that cannot load here is refused
at load in one line that names it and what would load it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from app.cli import main
from engine import decode as decode_module
from engine.config import EngineConfig, SamplingConfig
from engine.decode import generate
from engine.draft import save_draft
from engine.errors import UnsupportedQuantizationError
from engine.events import Finished
from engine.loading import load_models, load_target
from engine.quantization import FORMATS, DeviceKernels, pair_bytes, plan_quantization
from tests.quantized_twins import PUBLISHED, QUANTIZED_TWINS, expected_weights, write_quantized_twin
from tests.test_families import NEW_TOKENS, PROMPT, oracle_propose, plain_greedy
from tests.tiny_models import tiny_draft

CPU = torch.device("cpu")
STORED_QUANTIZED = (torch.uint8, torch.float8_e4m3fn)


@pytest.fixture(scope="module", params=sorted(QUANTIZED_TWINS))
def quantized_pair(request, tmp_path_factory):
    """A quantized twin and a draft twin for it, on disk, loaded by ``load_models`` as a user's
    ``--target DIR --draft DIR`` would be."""
    root = tmp_path_factory.mktemp("quantized")
    target_dir = write_quantized_twin(root / "target", request.param)
    unquantized, _ = load_target(target_dir, CPU, torch.float32)
    save_draft(tiny_draft(unquantized, block_size=8), root / "draft")
    models = load_models(EngineConfig(target=str(target_dir), draft=str(root / "draft"), device="cpu"))
    return request.param, target_dir, models


def test_the_twins_are_stored_quantized_in_the_published_layout(quantized_pair):
    name, target_dir, _ = quantized_pair
    stored = load_file(target_dir / "model.safetensors")
    settings = json.loads((target_dir / "config.json").read_text())["quantization_config"]
    published = PUBLISHED[QUANTIZED_TWINS[name][1]]
    assert {key: value for key, value in settings.items() if key != "ignored_layers"} == {
        key: value for key, value in published.items() if key != "ignored_layers"}
    if settings["quant_method"] == "mxfp4":
        blocks = [key for key in stored if key.endswith("_blocks")]
        assert blocks and all(stored[key].dtype == torch.uint8 and stored[key].shape[-1] == 16 for key in blocks)
        assert all(stored[key.replace("_blocks", "_scales")].shape == stored[key].shape[:-1] for key in blocks)
    else:
        scaled = [key.removesuffix("_scale_inv") for key in stored if key.endswith("_scale_inv")]
        assert scaled and all(stored[key].dtype == torch.float8_e4m3fn for key in scaled)
        assert all(stored[key + "_scale_inv"].shape == tuple(-(-side // 128) for side in stored[key].shape)
                   for key in scaled)
        assert not any(key + "_scale_inv" in stored for key in settings.get("ignored_layers", ())), \
            "the published skip list stays unquantized"


def test_loaded_weights_are_the_stored_tensors_dequantized(quantized_pair):
    name, target_dir, models = quantized_pair
    state = models.target.state_dict()
    expected = expected_weights(target_dir)
    assert set(state) == set(expected), name
    assert {tensor.dtype for tensor in state.values() if tensor.is_floating_point()} == {torch.float32}
    method = json.loads((target_dir / "config.json").read_text())["quantization_config"]["quant_method"]
    assert models.quantization == f"{FORMATS[method].name}, dequantized to float32 at load"  # no kernel on a CPU
    different = [key for key in expected if not torch.equal(state[key], expected[key])]
    assert not different, (name, different[:3])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_dequantized_target_computes_in_the_dtypes_of_its_unquantized_twin(quantized_pair, dtype, tmp_path):
    """Dequantized to bf16 (the GPU default) or fp16: each weight is in the dtype transformers
    gives it when the same twin is stored unquantized (some stay fp32 on purpose), and equals the
    stored tensor dequantized and rounded to that dtype."""
    name, target_dir, _ = quantized_pair
    target, _ = load_target(target_dir, CPU, dtype)
    reference, _ = load_target(write_quantized_twin(tmp_path / "plain", name, quantized=False), CPU, dtype)
    dtypes = {key: tensor.dtype for key, tensor in target.state_dict().items()}
    assert dtypes == {key: tensor.dtype for key, tensor in reference.state_dict().items()}, name
    expected = expected_weights(target_dir)
    assert all(torch.equal(tensor, expected[key].to(tensor.dtype)) for key, tensor in target.state_dict().items())


def test_generate_on_a_quantized_pair_matches_plain_decoding_at_the_cli(quantized_pair, capsys):
    name, target_dir, _ = quantized_pair
    argv = ["generate", "--target", str(target_dir), "--draft", str(target_dir.parent / "draft"),
            "--max-new-tokens", "24", "--raw", "--json", "def add(a, b):"]
    replies = []
    for block in ("8", "1"):
        assert main([*argv[:-1], "--block-size", block, argv[-1]]) == 0
        replies.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert replies[0]["token_ids"] == replies[1]["token_ids"] and len(replies[0]["token_ids"]) == 24, name
    assert replies[0]["block_size"] == 8 and replies[1]["block_size"] == 1


@pytest.mark.parametrize("block", [4, 8])
def test_greedy_dflash_equals_plain_greedy_on_a_quantized_target(quantized_pair, block, monkeypatch):
    name, _, models = quantized_pair
    target, draft = models.target, models.draft
    reference = plain_greedy(target, PROMPT, NEW_TOKENS)
    settings = SamplingConfig(block_size=block, max_new_tokens=NEW_TOKENS)
    events = list(generate(target, draft, PROMPT, settings))  # the draft twin: mostly rejected
    assert isinstance(events[-1], Finished) and list(events[-1].token_ids) == reference, name
    # a stand-in that gets 0 .. B-1 proposals right: every accept count and rollback length
    monkeypatch.setattr(decode_module, "propose", oracle_propose(reference, target.config.vocab_size))
    events = list(generate(target, draft, PROMPT, settings))
    assert list(events[-1].token_ids) == reference, name
    assert max(cycle.accepted for cycle in events[1:-1]) == block - 1


# ----------------------------------------------------------------------------- refused at load


def with_block(tmp_path, block: dict, twin: str = "Qwen3 FP8", **sizes):
    target_dir = write_quantized_twin(tmp_path / "target", twin, **sizes)
    config = json.loads((target_dir / "config.json").read_text())
    config["quantization_config"] = block
    (target_dir / "config.json").write_text(json.dumps(config))
    return target_dir


@pytest.mark.parametrize("published, words", [
    ("Qwen/Qwen3-4B-AWQ", "stored in awq quantization"),
    ("XiaomiMiMo/MiMo-V2.5-Pro-FP4-DFlash", "stores its experts as mxfp4 inside block-wise FP8"),
])
def test_a_format_that_cannot_load_here_is_refused_in_one_line(tmp_path, published, words, monkeypatch, capsys):
    target_dir = with_block(tmp_path, PUBLISHED[published])
    import transformers

    def never(*args, **kwargs):
        raise AssertionError("weights were read before the refusal")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    with pytest.raises(UnsupportedQuantizationError) as refused:
        load_target(target_dir, CPU, torch.float32)
    message = str(refused.value)
    assert words in message and "--engine vllm" in message and "\n" not in message
    # at the CLI's edge: one line, exit status 2
    assert main(["generate", "--target", str(target_dir), "--max-new-tokens", "2", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dflash-studio: error: {message}"


def test_mxfp4_outside_gpt_oss_is_refused_by_name():
    config = {"model_type": "qwen3", "quantization_config": PUBLISHED["openai/gpt-oss-20b"]}
    with pytest.raises(UnsupportedQuantizationError, match="MXFP4 for gpt-oss only"):
        plan_quantization(config, DeviceKernels("cpu"))
    per_tensor = {"model_type": "qwen3", "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}
    with pytest.raises(UnsupportedQuantizationError, match="per-tensor FP8"):
        plan_quantization(per_tensor, DeviceKernels("cpu"))


def test_fp8_with_a_partial_block_is_refused_where_transformers_would_dequantize_it_wrongly(tmp_path, monkeypatch):
    """192 rows are one whole 128-block and a partial one; transformers' dequantizer reads them as
    two blocks of 96 and says nothing. Without the check the loaded weights are wrong; with it the
    load is refused, naming the weight."""
    target_dir = write_quantized_twin(tmp_path / "target", "Qwen3 FP8", intermediate_size=192)
    with pytest.raises(UnsupportedQuantizationError, match=r"mlp\.down_proj\.weight is 128x192, not whole 128x128"):
        load_target(target_dir, CPU, torch.float32)
    from engine import loading

    monkeypatch.setattr(loading, "check_dequantizable", lambda *args: None)
    target, _ = load_target(target_dir, CPU, torch.float32)
    expected = expected_weights(target_dir)
    key = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(target.state_dict()[key], expected[key])


# ----------------------------------------------------------------------------- kernels and sizes


@pytest.mark.parametrize("kernels, computes_in", [
    (DeviceKernels("cpu"), set()),
    (DeviceKernels("mps"), set()),
    (DeviceKernels("cuda", (9, 0), kernels_installed=True), {"mxfp4", "fp8"}),  # H100
    (DeviceKernels("cuda", (8, 0), kernels_installed=True), {"mxfp4"}),  # A100: no FP8 tensor cores
    (DeviceKernels("cuda", (7, 0), kernels_installed=True), set()),  # V100
    (DeviceKernels("cuda", (9, 0), kernels_installed=False), set()),  # no kernels package: no kernel
])
def test_weights_stay_quantized_only_where_the_device_has_a_kernel(kernels, computes_in):
    for method, published in (("mxfp4", "openai/gpt-oss-20b"), ("fp8", "Qwen/Qwen3-8B-FP8")):
        config = {"model_type": "gpt_oss" if method == "mxfp4" else "qwen3",
                  "quantization_config": PUBLISHED[published]}
        plan = plan_quantization(config, kernels)
        assert plan.format is FORMATS[method]
        assert plan.dequantized == (method not in computes_in), (kernels, method)
    assert plan_quantization({"model_type": "qwen3"}, kernels) is None


def test_pair_bytes_match_the_twins_files_and_loaded_weights(quantized_pair):
    """What ``pair_bytes`` says a twin takes stored and loaded, against the bytes of its own
    safetensors tensors and of its loaded weights (the twins store unquantized weights in fp32)."""
    name, target_dir, models = quantized_pair
    stored = load_file(target_dir / "model.safetensors")
    method = json.loads((target_dir / "config.json").read_text())["quantization_config"]["quant_method"]
    expected = expected_weights(target_dir)
    if method == "mxfp4":
        quantized = sum(expected[key.removesuffix("_blocks")].numel() for key in stored if key.endswith("_blocks"))
    else:
        quantized = sum(stored[key.removesuffix("_scale_inv")].numel() for key in stored if key.endswith("_scale_inv"))
    other = sum(tensor.numel() for tensor in expected.values()) - quantized
    size = pair_bytes(quantized, other, 0, method, kept_quantized=False, compute_bytes=4, stored_other_bytes=4)
    assert size.stored == pytest.approx(sum(t.numel() * t.element_size() for t in stored.values()), rel=2e-3)
    loaded = models.target.state_dict().values()
    assert size.loaded == sum(t.numel() * t.element_size() for t in loaded)
    assert pair_bytes(quantized, other, 0, method, kept_quantized=True).loaded < size.stored


def test_gpt_oss_20b_sizes_from_its_published_shapes():
    """gpt-oss-20b: 24 layers of 32 experts, hidden and expert width 2880 (its config.json), 20.9e9
    weights in all; the hub lists its safetensors at 13.8 GB."""
    experts = 24 * 32 * (2880 * 2 * 2880 + 2880 * 2880)
    size = pair_bytes(experts, 20.9e9 - experts, 0.8e9, "mxfp4", kept_quantized=False)
    assert size.stored - 0.8e9 * 2 == pytest.approx(13.8e9, rel=0.02)
    assert size.loaded == pytest.approx((20.9e9 + 0.8e9) * 2)  # every weight in bf16
    kept = pair_bytes(experts, 20.9e9 - experts, 0.8e9, "mxfp4", kept_quantized=True)
    assert kept.loaded == pytest.approx(size.stored)  # bf16 parts are bf16 both ways
