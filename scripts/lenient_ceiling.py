"""How far could τ go if the target were retrained to agree with its draft wherever it finds the
draft's token plausible? An upper bound for "make the target easier to draft for",
before spending hours retraining a target for it.

    python3 scripts/lenient_ceiling.py ALPHA PROMPTS.jsonl... [--pair DIR]

Each prompt is decoded at the draft's block size with fixed blocks, but a drafted token is
accepted whenever the target gives it at least ALPHA times the probability of its own top
choice (ALPHA = 1 is greedy DFlash; lower accepts more). The replies then differ from greedy
decoding: they are scored as `dflash-studio train eval` scores replies (chat: parses and
defines a function, on topic; code prefixes: parses when closed, uses the parameters), so the
printout says what such a target would gain in τ and what it would lose in answers.
Default pair: the request pair.
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import contextmanager

import torch

REQUESTS_PAIR = "assets/models/tiny-coder-requests"


def lenient_accept(drafts: list[int], logits: torch.Tensor, alpha: float) -> tuple[int, list[int]]:
    """(accepted, the token at each verified position): the leading drafts whose target
    probability is at least ``alpha`` times the target's top one, then the target's argmax."""
    probs = torch.softmax(logits.float(), dim=-1)
    chosen = logits.argmax(dim=-1).tolist()
    accepted = 0
    for j, token in enumerate(drafts):
        if probs[j, token] < alpha * probs[j, chosen[j]]:
            break
        accepted += 1
    return accepted, drafts[:accepted] + chosen[accepted:]


@contextmanager
def lenient_verification(alpha: float):
    """Greedy verification in ``engine.decode`` replaced by ``lenient_accept`` (this script only)."""
    from engine import decode

    greedy = decode.TokenChooser.verify
    decode.TokenChooser.verify = lambda self, drafts, q, logits: lenient_accept(drafts, logits, alpha)
    try:
        yield
    finally:
        decode.TokenChooser.verify = greedy


def measure(engine, prompts, alpha: float, max_new_tokens: int = 160) -> dict:
    from engine.bench import run_dflash
    from engine.config import SamplingConfig
    from engine.prompts import heal_code_prompt
    from engine.repetition import is_loop
    from training.evaluate import score_reply, summarize

    scores, taus = [], []
    with lenient_verification(alpha):
        for p in prompts:
            text = heal_code_prompt(p.prompt) if p.raw else p.prompt
            finished, _ = run_dflash(engine, engine.encode(text, raw=p.raw), SamplingConfig(max_new_tokens=max_new_tokens),
                                     None)
            ended = finished.reason == "stop"
            new = list(finished.token_ids)[: -1 if ended else None]
            kind = "complete" if p.raw else "chat"
            scores.append(score_reply(p.name, kind, text if p.raw else p.label, engine.decode(new), len(new), ended,
                                      is_loop(new)))
            taus.extend(finished.acceptance_lengths)
    return {"alpha": alpha, "tau": round(statistics.mean(taus), 2), **summarize(scores)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("alpha", type=float)
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--pair", default=REQUESTS_PAIR, help="a directory holding target/ and draft/")
    args = parser.parse_args()
    from engine.bench import read_prompts
    from engine.config import EngineConfig
    from engine.runtime import LocalEngine

    engine = LocalEngine.load(EngineConfig(target=f"{args.pair}/target", draft=f"{args.pair}/draft", threads=1))
    for path in args.prompts:
        result = measure(engine, read_prompts(path), args.alpha)
        print(path, " ".join(f"{k}={v}" for k, v in result.items() if k in (
            "alpha", "tau", "chat_parse_define_pct", "chat_on_topic_pct", "prefix_parses_closed_pct",
            "prefix_uses_params_pct", "loops")))


if __name__ == "__main__":
    main()
