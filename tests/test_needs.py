"""``tests.needs.missing``: a missing browser or model skips a test here and fails it under CI."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.needs import missing

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception), ("1", pytest.fail.Exception),
                                         ("", pytest.skip.Exception), ("false", pytest.skip.Exception)])
def test_a_missing_requirement_fails_under_ci_and_skips_elsewhere(monkeypatch, ci, outcome):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="no Chromium"):
        missing("no Chromium at /usr/bin/chromium")


@pytest.mark.parametrize("ci, status", [("yes", 0), ("1", 0), ("", 1), ("0", 1)])
def test_shell_scripts_get_the_same_answer(ci, status):
    env = {**os.environ, "CI": ci}
    assert subprocess.run([sys.executable, "-m", "tests.needs"], cwd=ROOT, env=env).returncode == status


def test_only_tests_needs_reads_the_ci_variable():
    """One place decides "in CI": `CI=1` once skipped the vLLM and fuzz tests that `CI=true` ran."""
    readers = re.compile(r"""environ(\.get)?[\[(]\s*["']CI["']|getenv\(\s*["']CI["']|\$\{?CI\b""")
    files = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("scripts/*"), *ROOT.glob(".ci/*")]
    assert len(files) > 20  # guards the guard
    found = [str(path.relative_to(ROOT)) for path in files
             if path.is_file() and path.name != "test_needs.py" and readers.search(path.read_text(errors="replace"))]
    assert found == ["tests/needs.py"]


def test_ci_run_sets_ci_itself():
    script = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^export CI=true$", script, re.M) and "scripts/test.sh" in script
