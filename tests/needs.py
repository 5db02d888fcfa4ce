"""What a test needs from the machine (a browser, the embedded model, vLLM): missing here, the
test is skipped with the reason; under CI it FAILS, so that a broken setup cannot pass as a green
run with everything skipped.

``under_ci`` is the one place that decides "in CI" (``CI`` set to 1, true or yes, as CI runners
and ``.ci/run`` set it); ``scripts/test.sh`` asks it too (``python3 -m tests.needs``)."""

from __future__ import annotations

import os

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(reason: str) -> None:
    """Skip (or, under CI, fail) the current test because ``reason``."""
    if under_ci():
        pytest.fail(f"{reason} (CI=true: a missing requirement fails the run)", pytrace=False)
    pytest.skip(reason)


if __name__ == "__main__":  # exit status 0 under CI, 1 elsewhere (for shell scripts)
    raise SystemExit(0 if under_ci() else 1)
