"""Would tree verification pay here? An offline estimate (DDTree, arXiv 2604.12989), answered
before building tree attention into the decoder.

    python3 scripts/tree_estimate.py PROMPTS.jsonl [TARGET DRAFT]

For every position of each greedy reply (96 new tokens), the draft proposes one block from the
exact context, and we count how many of the target's next tokens a verify would accept:

- chain: the draft's argmax at each slot (what DFlash verifies today);
- tree of N nodes: DDTree's best-first tree from the same single draft pass, every slot's top-4
  candidates, nodes taken in order of the product of their slots' probabilities (prefix-closed),
  verified in one target pass of N + 1 tokens with a tree attention mask.

Then it measures a target verify of 8, 16 and 32 tokens at a 128-token context and prints the
expected speed of each tree relative to the chain, tau / (draft pass + verify). The tau here is
per position (every position as an anchor), higher than a decode's per-cycle tau, whose anchors
sit after a rejection; the ratio between tree and chain is the figure to read. It ignores what
a tree adds to a cycle besides the wider verify (building the mask, gathering the accepted
path's cache entries), so it is an upper bound on what a tree would gain.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from engine.bench import read_prompts, run_dflash
from engine.config import EngineConfig, SamplingConfig
from engine.costs import measure
from engine.decode import propose
from engine.features import target_features
from engine.runtime import Engine
from engine.sampling import leading_matches

TOP_K = 4
TREES = (15, 31)  # nodes besides the anchor: verifies of 16 and 32 tokens


@dataclass(frozen=True)
class Proposal:
    """One draft pass from the exact context of a greedy reply (shared with lookup_estimate.py)."""

    prompt_index: int  # which prompt of the file
    prompt_length: int
    sequence: list[int]  # prompt and the whole greedy reply
    position: int  # the anchor's index in ``sequence``
    logits: torch.Tensor  # [block - 1, V]: the draft's logits for the slots after the anchor
    truth: list[int]  # the target's next block - 1 tokens


def load_engine(argv: list[str]) -> Engine:
    """The shipped pair, or TARGET DRAFT from the command line, on one thread like ``bench``."""
    return Engine.load(EngineConfig(target=argv[1] if len(argv) > 2 else None,
                                    draft=argv[2] if len(argv) > 2 else None, threads=1))


def every_block(engine: Engine, prompts_path: str, new_tokens: int = 96) -> Iterator[Proposal]:
    """For every position of each prompt's greedy reply, the block the draft proposes there."""
    target, draft = engine.models.target, engine.models.draft
    block = draft.block_size
    for index, item in enumerate(read_prompts(prompts_path)):
        ids = engine.encode(item.prompt, raw=item.raw)
        sampling = engine.check_request(ids, SamplingConfig(max_new_tokens=new_tokens))
        finished, _ = run_dflash(engine, ids, replace(sampling, block_size=1), None)
        sequence = list(ids) + list(finished.token_ids)
        with torch.inference_mode():
            features, _ = target_features(target, torch.tensor([sequence]), draft.target_layer_ids)
            for position in range(len(ids), len(sequence) - block):
                _, logits = propose(draft, target, None, [features[:, :position]], sequence[position], position, block)
                yield Proposal(index, len(ids), sequence, position, logits, sequence[position + 1: position + block])


def tree_paths(log_probs: torch.Tensor, nodes: int, top_k: int = TOP_K) -> tuple[set, list[list[int]]]:
    """DDTree's best-first tree: the ``nodes`` most probable paths (tuples of candidate ranks,
    one per slot from slot 1), and each slot's candidate token ids."""
    values, ids = (t.tolist() for t in log_probs.topk(top_k, dim=-1))
    frontier = [(-values[0][rank], (rank,)) for rank in range(top_k)]
    heapq.heapify(frontier)
    chosen = set()
    while frontier and len(chosen) < nodes:
        neg_log_p, path = heapq.heappop(frontier)
        chosen.add(path)
        depth = len(path)
        if depth < len(ids):
            for rank in range(top_k):
                heapq.heappush(frontier, (neg_log_p - values[depth][rank], path + (rank,)))
    return chosen, ids


def accepted_in_tree(paths: set, ids: list[list[int]], truth: list[int]) -> int:
    """How many of ``truth`` (the target's next tokens) a tree verify accepts: the longest
    prefix of it that is a path of the tree."""
    path: tuple = ()
    for depth, token in enumerate(truth):
        if token not in ids[depth]:
            return depth
        path += (ids[depth].index(token),)
        if path not in paths:
            return depth
    return len(truth)


def main(argv: list[str]) -> None:
    engine = load_engine(argv)
    block = engine.models.draft.block_size
    accepted = {"chain": 0, **{n: 0 for n in TREES}}
    positions = 0
    for proposal in every_block(engine, argv[0]):
        log_probs = torch.log_softmax(proposal.logits.float(), dim=-1)
        positions += 1
        accepted["chain"] += leading_matches(log_probs.argmax(dim=-1).tolist(), proposal.truth)
        for nodes in TREES:
            accepted[nodes] += accepted_in_tree(*tree_paths(log_probs, nodes), proposal.truth)
    costs = measure(engine.models, context=128, sizes=(1, 8, 16, 32), repeats=20)
    # a tree still comes from ONE draft pass over the trained block; only the verify widens
    cycle = {"chain": costs.cycle_ms(block), **{n: costs.verify_ms[n + 1] + costs.draft_ms[block] for n in TREES}}
    chain_rate = (1 + accepted["chain"] / positions) / cycle["chain"]
    print(f"{argv[0]}: {positions} positions; verify of 1 / 8 / 16 / 32 tokens "
          + " / ".join(f"{costs.verify_ms[b]:.2f}" for b in (1, 8, 16, 32)) + f" ms, draft pass {costs.draft_ms[block]:.2f} ms")
    for name, total in accepted.items():
        tau = 1 + total / positions
        label = f"chain (block {block})" if name == "chain" else f"tree of {name} nodes"
        print(f"{label:>18}: tau per position {tau:.2f}, cycle {cycle[name]:.2f} ms, "
              f"speed vs chain {tau / cycle[name] / chain_rate:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
