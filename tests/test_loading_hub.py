"""Loading at real size: hub ids with a pinned revision, only the files a checkpoint needs, a
download that reports progress, no hanging without network, and targets written straight to
their device (no whole model in host memory first)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine import hub, loading
from engine.config import EngineConfig
from engine.errors import CheckpointError
from engine.hub import HubProbe, HubRef, download_patterns, parse_hub_ref

from .tiny_models import save_tiny_pair

COMMIT = "0123456789abcdef0123456789abcdef01234567"


# ----------------------------------------------------------------------------- hub ids


@pytest.mark.parametrize("source, expected", [
    ("Qwen/Qwen3-8B", HubRef("Qwen/Qwen3-8B")),
    ("Qwen/Qwen3-8B@9c925d64", HubRef("Qwen/Qwen3-8B", "", "9c925d64")),
    ("z-lab/Qwen3-8B-DFlash-b16@v1.0", HubRef("z-lab/Qwen3-8B-DFlash-b16", "", "v1.0")),
    ("XiaomiMiMo/MiMo-V2.5-DFlash/dflash", HubRef("XiaomiMiMo/MiMo-V2.5-DFlash", "dflash")),
    ("XiaomiMiMo/MiMo-V2.5-DFlash/dflash@main", HubRef("XiaomiMiMo/MiMo-V2.5-DFlash", "dflash", "main")),
    ("owner/name@refs/pr/3", HubRef("owner/name", "", "refs/pr/3")),
])
def test_hub_ids_with_folder_and_revision(source, expected):
    ref = parse_hub_ref(source)
    assert ref == expected
    assert parse_hub_ref(str(ref)) == ref


@pytest.mark.parametrize("source, words", [
    ("Qwen/Qwen3-8B@", "nothing after '@'"),
    ("Qwen3-8B", "not a hub id"),
    ("own er/name", "not a valid"),
    ("owner/na..me", "not a valid"),
    ("owner/name/../etc", "cannot be '.' or '..'"),
    ("owner//name", "not a hub id"),
])
def test_bad_hub_ids_are_refused_by_name(source, words):
    with pytest.raises(CheckpointError, match=words.replace("(", r"\(").replace(".", r"\.")):
        parse_hub_ref(source)


# ----------------------------------------------------------------------------- which files


def selected(kind, files, subfolder=""):
    from huggingface_hub.utils import filter_repo_objects

    allow, ignore = download_patterns(kind, subfolder)
    return sorted(filter_repo_objects(files, allow_patterns=allow, ignore_patterns=ignore))


GPT_OSS_FILES = [  # openai/gpt-oss-20b's listing: the weights three times over, and a README's images
    ".gitattributes", "LICENSE", "README.md", "USAGE_POLICY", "chat_template.jinja", "config.json",
    "generation_config.json", "model-00000-of-00002.safetensors", "model-00001-of-00002.safetensors",
    "model.safetensors.index.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
    "original/config.json", "original/dtypes.json", "original/model.safetensors", "metal/model.bin",
]


def test_a_target_downloads_config_weights_tokenizer_and_template_only():
    assert selected("target", GPT_OSS_FILES) == [
        "chat_template.jinja", "config.json", "generation_config.json", "model-00000-of-00002.safetensors",
        "model-00001-of-00002.safetensors", "model.safetensors.index.json", "special_tokens_map.json",
        "tokenizer.json", "tokenizer_config.json",
    ]


def test_a_draft_downloads_config_and_weights_not_remote_code():
    files = [".gitattributes", "README.md", "config.json", "dflash.py", "model.safetensors", "assets/speedup.png"]
    assert selected("draft", files) == ["config.json", "model.safetensors"]


def test_a_draft_in_a_folder_downloads_that_folder_only():
    files = ["config.json", "model-00001-of-00070.safetensors", "model.safetensors.index.json", "tokenizer.json",
             "dflash/config.json", "dflash/model.safetensors", "dflash/mask_embedding.pt", "dflash/dflash.py",
             "dflash/old/model.safetensors"]
    assert selected("draft", files, "dflash") == ["dflash/config.json", "dflash/mask_embedding.pt",
                                                  "dflash/model.safetensors"]
    # the target beside it leaves the draft's folder alone
    assert "dflash/model.safetensors" not in selected("target", files)


# ----------------------------------------------------------------------------- the network


def test_offline_setting_answers_without_touching_the_network(monkeypatch):
    calls = []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    probe = HubProbe(connect=lambda address, timeout: calls.append(address) or True)
    assert probe.reachable() is False
    assert calls == []


def test_the_probe_asks_once_and_remembers(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example:8443")
    calls = []
    probe = HubProbe(connect=lambda address, timeout: calls.append(address) or False)
    assert [probe.reachable() for _ in range(5)] == [False] * 5
    assert calls == [("hub.example", 8443)]


def test_a_hanging_name_lookup_does_not_hang_the_probe(monkeypatch):
    def hang(address, timeout=None):
        time.sleep(3)
        raise OSError("too late")

    monkeypatch.setattr(hub.socket, "create_connection", hang)
    start = time.monotonic()
    assert hub.can_connect(("hub.example", 443), 0.2) is False
    assert time.monotonic() - start < 1.0


def test_an_uncached_checkpoint_without_network_is_refused_at_once_with_its_size(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    offline = HubProbe(connect=lambda address, timeout: False)
    start = time.monotonic()
    with pytest.raises(CheckpointError, match=r"needs a download \(about 18\.4 GB for the pair\); no network"):
        loading.resolve("Qwen/Qwen3-8B", "target", probe=offline)
    assert time.monotonic() - start < 2.0


# ----------------------------------------------------------------------------- a hub cache, offline


def put_in_hub_cache(cache: Path, repo_id: str, folder: Path, subfolder: str = "", commit: str = COMMIT) -> None:
    """The hub cache's layout: models--owner--name/snapshots/<commit>/..., refs/main -> commit."""
    root = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = root / "snapshots" / commit / subfolder
    shutil.copytree(folder, snapshot, dirs_exist_ok=True)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    target_dir, draft_dir, *_ = save_tiny_pair(tmp_path / "pair")
    cache = tmp_path / "hub"
    put_in_hub_cache(cache, "tiny/coder", target_dir)
    put_in_hub_cache(cache, "tiny/coder", draft_dir, "dflash")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_pinned_pair_loads_from_the_hub_cache_without_network(hub_cache):
    models = loading.load_models(EngineConfig(target=f"tiny/coder@{COMMIT}", draft=f"tiny/coder/dflash@{COMMIT}",
                                              device="cpu"))
    assert Path(models.target_path) == hub_cache / "models--tiny--coder" / "snapshots" / COMMIT
    assert Path(models.draft_path) == Path(models.target_path) / "dflash"
    assert models.draft is not None


def test_a_revision_not_in_the_cache_is_refused_without_network(hub_cache):
    with pytest.raises(CheckpointError, match="not downloaded yet.*no network"):
        loading.resolve("tiny/coder@" + "f" * 40, "target")


def test_loading_reports_each_step_in_order(hub_cache):
    steps = []
    loading.load_models(EngineConfig(target="tiny/coder", draft="tiny/coder/dflash", device="cpu"),
                        progress=lambda fraction, message: steps.append((fraction, message)))
    fractions = [fraction for fraction, _ in steps]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any(message.startswith("loading target") for _, message in steps)


# ----------------------------------------------------------------------------- download progress


def test_the_download_bar_reports_bytes_to_the_app(capsys):
    reports = []
    bar_class = hub.progress_bar_class(lambda fraction, message: reports.append((fraction, message)), "Qwen/Qwen3-8B")
    files = bar_class(total=3, desc="Fetching 3 files", unit="it")  # as snapshot_download opens them
    transfer = bar_class(desc="Downloading bytes", unit="B", total=0)
    written = bar_class(desc="Reconstructing", unit="B", total=0, unit_scale=True)
    written.total = 4_000_000_000  # the hub adds each file's size as it starts it
    for bar in (files, transfer):
        bar.update(1)
    written.update(1_000_000_000)
    written.update(3_000_000_000)
    assert reports == [(0.25, "downloading Qwen/Qwen3-8B: 1.0 GB of 4.0 GB"),
                       (1.0, "downloading Qwen/Qwen3-8B: 4.0 GB of 4.0 GB")]


# ----------------------------------------------------------------------------- straight to the device


def test_the_target_is_loaded_with_a_device_map_in_its_dtype(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    target_dir, *_ = save_tiny_pair(tmp_path)
    calls = []
    real = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    target, _ = loading.load_target(target_dir, torch.device("cpu"), torch.bfloat16)
    assert calls[0]["device_map"] == {"": torch.device("cpu")} and calls[0]["dtype"] == torch.bfloat16
    assert {p.dtype for p in target.parameters()} == {torch.bfloat16}


PEAK_SCRIPT = """
import resource, sys, torch
from pathlib import Path
from engine.loading import load_target
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
target, _ = load_target(Path(sys.argv[1]), torch.device("meta"), torch.bfloat16)
assert {p.device.type for p in target.parameters()} == {"meta"}
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


@pytest.mark.slow
def test_a_target_for_another_device_never_sits_whole_in_host_memory(tmp_path):
    """The "meta" device stands in for a GPU here: a 250 MB fp32 checkpoint loaded in bf16 for it
    must not pass through host memory (the old path read it all and cast it on the CPU: the
    process grew by 1.5 times the file)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from .tiny_models import tiny_tokenizer

    config = Qwen3Config(vocab_size=32000, hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=64, tie_word_embeddings=False)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.02)
    model.save_pretrained(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    del model
    size = sum(f.stat().st_size for f in (tmp_path / "target").glob("*.safetensors"))
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(tmp_path / "target")], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    growth = int(out.stdout.strip().splitlines()[-1])
    assert growth < size / 2, f"host memory grew by {growth / 1e6:.0f} MB loading a {size / 1e6:.0f} MB checkpoint"


def test_the_draft_is_read_onto_its_device_and_its_tensors_become_the_parameters(tmp_path, monkeypatch):
    """safetensors reads each tensor onto the draft's device, and the tensors read are the
    draft's parameters (no second copy): the draft module is built there and takes them over."""
    import safetensors.torch

    from engine.draft import load_draft

    _, draft_dir, *_ = save_tiny_pair(tmp_path)
    reads = []
    real = safetensors.torch.load_file

    def spy(filename, device="cpu"):
        tensors = real(filename, device=device)
        reads.append((device, tensors))
        return tensors

    monkeypatch.setattr(safetensors.torch, "load_file", spy)
    draft = load_draft(draft_dir, device=torch.device("cpu"), dtype=torch.float32)
    assert [device for device, _ in reads] == ["cpu"]
    read = {name.removeprefix("model."): tensor for name, tensor in reads[0][1].items()}
    assert draft.fc.weight.data_ptr() == read["fc.weight"].data_ptr()
    assert draft.layers[0].mlp.down_proj.weight.data_ptr() == read["layers.0.mlp.down_proj.weight"].data_ptr()


def test_a_networked_load_downloads_only_what_it_needs_and_reports_the_bytes(tmp_path, monkeypatch):
    """The hub stands in as a function: it is asked for the target's and the draft's files (with
    their patterns and the pinned revision), writes them as a download would, and drives the
    progress bars the way huggingface_hub does; the loading status carries the bytes."""
    import huggingface_hub
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    target_dir, draft_dir, *_ = save_tiny_pair(tmp_path / "published")
    asked = []

    def fake_snapshot_download(repo_id, *, revision=None, allow_patterns=None, ignore_patterns=None,
                               local_files_only=False, tqdm_class=None, **_):
        if local_files_only:
            raise huggingface_hub.errors.LocalEntryNotFoundError("not in the cache")
        asked.append((repo_id, revision, allow_patterns, ignore_patterns))
        source = target_dir if repo_id == "tiny/coder" else draft_dir
        folder = tmp_path / "downloaded" / repo_id
        files = tqdm_class(desc="Fetching files", unit="it", total=1)
        written = tqdm_class(desc="Reconstructing", unit="B", total=0, initial=0)
        size = sum(f.stat().st_size for f in source.iterdir())
        written.total = size
        shutil.copytree(source, folder)
        written.update(size // 2)
        written.update(size - size // 2)
        files.update(1)
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setattr(hub.HubProbe, "reachable", lambda self: True)
    steps = []
    models = loading.load_models(EngineConfig(target="tiny/coder@v2", draft="tiny/coder-draft", device="cpu"),
                                 progress=lambda fraction, message: steps.append((round(fraction, 3), message)))
    assert [(repo, revision) for repo, revision, _, _ in asked] == [("tiny/coder", "v2"), ("tiny/coder-draft", None)]
    assert asked[0][2:] == download_patterns("target") and asked[1][2:] == download_patterns("draft")
    downloads = [(fraction, message) for fraction, message in steps if message.startswith("downloading")]
    assert [fraction for fraction, _ in downloads] == [0.25, 0.5, 0.55, 0.6]
    assert downloads[1][1].startswith("downloading tiny/coder@v2: ") and " of " in downloads[1][1]
    assert models.draft is not None and Path(models.target_path) == tmp_path / "downloaded" / "tiny" / "coder"
