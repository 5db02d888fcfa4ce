"""Replay block-size policies on recorded acceptance, without running the models again.

For a greedy reply, ``runs[p]`` is how many drafts the target accepts from a block anchored at
generated position ``p`` (the draft sees the same context whatever happened before, so this
depends on ``p`` only). A cycle at block ``b`` anchored there accepts ``min(runs[p], b - 1)``
and the next anchor is ``p + accepted + 1``: any fixed block size or fallback policy can be
replayed exactly (greedy only: sampling makes the reply itself depend on the block sizes).
Cycle costs per block size come from measurements (``bench --costs``). Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .config import FallbackConfig
from .fallback import FixedPolicy, MemorySlot, interpolate, make_policy

Costs = Mapping[int, tuple[float, float]]  # block size -> (draft_ms, verify_ms); block 1: (0, plain step)


@dataclass(frozen=True)
class Replay:
    taus: tuple[int, ...]
    ms: float  # modelled decode time

    @property
    def tokens(self) -> int:
        return sum(self.taus)


def fill_costs(measured: Mapping[int, tuple[float, float]], max_block: int) -> dict[int, tuple[float, float]]:
    """Costs for every block 1..max_block: draft and verify interpolated between measured sizes."""
    if 1 not in measured:
        raise ValueError("the costs need block 1 (one plain step)")
    drafted = {b: d for b, (d, _) in measured.items() if b > 1}
    verify = {b: v for b, (_, v) in measured.items()}
    return {b: (0.0 if b == 1 else interpolate(drafted, b) if drafted else 0.0, interpolate(verify, b))
            for b in range(1, max_block + 1)}


def replay(runs: Sequence[int], policy, costs: Costs) -> Replay:
    """Walk one reply (``len(runs) + 1`` generated tokens: the first comes from the prefill)."""
    total = len(runs) + 1
    position, taus, ms = 0, [], 0.0
    while position + 1 < total:
        block = min(policy.block_size, total - position)  # the loop shrinks the last block to fit
        accepted = min(runs[position], block - 1)
        draft_ms, verify_ms = costs[block]
        policy.observe(block, accepted, draft_ms, verify_ms)
        ms += draft_ms + verify_ms
        taus.append(min(accepted + 1, total - 1 - position))
        position += accepted + 1
    return Replay(tuple(taus), ms)


def compare(all_runs: Sequence[Sequence[int]], policies: Mapping[str, FallbackConfig | int], max_block: int,
            costs: Costs) -> dict[str, dict]:
    """Mean τ and modelled speedup over plain decoding of each policy on every reply: a
    ``FallbackConfig`` (adaptive) or an ``int`` (a fixed block size). The replies run in order on
    one engine, so an adaptive policy starts each reply from the last one's memory, as in ``bench``."""
    costs = fill_costs(costs, max_block)
    plain_ms = costs[1][1]
    results = {}
    for label, how in policies.items():
        taus, ms = [], 0.0
        memory = MemorySlot()  # one engine: each reply starts from what the last one learned
        for runs in all_runs:
            policy = FixedPolicy(how) if isinstance(how, int) else make_policy(how, max_block, memory.memory)
            result = replay(runs, policy, costs)
            memory.keep(policy)
            taus.extend(result.taus)
            ms += result.ms
        tokens = sum(taus)
        results[label] = {"mean_tau": round(tokens / len(taus), 4) if taus else 0.0,
                          "speedup": round(tokens * plain_ms / ms, 4) if ms else 0.0, "cycles": len(taus)}
    return results
