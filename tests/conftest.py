"""Test-wide settings: tiny models run fastest on one torch thread (see engine.loading.pick_threads)."""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# engines loaded through the command line (servers, e2e pages) answer eagerly: a background
# compile in each would cost minutes of CPU; tests/test_compiled.py turns the compiled path on itself
os.environ.setdefault("DFLASH_STUDIO_COMPILE", "0")

try:
    import torch
except ImportError:  # storage/UI-only environments
    torch = None

if torch is not None:
    torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def vllm_engine():
    """ONE vLLM server (DFlash, the embedded pair) for every test that needs one; stopped at the end."""
    from engine.vllm import VLLMEngine
    from tests.vllm_support import vllm_test_config

    engine = VLLMEngine.launch(vllm_test_config())
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def local_engine():
    """The local engine on the same embedded pair (what vLLM's output is checked against)."""
    from engine.config import EngineConfig
    from engine.runtime import Engine

    return Engine.load(EngineConfig())


@pytest.fixture
def engine():
    """A scriptable FakeEngine (tests.fake_engine) for the page's handler tests."""
    from tests.fake_engine import FakeEngine

    return FakeEngine()


@pytest.fixture
def ctx(engine):
    """The page's context (store in memory + engine host) on ``engine``, loaded, closed after the test."""
    from tests.fake_engine import fake_studio

    ctx = fake_studio(engine, ui=False)
    ctx.engines.start().result(timeout=10)
    yield ctx
    ctx.engines.shutdown()
    ctx.store.close()
