"""Would copying from the context help the draft? An offline estimate (prompt-lookup proposals
mixed into the draft's block), answered before building it into the decoder.

    python3 scripts/lookup_estimate.py PROMPTS.jsonl [TARGET DRAFT]

The request pair's draft misses identifiers that the reply already wrote (``counts``, a
parameter's name) each time they come back. Prompt-lookup decoding proposes exactly those: the
token that followed the last earlier occurrence of the current n-gram. This script mixes the two
per slot: where the context has such a continuation and the draft's own top probability at that
slot is below a threshold, the slot takes the looked-up token instead of the draft's argmax
(the verify stays a greedy chain, so the output would still be the target's own).

For every position of each greedy reply (96 new tokens) the draft proposes one block from the
exact context; we count the target's next tokens each proposal gets right, per position
(every position as an anchor) and per cycle (anchors only where a decode would put them, after
each cycle's accepted drafts and bonus, replayed by ``engine.replay`` as `bench --replay` does).
The per-cycle τ is the one to read.
"""

from __future__ import annotations

import sys

import torch

from engine.fallback import FixedPolicy
from engine.replay import replay
from engine.sampling import leading_matches
from tree_estimate import every_block, load_engine  # scripts/ is on the path when run as a script

NGRAMS = (2, 3)  # the shortest n-gram that may trigger a lookup (longer ones, up to 4, go first)
THRESHOLDS = (0.5, 0.8, 1.01)  # the draft keeps a slot when its top probability reaches this


def looked_up(tokens: list[int], shortest: int, longest: int = 4) -> int | None:
    """The token after the most recent earlier occurrence of the last n tokens (longest n first)."""
    for n in range(longest, shortest - 1, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        for i in range(len(tokens) - n - 1, -1, -1):
            if tokens[i:i + n] == suffix:
                return tokens[i + n]
    return None


def mixed_proposals(context: list[int], probs: torch.Tensor, shortest: int, threshold: float) -> list[int]:
    top_p, top_ids = (t.tolist() for t in probs.max(dim=-1))
    chosen: list[int] = []
    for p, drafted in zip(top_p, top_ids):
        lookup = looked_up(context + chosen, shortest)
        chosen.append(lookup if lookup is not None and p < threshold else drafted)
    return chosen


def main(argv: list[str]) -> None:
    engine = load_engine(argv)
    block = engine.models.draft.block_size
    variants = ["draft"] + [(n, t) for n in NGRAMS for t in THRESHOLDS]
    runs: dict = {}  # per prompt, per variant: drafts accepted from each anchor position, in order
    for proposal in every_block(engine, argv[0]):
        reply = runs.setdefault(proposal.prompt_index, {v: [] for v in variants})
        probs = torch.softmax(proposal.logits.float(), dim=-1)
        for v in variants:
            proposals = (probs.argmax(dim=-1).tolist() if v == "draft"
                         else mixed_proposals(proposal.sequence[:proposal.position + 1], probs, *v))
            reply[v].append(leading_matches(proposals, proposal.truth))
    positions = sum(len(reply["draft"]) for reply in runs.values())
    free = {b: (0.0, 0.0) for b in range(1, block + 1)}  # only τ is read: costs do not matter here
    print(f"{argv[0]}: {positions} positions, block {block}")
    for v in variants:
        label = "draft alone" if v == "draft" else f"lookup n>={v[0]} below p {v[1]:g}"
        cycles = [tau for reply in runs.values() for tau in replay(reply[v], FixedPolicy(block), free).taus]
        accepted = sum(sum(reply[v]) for reply in runs.values())
        print(f"{label:>24}: tau per position {1 + accepted / positions:.2f}, per cycle {sum(cycles) / len(cycles):.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
