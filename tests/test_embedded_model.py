"""The default shipped pair (tiny-coder, the one that answers requests): loads by default, DFlash
reproduces the naive reference (token ids AND per-cycle acceptance lengths) with real acceptance,
the CLI's default path works, and the chat's example requests get fitting functions."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from engine.config import EngineConfig, SamplingConfig
from engine.events import Finished
from engine.loading import embedded_pair
from engine.runtime import Engine
from tests.needs import missing
from tests.test_engine_reference import naive_dflash



@pytest.fixture(autouse=True)
def _embedded_pair_is_there():
    if not embedded_pair()[1].is_dir():
        missing(f"the embedded tiny coder is missing ({embedded_pair()[1]}); it ships in assets/")

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


def test_default_generate_json_uses_the_default_pair(capsys):
    assert main(["generate", "--max-new-tokens", "24", "--json", "Write a function that reverses a string."]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["model"] == "tiny-coder"
    assert len(result["token_ids"]) == 1 + sum(result["acceptance_lengths"])


def test_replayed_acceptance_reproduces_the_engine_at_every_fixed_block(engine):
    """acceptance_runs + replay (the model of censoring behind fallback tuning) against real cycles."""
    from engine.bench import acceptance_runs
    from engine.fallback import FixedPolicy
    from engine.replay import replay

    ids = engine.encode("Write a function that counts the vowels in a string.")  # full blocks happen in its reply
    reply, runs = acceptance_runs(engine, ids, 48)
    costs = {b: (1.0, 2.0) for b in range(1, 9)}
    for block in (8, 4, 2):
        finished = list(engine.generate(ids, SamplingConfig(max_new_tokens=48, block_size=block), slot_details=False))[-1]
        assert list(finished.token_ids) == reply
        assert replay(runs, FixedPolicy(block), costs).taus == finished.acceptance_lengths
    assert max(runs) == 7  # some blocks are fully accepted: the runs are not trivially short


@pytest.mark.parametrize("index, word", [(0, "prime"), (1, "vowel"), (2, "reverse")])
def test_the_chat_examples_get_a_fitting_function_from_the_default_pair(engine, index, word):
    """The empty chat offers these requests to a newcomer: the default pair must answer each with
    code that parses and defines a function named for the request (greedy, as the page sends them)."""
    import ast

    from ui.layout import EXAMPLE_REQUESTS

    ids = engine.encode([{"role": "user", "content": EXAMPLE_REQUESTS[index]}])
    finished = list(engine.generate(ids, SamplingConfig(max_new_tokens=128)))[-1]
    tree = ast.parse(finished.text)
    names = [node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
    assert names and word in names[0], finished.text
