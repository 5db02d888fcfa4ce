"""How often does a draft lose a block on a token it cannot propose? (A draft proposing from part
of the vocabulary only is cheaper per cycle; this says what that costs in rejections.)

    python3 scripts/proposal_misses.py PROMPTS.jsonl... [--pair DIR]

A draft with ``proposal_vocab_size`` or ``proposal_ids`` proposes from part of the vocabulary
only. Each prompt is decoded greedily with fixed blocks of the draft's size; the printout gives
the share of reply tokens outside the draft's proposal set, and the share of rejections at which
the target's own token (the cycle's bonus) lies outside it: blocks no training of the draft's
weights could have saved. Default pair: the request pair.
"""

from __future__ import annotations

import argparse

REQUESTS_PAIR = "assets/models/tiny-coder-requests"


def proposable_ids(draft) -> set[int] | None:
    """The ids the draft may propose (None: all of them)."""
    if draft.proposal_ids is not None:
        return set(draft.proposal_ids.tolist())
    if draft.proposal_vocab_size is not None:
        return set(range(draft.proposal_vocab_size))
    return None


def count_misses(cycles, ids: set[int] | None) -> dict:
    """Reply tokens and rejections, each with how many fall outside ``ids``."""
    outside = (lambda token: False) if ids is None else (lambda token: token not in ids)
    rejections = [c.bonus for c in cycles if c.rejected and c.bonus is not None]
    tokens = [t for c in cycles for t in c.emitted]
    return {"tokens": len(tokens), "tokens_outside": sum(map(outside, tokens)),
            "rejections": len(rejections), "rejections_outside": sum(map(outside, rejections))}


def measure(engine, prompts, max_new_tokens: int = 96) -> dict:
    from engine.bench import run_dflash
    from engine.config import SamplingConfig
    from engine.prompts import heal_code_prompt

    ids = proposable_ids(engine.models.draft)
    total = dict.fromkeys(("tokens", "tokens_outside", "rejections", "rejections_outside"), 0)
    for p in prompts:
        text = heal_code_prompt(p.prompt) if p.raw else p.prompt
        _, cycles = run_dflash(engine, engine.encode(text, raw=p.raw), SamplingConfig(max_new_tokens=max_new_tokens),
                               None)
        for key, value in count_misses(cycles, ids).items():
            total[key] += value
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--pair", default=REQUESTS_PAIR, help="a directory holding target/ and draft/")
    args = parser.parse_args()
    from engine.bench import read_prompts
    from engine.config import EngineConfig
    from engine.runtime import LocalEngine

    engine = LocalEngine.load(EngineConfig(target=f"{args.pair}/target", draft=f"{args.pair}/draft", threads=1))
    for path in args.prompts:
        r = measure(engine, read_prompts(path))
        print(f"{path}: {r['tokens']} reply tokens, {100 * r['tokens_outside'] / max(r['tokens'], 1):.1f} % outside "
              f"the draft's proposal set; {r['rejections']} rejections, at "
              f"{100 * r['rejections_outside'] / max(r['rejections'], 1):.1f} % of them the target's token is outside it")


if __name__ == "__main__":
    main()
