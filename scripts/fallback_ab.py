"""Which fallback setting is fastest on this machine? Settings side by side in one sitting
(docs/performance.md's A/Bs).

    python3 scripts/fallback_ab.py PROMPTS.jsonl TEMPERATURE BLOCK [TARGET DRAFT]

Per prompt, interleaved, twice (fastest run kept): our loop at block 1 (plain decoding), DFlash
with the default fallback (window 32, first decision after 4 cycles, probe budget 1 %), with a
short window (8, after 2), with a larger probe budget (3 %) and with fixed blocks. Each fallback runs on its own engine, so each keeps its own memory
across replies as in `bench`. Prints tokens/s, speedup over block 1 and mean tau per path.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from engine.bench import read_prompts, run_dflash
from engine.config import EngineConfig, FallbackConfig, SamplingConfig
from engine.runtime import Engine

REPEATS = 2
POLICIES = {"default": FallbackConfig(), "window8": FallbackConfig(window=8, min_cycles_before_switch=2),
            "b3%": FallbackConfig(probe_budget=0.03), "fixed": FallbackConfig(enabled=False)}


def main(argv: list[str]) -> None:
    prompts, temperature, block = argv[0], float(argv[1]), int(argv[2])
    config = EngineConfig(target=argv[3] if len(argv) > 4 else None, draft=argv[4] if len(argv) > 4 else None,
                          threads=1)
    # one engine per adaptive policy, so each keeps its own fallback memory across replies
    engines = {path: Engine.load(config) for path, policy in POLICIES.items() if policy.enabled}
    engines["plain"] = engines["fixed"] = engines["default"]  # neither touches the fallback memory
    totals = {path: [0, 0.0, []] for path in ("plain", *POLICIES)}
    for number, item in enumerate(read_prompts(prompts)):
        ids = engines["default"].encode(item.prompt, raw=item.raw)
        sampling = engines["default"].check_request(ids, SamplingConfig(
            max_new_tokens=96, temperature=temperature, block_size=block, seed=1234 + number))
        best = {}
        for _ in range(REPEATS):
            for path in totals:
                run_sampling = replace(sampling, block_size=1) if path == "plain" else sampling
                finished, _ = run_dflash(engines[path], ids, run_sampling, POLICIES.get(path))
                rate = finished.new_tokens / (finished.total_ms / 1000)
                if path not in best or rate > best[path][0]:
                    best[path] = (rate, finished)
        for path, (_, finished) in best.items():
            totals[path][0] += finished.new_tokens
            totals[path][1] += finished.total_ms / 1000
            totals[path][2] += list(finished.acceptance_lengths)
    plain = totals["plain"][0] / totals["plain"][1]
    for path in POLICIES:
        tokens, seconds, taus = totals[path]
        print(f"{path:6s} {tokens / seconds:7.1f} tok/s  {tokens / seconds / plain:.3f}x  "
              f"tau {sum(taus) / max(1, len(taus)):.2f}")
    print(f"plain  {plain:7.1f} tok/s  ({prompts}, T={temperature}, block {block})")


if __name__ == "__main__":
    main(sys.argv[1:])
