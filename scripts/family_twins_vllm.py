"""Which target families vLLM's build serves with DFlash, and whether its greedy output equals
transformers' own: each family's tiny twin (tests/family_twins.py) is saved with a random
z-lab-format draft, then `dflash-studio generate --raw --json` runs on the local engine and on
`--engine vllm` and both are compared with transformers' greedy generate() over 48 tokens.

    python3 scripts/family_twins_vllm.py [FAMILY ...]   (default: every family; minutes per family)

Prints one JSON line per family: "identical", "differs (...)" or vLLM's own error line. The twins
are widened to hidden 128 / head_dim 32 because vLLM's CPU attention has no kernel for head_dim 16.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.draft import DFlashDraftModel, new_draft_config, save_draft  # noqa: E402
from tests.family_twins import FAMILIES, family_twin  # noqa: E402
from tests.tiny_models import tiny_tokenizer  # noqa: E402

PROMPT = "def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, item):\n"
NEW_TOKENS = 48


def save_twin(family: str, root: Path, tokenizer) -> list[int]:
    """Saves target/ and draft/ under ``root``; returns transformers' greedy continuation."""
    vocab = len(tokenizer) + 16
    target = family_twin(family, vocab_size=vocab, hidden_size=128, head_dim=32, intermediate_size=256)
    target.save_pretrained(root / "target", safe_serialization=True)
    tokenizer.save_pretrained(root / "target")
    torch.manual_seed(2)
    save_draft(DFlashDraftModel(new_draft_config(target.config, 1, 8, vocab - 1)).eval(), root / "draft")
    ids = tokenizer(PROMPT)["input_ids"]
    out = target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(ids):].tolist()


def run_engine(engine: str, root: Path, reference: list[int]) -> str:
    command = ["dflash-studio", "generate", "--engine", engine, "--target", str(root / "target"),
               "--draft", str(root / "draft"), "--raw", "--json", "--max-new-tokens", str(NEW_TOKENS),
               "--block-size", "8", PROMPT]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    try:
        tokens = list(json.loads(done.stdout.strip().splitlines()[-1])["token_ids"])
    except (IndexError, KeyError, ValueError):
        return f"failed: {(done.stderr.strip().splitlines() or ['no output'])[-1][:300]}"
    return "identical" if tokens == reference[: len(tokens)] and tokens else f"differs ({tokens[:8]} vs {reference[:8]})"


def main(families: list[str]) -> None:
    tokenizer = tiny_tokenizer()
    with tempfile.TemporaryDirectory() as scratch:
        for family in families:
            root = Path(scratch) / family
            reference = save_twin(family, root, tokenizer)
            row = {"family": family}
            for engine in ("local", "vllm"):
                started = time.monotonic()
                row[engine] = run_engine(engine, root, reference)
                row[f"{engine}_s"] = round(time.monotonic() - started)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or sorted(FAMILIES))
