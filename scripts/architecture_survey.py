"""Every causal-LM architecture the installed transformers ships, tried as a DFlash target.

    python3 scripts/architecture_survey.py [MODEL_TYPE ...] [--json OUT.jsonl]

For each model type: a tiny random twin (``tests/family_twins.any_family_twin``), the load-time
check (``check_verify_contract``), then greedy DFlash at block 8 against transformers' own greedy
``generate()`` with a random draft and with a stand-in draft that accepts 0 .. 7 tokens in turn,
eagerly and on the static caches the compiled path uses. One line per type:

- ``identical``: every run gave plain decoding's tokens;
- ``eager only``: identical eagerly, and the compiled path keeps it eager (``static_disagreement``);
- ``refused``: the engine refuses it in one line (the reason follows), from its config or when
  a pair loads;
- ``no twin``: transformers itself cannot build or run the shrunk twin (not a verdict on DFlash);
- ``MISMATCH``: a run gave other tokens without refusing. That is a bug: the engine must either
  decode a target exactly or refuse it.

Run it after upgrading transformers: a new architecture lands in one of these rows.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

from engine import decode as decode_module  # noqa: E402
from engine.backends import StaticBackend, static_disagreement  # noqa: E402
from engine.config import SamplingConfig  # noqa: E402
from engine.decode import generate  # noqa: E402
from engine.errors import UnsupportedTargetError  # noqa: E402
from engine.events import Failed  # noqa: E402
from engine.target_cache import check_rollback, check_verify_contract  # noqa: E402
from tests.family_twins import any_family_twin  # noqa: E402
from tests.test_families import NEW_TOKENS, PROMPT, oracle_propose  # noqa: E402
from tests.tiny_models import tiny_draft  # noqa: E402

BLOCK = 8
SECONDS_PER_TYPE = 120


class TookTooLong(Exception):
    pass


def survey(model_type: str) -> tuple[str, str]:
    try:
        target = any_family_twin(model_type)
    except TookTooLong:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers' own failure on a shrunk config: reported, not judged
        return "no twin", f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
    try:
        check_rollback(target)  # what loading refuses from the config alone, before any weight is read
    except UnsupportedTargetError as exc:
        return "refused", f"at load: {exc}"
    try:
        reference = target.generate(torch.tensor([PROMPT]), attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
                                    max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                    do_sample=False)[0, len(PROMPT):].tolist()
        draft = tiny_draft(target, block_size=BLOCK)
    except TookTooLong:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers' own failure on a shrunk config: reported, not judged
        return "no twin", f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
    try:
        check_verify_contract(target)
    except UnsupportedTargetError as exc:
        return "refused", f"at load: {exc}"
    vocab = target.config.get_text_config().vocab_size
    propose = decode_module.propose
    backend = StaticBackend(target, draft)
    try:
        static_why = static_disagreement(backend)
        runs = [("random draft", propose, None), ("every accept count", oracle_propose(reference, vocab), None)]
        if static_why is None:
            runs.append(("every accept count, static caches", oracle_propose(reference, vocab), backend))
        for label, proposer, run_backend in runs:
            decode_module.propose = proposer
            events = list(generate(target, draft, PROMPT, SamplingConfig(block_size=BLOCK, max_new_tokens=NEW_TOKENS),
                                   backend=run_backend))
            last = events[-1]
            if isinstance(last, Failed):
                if last.kind == "UnsupportedTargetError":
                    return "refused", last.message
                return "MISMATCH", f"{label}: failed with {last.kind}: {last.message}"
            if list(last.token_ids) != reference:
                return "MISMATCH", f"{label}: other tokens than plain greedy decoding"
    finally:
        decode_module.propose = propose
        backend.close()
    return ("eager only", static_why) if static_why else ("identical", "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_types", nargs="*", help="model types (default: every causal LM transformers ships)")
    parser.add_argument("--json", type=Path, help="also write one JSON line per type here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    def too_long(*_):
        raise TookTooLong()

    signal.signal(signal.SIGALRM, too_long)
    counts: dict[str, int] = {}
    out = args.json.open("w") if args.json else None
    for model_type in args.model_types or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        signal.alarm(SECONDS_PER_TYPE)
        try:
            verdict, why = survey(model_type)
        except TookTooLong:
            verdict, why = "no twin", f"took over {SECONDS_PER_TYPE} s"
        signal.alarm(0)
        counts[verdict] = counts.get(verdict, 0) + 1
        print(f"{model_type:28s} {verdict:11s} {why}", flush=True)
        if out:
            out.write(json.dumps({"model_type": model_type, "verdict": verdict, "why": why}) + "\n")
    print(", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items())))
    return 1 if counts.get("MISMATCH") else 0


if __name__ == "__main__":
    sys.exit(main())
