"""The shipped tiny coder: loads by default, DFlash reproduces the naive reference (token ids AND
per-cycle acceptance lengths) with real acceptance, and the CLI's default path works."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from engine.config import EngineConfig, SamplingConfig
from engine.events import Finished
from engine.loading import embedded_pair
from engine.runtime import Engine
from tests.test_engine_reference import naive_dflash

pytestmark = pytest.mark.skipif(not embedded_pair()[1].is_dir(), reason="the embedded tiny coder is not in assets/ yet")

PROMPT = 'def read_config(path):\n    """Read a JSON config file and return it as a dict."""\n'


@pytest.fixture(scope="module")
def engine():
    return Engine.load(EngineConfig())


@pytest.mark.parametrize("block_size", [8, 4])
def test_embedded_pair_matches_naive_reference(engine, block_size):
    target, draft = engine.models.target, engine.models.draft
    ids = engine.encode(PROMPT, raw=True)
    stops = tuple(engine.models.stop_token_ids)
    expected_ids, expected_taus = naive_dflash(target, draft, ids, 32, block_size, stop_ids=stops)
    finished = list(engine.generate(ids, SamplingConfig(max_new_tokens=32, block_size=block_size)))[-1]
    assert isinstance(finished, Finished)
    assert list(finished.token_ids) == expected_ids
    assert list(finished.acceptance_lengths) == expected_taus
    assert finished.mean_acceptance_length > 1.5  # the trained draft really drafts


def test_default_generate_json_uses_the_embedded_pair(capsys):
    assert main(["generate", "--max-new-tokens", "24", "--json", "Write a function that reverses a string."]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["model"] == "tiny-coder"
    assert len(result["token_ids"]) == 1 + sum(result["acceptance_lengths"])
