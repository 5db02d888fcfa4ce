"""The published pairs: recognisable names, hub ids that parse (a revision may be pinned), sizes
as estimates, and what picking one means here: loaded from the hub cache, downloaded first, or
refused at once without network with what it would take."""

from __future__ import annotations

import time

import pytest

from app.config import AppConfig
from app.wiring import EngineHost, available_models, engine_loader
from engine import catalog
from engine.catalog import PUBLISHED_PAIRS, PublishedPair, availability, download_note
from engine.config import EngineConfig
from engine.errors import CheckpointError
from engine.hub import HubProbe, parse_hub_ref

from .test_loading_hub import COMMIT, put_in_hub_cache
from .tiny_models import save_tiny_pair

OFFLINE = HubProbe(connect=lambda address, timeout: False)
ONLINE = HubProbe(connect=lambda address, timeout: True)


def test_every_published_pair_has_a_readable_name_and_hub_ids_that_parse():
    names = [pair.name for pair in PUBLISHED_PAIRS]
    assert len(set(names)) == len(names)
    assert {"Qwen3-8B + z-lab DFlash b16", "Qwen3-4B + z-lab DFlash b16", "gpt-oss-20b + z-lab DFlash",
            "Qwen3-Coder-30B-A3B + z-lab DFlash", "MiMo-V2.5 + its own DFlash"} <= set(names)
    for pair in PUBLISHED_PAIRS:
        target, draft = pair.refs
        assert target.repo_id.count("/") == 1 and draft.repo_id.count("/") == 1
        assert pair.download_bytes > 0 and pair.memory_bytes > pair.download_bytes * 0.5
    mimo = catalog.find_pair("MiMo-V2.5 + its own DFlash")
    assert mimo.refs[1].subfolder == "dflash" and mimo.refs[1].repo_id == mimo.refs[0].repo_id


def test_sizes_are_parameters_times_bytes_and_say_they_are_estimates():
    pair = catalog.find_pair("Qwen3-8B + z-lab DFlash b16")
    assert pair.download_bytes == pytest.approx((8.2 + 1.0) * 2e9)
    assert pair.memory_bytes == pytest.approx((8.2 + 1.0) * 2e9 * 1.10)
    assert "estimates" in pair.describe() and "Qwen/Qwen3-8B + z-lab/Qwen3-8B-DFlash-b16" in pair.describe()
    gpt_oss = catalog.find_pair("gpt-oss-20b + z-lab DFlash")
    assert gpt_oss.download_bytes < gpt_oss.memory_bytes / 3  # MXFP4 on the hub, bf16 in memory


def test_a_pinned_revision_in_the_catalog_is_kept():
    pinned = PublishedPair("pinned", f"Qwen/Qwen3-8B@{COMMIT}", f"z-lab/Qwen3-8B-DFlash-b16@{COMMIT}", 8.2, 1.0)
    assert [ref.revision for ref in pinned.refs] == [COMMIT, COMMIT]


def test_download_notes_give_the_figure_the_menu_gives():
    """The warning when a checkpoint is missing and the menu's line name one size: the pair's."""
    for pair in PUBLISHED_PAIRS:
        menu = availability(pair, OFFLINE)  # "needs a download of 18.4 GB; no network"
        size = menu.removeprefix("needs a download of ").split(";")[0]
        assert download_note(pair.target) == download_note(pair.draft) == f"about {size} for the pair", pair.name
    assert download_note("Qwen/Qwen3-8B@main") == download_note("Qwen/Qwen3-8B")
    assert download_note("someone/unknown-model") == ""
    assert download_note("assets/models/tiny-coder") == ""


def test_without_network_an_entry_says_what_it_would_take(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    pair = catalog.find_pair("Qwen3-8B + z-lab DFlash b16")
    assert availability(pair, OFFLINE) == "needs a download of 18.4 GB; no network"
    assert availability(pair, ONLINE) == "downloads 18.4 GB first, needs about 20.2 GB of memory"


@pytest.fixture
def cached_tiny_pair(tmp_path, monkeypatch):
    """A published pair whose two checkpoints are in the hub cache (as a download leaves them)."""
    import huggingface_hub.constants

    target_dir, draft_dir, *_ = save_tiny_pair(tmp_path / "pair")
    cache = tmp_path / "hub"
    put_in_hub_cache(cache, "tiny/coder", target_dir)
    put_in_hub_cache(cache, "tiny/coder-dflash", draft_dir)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pair = PublishedPair("tiny coder + its DFlash", "tiny/coder", "tiny/coder-dflash", 0.001, 0.001)
    monkeypatch.setattr(catalog, "PUBLISHED_PAIRS", (pair, *PUBLISHED_PAIRS))
    return pair


def test_the_menu_lists_published_pairs_and_picking_a_downloaded_one_loads_it(cached_tiny_pair):
    choices = {choice.key: choice for choice in available_models(AppConfig())}
    assert choices["tiny coder + its DFlash"].hint.startswith("downloaded")
    assert choices["Qwen3-8B + z-lab DFlash b16"].hint == "needs a download of 18.4 GB; no network"
    assert "z-lab/Qwen3-8B-DFlash-b16" in choices["Qwen3-8B + z-lab DFlash b16"].note
    host = EngineHost(list(choices.values()), engine_loader(EngineConfig(device="cpu")))
    engine = host.switch("tiny coder + its DFlash").result(timeout=300)
    assert engine.speculative and host.status().state == "ready"
    host.shutdown()


def test_picking_a_pair_that_needs_a_download_without_network_fails_at_once_and_says_so(cached_tiny_pair):
    choices = available_models(AppConfig())
    host = EngineHost(choices, engine_loader(EngineConfig(device="cpu")))
    start = time.monotonic()
    with pytest.raises(CheckpointError, match=r"needs a download \(about 18\.4 GB for the pair\); no network"):
        host.switch("Qwen3-8B + z-lab DFlash b16").result(timeout=60)
    assert time.monotonic() - start < 5
    status = host.status()
    assert status.state == "failed" and "no network" in status.error
    host.shutdown()


def test_every_published_id_is_one_the_loader_accepts():
    for pair in PUBLISHED_PAIRS:
        for source in (pair.target, pair.draft):
            assert str(parse_hub_ref(source)) == source
