"""Where a DFlash cycle's time goes, on the compiled path or the eager one: per cycle the wall
time, the draft pass and the verify (with its rollback) as the decode loop times them, the rest
(acceptance, events, Python), and then cProfile's heaviest calls (matrix products, attention,
dynamo's guards and wrappers) over one more pass of the prompts.

    python scripts/cycle_profile.py --target assets/models/tiny-coder/target \
        --draft assets/models/tiny-coder/draft --prompts assets/prompts/unseen4.jsonl [--eager]

Greedy, 96 new tokens, block = the draft's, one torch thread (as bench). Every prompt runs once
to warm up, then twice timed. Run it on an idle machine; compare paths within one sitting.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

from engine.config import EngineConfig, SamplingConfig
from engine.events import Cycle, Finished
from engine.runtime import LocalEngine


def run(engine: LocalEngine, prompt_ids: list[int], sampling: SamplingConfig, compiled: bool):
    started, cycles, finished = time.perf_counter(), [], None
    for event in engine.generate(prompt_ids, sampling, None, slot_details=False, compiled=compiled):
        if isinstance(event, Cycle):
            cycles.append(event)
        elif isinstance(event, Finished):
            finished = event
    return time.perf_counter() - started, cycles, finished


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--prompts", required=True, help="JSON lines with 'prompt' (and 'kind': 'complete')")
    parser.add_argument("--eager", action="store_true", help="the eager path (default: compiled)")
    parser.add_argument("--top", type=int, default=12, help="cProfile rows to print")
    args = parser.parse_args()
    compiled = not args.eager
    engine = LocalEngine.load(EngineConfig(target=args.target, draft=args.draft, compile=compiled))
    try:
        if compiled:
            engine.compiled.wait()
            print("compiled path:", json.dumps(engine.path_info()["compile"]))
        sampling = SamplingConfig(temperature=0.0, max_new_tokens=96)
        rows = [json.loads(line) for line in open(args.prompts, encoding="utf-8") if line.strip()]
        prompts = [engine.encode(row["prompt"], raw=row.get("kind") == "complete") for row in rows]
        for ids in prompts:
            run(engine, ids, sampling, compiled)
        wall = draft_ms = verify_ms = 0.0
        tokens = cycles = 0
        for _ in range(2):
            for ids in prompts:
                seconds, events, finished = run(engine, ids, sampling, compiled)
                wall, tokens, cycles = wall + seconds, tokens + finished.new_tokens, cycles + len(events)
                draft_ms += sum(c.draft_ms for c in events)
                verify_ms += sum(c.verify_ms for c in events)
        per = 1000 * wall / cycles
        print(f"{'compiled' if compiled else 'eager'}: {tokens / wall:.1f} tok/s, {cycles} cycles, "
              f"{tokens / cycles:.2f} tokens a cycle; per cycle {per:.2f} ms = draft {draft_ms / cycles:.2f} + "
              f"verify and rollback {verify_ms / cycles:.2f} + the rest {per - (draft_ms + verify_ms) / cycles:.2f}")
        profile = cProfile.Profile()
        profile.enable()
        for ids in prompts:
            run(engine, ids, sampling, compiled)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
    finally:
        engine.close()
        if engine.compiled is not None:
            engine.compiled.join(timeout=60)


if __name__ == "__main__":
    main()
