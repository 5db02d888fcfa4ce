"""What the tests of the one-GPU scripts (``scripts/gpu_*.sh --tiny``) share: running a script at
toy scale on the CPU, and checking that the pair it made decodes greedily as plain decoding."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "assets" / "models" / "tiny-coder-requests"  # the answering pair both scripts start from


def run_tiny(script: str, out: Path, timeout: int) -> str:
    """``bash scripts/SCRIPT --tiny`` with ``OUT=out``; its standard output."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / script), "--tiny"], cwd=ROOT,
                          env=dict(os.environ, OUT=str(out)), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def greedy_runs(target: Path, draft: Path) -> list[tuple]:
    """Per prompt (a request and a code prefix), the pair's greedy reply with and without the
    draft (``Finished`` events), block 8."""
    from engine.config import EngineConfig, SamplingConfig
    from engine.events import Finished
    from engine.runtime import Engine

    engine = Engine.load(EngineConfig(target=str(target), draft=str(draft), device="cpu"))
    assert engine.speculative and engine.block_size == 8
    sampling = SamplingConfig(max_new_tokens=40, temperature=0.0).validate()
    runs = []
    for prompt in ("Write a function that checks if a number is prime.", "def merge(a, b):"):
        ids = engine.encode(prompt, raw=prompt.startswith("def "))
        runs.append(tuple([e for e in engine.generate(ids, sampling, None, slot_details=False, speculative=spec)
                           if isinstance(e, Finished)][0] for spec in (True, False)))
    return runs
