"""Every catalog pair, as published: its configs are kept in tests/published_configs (verbatim
where a public copy exists, with the source cited beside each), a twin built from them with only
the sizes shrunk loads through the real loading path and decodes exactly as plain greedy decoding
at the draft's own block size; and a pair whose files are in the hub cache loads with no network,
by its menu name or by its hub ids, and the menu says it is downloaded."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch

from engine import catalog, hub, loading
from engine.config import EngineConfig, SamplingConfig
from engine.decode import generate
from engine.events import Finished
from engine.loading import load_models
from tests.published_twins import (CATALOG_CONFIGS, CONFIGS, NOT_SIZES, SIZES, TARGET_LAYERS, WINDOW, is_verbatim,
                                   read_config, twin_configs, write_twin)

from .test_loading_hub import COMMIT, put_in_hub_cache

PROMPT = [5, 17, 33, 2, 9, 41, 8]
NEW_TOKENS = 24
PAIRS = sorted(CATALOG_CONFIGS)
MIMO_PRO_SHA256 = "2ed5a998f5f57e00a9fe14d2b3e767f06e49462a97eb09d80c927e112a585c9e"  # of the published bytes


def test_every_catalog_pair_has_its_configs_with_their_source():
    assert sorted(pair.name for pair in catalog.PUBLISHED_PAIRS) == PAIRS
    for folders in CATALOG_CONFIGS.values():
        for folder in folders:
            source = (CONFIGS / folder / "SOURCE.md").read_text()
            assert source.split("\n", 1)[0] in ("VERBATIM", "RECONSTRUCTED"), folder
            assert len(source.split()) > 20, folder  # where it was read, or why it is reconstructed
            json.loads((CONFIGS / folder / "config.json").read_text())


def test_the_mimo_pro_draft_config_is_the_published_bytes():
    folder = "XiaomiMiMo__MiMo-V2.5-Pro-FP4-DFlash__dflash"
    assert is_verbatim(folder)
    assert hashlib.sha256((CONFIGS / folder / "config.json").read_bytes()).hexdigest() == MIMO_PRO_SHA256


@pytest.mark.parametrize("name", PAIRS)
def test_a_twin_differs_from_the_published_configs_in_sizes_only(name):
    """Every key kept, every value kept except sizes (and the layer indices and token ids that
    follow the depth and the vocabulary)."""
    target_folder, draft_folder = CATALOG_CONFIGS[name]
    twin_target, twin_draft = twin_configs(name, 96)
    follows_size = {*SIZES, "vocab_size", "num_hidden_layers", "max_window_layers", "sliding_window",
                    "layer_types", "mlp_layer_types", "num_target_layers", "target_layer_ids", "mask_token_id",
                    "swa_window_size", "bos_token_id", "eos_token_id", "pad_token_id", "target_hidden_size"}
    for published, twin in ((read_config(target_folder), twin_target), (read_config(draft_folder), twin_draft)):
        assert set(twin) == set(published) - set(NOT_SIZES)
        for key, value in published.items():
            if key == "dflash_config":
                assert set(twin[key]) == set(value)
                assert all(twin[key][k] == v for k, v in value.items() if k not in follows_size), name
            elif key not in follows_size and key not in NOT_SIZES:
                assert twin[key] == value, (name, key)
        assert twin["num_hidden_layers"] <= max(TARGET_LAYERS, published["num_hidden_layers"])
        if published.get("sliding_window"):
            assert twin["sliding_window"] == WINDOW


def plain_greedy(target, prompt, n):
    out = target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("name", PAIRS)
def test_each_pairs_twin_loads_and_decodes_exactly_as_plain_greedy(name, tmp_path):
    twin = write_twin(name, tmp_path)
    models = load_models(EngineConfig(target=str(twin.target), draft=str(twin.draft), device="cpu",
                                      dtype="float32"))
    assert models.draft.block_size == twin.block_size in (8, 16)
    reference = plain_greedy(models.target, PROMPT, NEW_TOKENS)
    events = list(generate(models.target, models.draft, PROMPT,
                           SamplingConfig(max_new_tokens=NEW_TOKENS, block_size=twin.block_size)))
    assert isinstance(events[-1], Finished), events[-1]
    assert list(events[-1].token_ids) == reference


# ----------------------------------------------------------------------------- a filled hub cache, offline


def no_network(address, timeout):
    raise AssertionError(f"the network was asked for ({address})")


@pytest.fixture
def filled_cache(tmp_path, monkeypatch):
    """Twins of two catalog pairs stored under their real hub ids (MiMo's draft in its dflash/
    folder), as a download leaves them, on a machine with no network and room for any pair.
    The twins are stored unquantised: quantised targets are tested apart."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    for name in ("Qwen3-8B + z-lab DFlash b16", "MiMo-V2.5 + its own DFlash"):
        pair = catalog.find_pair(name)
        twin = write_twin(name, tmp_path / name.replace(" ", "_"))
        target_ref, draft_ref = pair.refs
        put_in_hub_cache(cache, target_ref.repo_id, twin.target)
        put_in_hub_cache(cache, draft_ref.repo_id, twin.draft, draft_ref.subfolder,
                         commit=COMMIT if draft_ref.repo_id == target_ref.repo_id else "f" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "can_connect", no_network)
    monkeypatch.setattr(loading, "free_memory", lambda device=None: (1e15, "memory"))
    return cache


@pytest.mark.parametrize("name", ["Qwen3-8B + z-lab DFlash b16", "MiMo-V2.5 + its own DFlash"])
def test_a_cached_pair_loads_offline_by_its_menu_name_and_by_its_hub_ids(filled_cache, name):
    pair = catalog.find_pair(name)
    by_name = load_models(EngineConfig(target=name, device="cpu"))
    by_ids = load_models(EngineConfig(target=pair.target, draft=pair.draft, device="cpu"))
    for models in (by_name, by_ids):
        assert Path(models.target_path).is_relative_to(filled_cache) and models.draft is not None
        assert Path(models.draft_path).is_relative_to(filled_cache)
    assert by_name.name == name
    assert torch.equal(by_name.target.lm_head.weight, by_ids.target.lm_head.weight)
    slug = load_models(EngineConfig(target=catalog._slug(name), device="cpu"))  # as a command line types it
    assert slug.target_path == by_name.target_path


def test_generate_with_hub_ids_runs_from_the_cache_without_network(filled_cache, capsys):
    from app.cli import main

    code = main(["generate", "--target", "Qwen/Qwen3-8B", "--draft", "z-lab/Qwen3-8B-DFlash-b16", "--device", "cpu",
                 "--max-new-tokens", "8", "--raw", "--json", "def add(a, b):"])
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 0 and json.loads(out)["tokens"] == 8


def test_the_menu_marks_a_pair_found_in_the_cache_as_downloaded(filled_cache, monkeypatch):
    from app.config import AppConfig
    from app.wiring import EngineHost, available_models, engine_loader

    from engine import memory

    monkeypatch.setattr(memory, "available_host_memory", lambda: int(1e15))
    choices = {choice.key: choice for choice in available_models(AppConfig())}
    cached = {name for name, choice in choices.items() if choice.hint.startswith("downloaded")}
    assert cached == {"Qwen3-8B + z-lab DFlash b16", "MiMo-V2.5 + its own DFlash"}
    host = EngineHost(list(choices.values()), engine_loader(EngineConfig(device="cpu")))
    labels = dict((key, label) for label, key in host.choices())
    assert "downloaded" in labels["Qwen3-8B + z-lab DFlash b16"]
    assert "no network" in labels["Qwen3-4B + z-lab DFlash b16"]
    engine = host.switch("MiMo-V2.5 + its own DFlash").result(timeout=300)  # picked in the menu
    assert engine.speculative and host.status().state == "ready"
    assert Path(engine.models.draft_path).is_relative_to(filled_cache)
    host.shutdown()


# ----------------------------------------------------------------------------- before a download


@pytest.fixture
def shape_only(tmp_path, monkeypatch):
    """A small published pair whose hub cache holds its two config.json files and nothing else."""
    import huggingface_hub.constants

    target_config, draft_config = twin_configs("Qwen3-8B + z-lab DFlash b16", 96)
    cache = tmp_path / "hub"
    for repo, config in (("tiny/shape", target_config), ("tiny/shape-dflash", draft_config)):
        folder = tmp_path / repo.replace("/", "_")
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        put_in_hub_cache(cache, repo, folder)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "can_connect", no_network)
    pair = catalog.PublishedPair("tiny shape + DFlash", "tiny/shape", "tiny/shape-dflash", 0.001, 0.001)
    monkeypatch.setattr(catalog, "PUBLISHED_PAIRS", (pair, *catalog.PUBLISHED_PAIRS))
    return pair


def test_bench_costs_measures_a_published_pairs_shape_by_name_and_says_where_dflash_pays(shape_only, capsys):
    from app.cli import main

    code = main(["bench", "--costs", "--random-weights", "--target", "tiny shape + DFlash", "--device", "cpu",
                 "--context", "16", "--json"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and summary["block_size"] == 16
    assert summary["pays_above_tau"] == summary["cycle_in_plain_steps"]["16"] > 1.0  # a cycle costs more than a step
    code = main(["bench", "--costs", "--random-weights", "--target", "tiny shape + DFlash", "--device", "cpu",
                 "--context", "16"])
    out = capsys.readouterr().out
    cost = re.search(r"at block 16 a cycle costs (\d+\.\d\d) plain steps: DFlash pays on this machine where the mean "
                     r"τ \(tokens per cycle\) is above (\d+\.\d\d)", out)
    assert code == 0 and cost and cost.group(1) == cost.group(2), out


def test_a_pair_that_cannot_fit_is_refused_in_one_line_before_anything_is_built(shape_only, monkeypatch, capsys):
    from app.cli import main
    from engine import memory, shapes

    monkeypatch.setattr(memory, "available_host_memory", lambda: 1_000_000)
    monkeypatch.setattr(shapes, "random_target", lambda *a: pytest.fail("built a target that cannot fit"))
    code = main(["bench", "--costs", "--random-weights", "--target", "tiny shape + DFlash", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "tiny shape + DFlash needs about 2.0 GB once loaded in float32" in err and "1.0 MB of memory free" in err


def test_generate_refuses_a_published_pair_that_cannot_fit_before_downloading(monkeypatch, tmp_path, capsys):
    """By menu name or by hub ids: the refusal comes before the hub is asked for anything."""
    import huggingface_hub.constants

    from app.cli import main
    from engine import memory

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(memory, "available_host_memory", lambda: 8 * 10**9)
    monkeypatch.setattr(loading, "fetch", lambda *a, **k: pytest.fail("asked the hub for a pair that cannot fit"))
    for model in (["--target", "Qwen3-8B + z-lab DFlash b16"],
                  ["--target", "Qwen/Qwen3-8B", "--draft", "z-lab/Qwen3-8B-DFlash-b16"]):
        code = main(["generate", *model, "--device", "cpu", "--dtype", "bfloat16", "hello"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert "Qwen3-8B + z-lab DFlash b16 needs about 20.2 GB once loaded in bf16" in err
        assert "8.0 GB of memory free" in err


def test_the_menu_says_which_pairs_cannot_fit_here(monkeypatch, tmp_path):
    import huggingface_hub.constants

    from app.wiring import published_pairs
    from engine import memory

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(memory, "available_host_memory", lambda: 15 * 10**9)
    offline = hub.HubProbe(connect=lambda a, t: False)
    for dtype, per_parameter in (("bfloat16", 2), (None, 4)):  # float32, the CPU's default, takes twice as much
        hints = {choice.key: choice.hint for choice in published_pairs(offline, "cpu", dtype)}
        for pair in catalog.PUBLISHED_PAIRS:
            if pair.unloadable:
                assert hints[pair.name].startswith("does not load here: its experts are stored as MXFP4")
                continue
            fits = pair.size.loaded * per_parameter / 2 <= 15e9
            assert hints[pair.name].startswith("does not fit here") != fits, (pair.name, hints[pair.name])
            assert hints[pair.name].endswith("no network)" if not fits else "no network")
    # (4.0 + 0.5) billion parameters: 9.0 GB in bf16, 10.0 GB with 1 GB for cache and activations; float32 doubles it
    assert hints["Qwen3-4B + z-lab DFlash b16"].startswith("does not fit here: about 20.0 GB once loaded in float32")


def test_a_quantized_target_counts_as_stored_where_the_gpu_computes_in_its_format():
    """gpt-oss-20b: 13.7 GB stored (MXFP4 experts); dequantised to bf16 it takes three times that."""
    pair = catalog.find_pair("gpt-oss-20b + z-lab DFlash")
    size = pair.size
    assert size.loaded_here(kept_quantized=True) == size.kept_quantized < size.loaded / 2
    assert size.loaded_here(kept_quantized=False, bytes_per_parameter=4) == 2 * size.loaded
    assert "kept in MXFP4 on a GPU with its kernels" in size.words()
    room = lambda: (size.kept_quantized + 1e9, "GPU memory on cuda:0")  # noqa: E731
    assert catalog.fits(pair, room, kept_quantized=True) == ""
    assert "needs about" in catalog.fits(pair, room, kept_quantized=False)
    plain = catalog.find_pair("Qwen3-8B + z-lab DFlash b16")
    assert plain.size.kept_quantized is None and plain.size.loaded_here(kept_quantized=True) == plain.size.loaded


def test_a_pair_whose_target_format_cannot_load_is_refused_before_its_download(monkeypatch, tmp_path, capsys):
    import huggingface_hub.constants

    from app.cli import main

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(loading, "fetch", lambda *a, **k: pytest.fail("asked the hub for a pair that cannot load"))
    monkeypatch.setattr(loading, "free_memory", lambda device=None: (1e15, "memory"))
    code = main(["generate", "--target", "MiMo-V2.5-Pro-FP4 + its own DFlash", "--device", "cpu", "hello"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "MXFP4 inside a block-wise FP8 config" in err and "--engine vllm" in err
