"""scripts/start.sh, the quick start's first command: it makes (or reuses) a virtual environment,
installs the project into it once and runs `dflash-studio` there, with the arguments given."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def start(venv: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DFLASH_STUDIO_VENV": str(venv)}
    env.pop("PYTHONPATH", None)
    return subprocess.run(["bash", str(ROOT / "scripts" / "start.sh"), *args], cwd="/", env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture
def venv(tmp_path) -> Path:
    """The virtual environment the tests run in (scripts/test.sh makes it with this same script),
    else a new one that sees this Python's packages, so that installing the project takes seconds."""
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix)
    folder = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(folder)], check=True)
    return folder


def test_start_installs_once_then_reuses_the_environment_and_passes_arguments_on(venv):
    first = start(venv, "--help")
    assert first.returncode == 0, first.stderr
    assert "usage: dflash-studio" in first.stdout
    again = start(venv, "sessions", "--help")
    assert again.returncode == 0, again.stderr
    assert "installing" not in again.stdout + again.stderr  # reused as it is
    assert "usage: dflash-studio sessions" in again.stdout
    assert (venv / "bin" / "dflash-studio").exists()


def test_a_python_that_cannot_make_a_venv_gets_one_clear_line(tmp_path):
    """Debian without python3-venv: `python3 -m venv` fails (ensurepip is missing); not as root the
    script says which package to install instead of a pip error."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\necho 'The virtual environment was not successfully created because "
                                  "ensurepip is not available.' >&2\nexit 1\n")
    (fake / "python3").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "DFLASH_STUDIO_VENV": str(tmp_path / "venv"), "HOME": str(tmp_path)}
    result = subprocess.run(["bash", "-c", f". {ROOT}/scripts/venv.sh; id() {{ echo 1000; }}; ensure_venv"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "sudo apt install python3-venv" in result.stderr
    assert not (tmp_path / "venv").exists()
