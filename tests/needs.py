"""What a test needs from the machine (a browser, the embedded model): missing here, the test
is skipped with the reason; under CI (``CI=true``) it FAILS, so that a broken setup cannot pass
as a green run with everything skipped."""

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
