"""How fast replies answer while the compiled path compiles, against the same replies once it is
compiled: what a user meets right after a load, and after a first prompt too long for any
compiled bucket.

    python scripts/replies_while_compiling.py [--target DIR --draft DIR] [--prompts FILE]
    python scripts/replies_while_compiling.py --stream [--limit SECONDS] ...

(a) the first two requests of ``--prompts``, sent as soon as the pair is loaded (the
512-position bucket compiling), then the same two once it is compiled; (b) a prompt of about
700 tokens (a 1024-position bucket, compiled only once a reply needs it): the reply that queues
the compile, the same prompt twice more 2 s apart, and twice once compiled. Greedy, 64 new
tokens. Seconds per reply. ``--stream`` instead sends the requests of ``--prompts`` back to back
from the load on, one at a time as the app's worker runs them, until a reply is answered by the
compiled path (or ``--limit`` seconds): how long the compile takes while replies never stop,
against the compile time of the same start without them (run once with and once without, from
the same state of the cache). The state of inductor's on-disk cache decides how long compiling
takes: point ``TORCHINDUCTOR_CACHE_DIR`` at an empty folder for a first start, at a used one for
a later start. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import time

from engine.config import EngineConfig, SamplingConfig
from engine.runtime import LocalEngine

LONG_PROMPT = "Here is some context. " * 110 + "Write a function that adds two numbers."


def seconds(engine: LocalEngine, prompt: str, new_tokens: int = 64) -> float:
    prompt_ids = engine.encode(prompt)
    started = time.perf_counter()
    for _ in engine.generate(prompt_ids, SamplingConfig(max_new_tokens=new_tokens), slot_details=False):
        pass
    return round(time.perf_counter() - started, 2)


def stream(engine: LocalEngine, prompts: list[str], limit: float) -> None:
    """Replies back to back from the load on until the compiled path answers one."""
    started, times, eager = time.perf_counter(), [], 0
    while time.perf_counter() - started < limit:
        compiled = engine.compiled.wait(timeout=0)  # every pass compiled: this reply is answered compiled
        times.append(seconds(engine, prompts[len(times) % len(prompts)]))
        if compiled:
            break
        eager += 1
    report = engine.compiled.report.as_dict()
    print(f"stream: {eager} eager replies in {round(time.perf_counter() - started - times[-1], 1)} s "
          f"(mean {round(sum(times[:eager]) / max(1, eager), 3)} s), then compiled: {times[-1]} s; "
          f"compile under the stream: {report}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="default: the shipped default pair")
    parser.add_argument("--draft")
    parser.add_argument("--prompts", default="assets/prompts/unseen3.jsonl",
                        help="JSON lines with 'prompt'; the first two are sent")
    parser.add_argument("--stream", action="store_true", help="replies back to back until one is compiled")
    parser.add_argument("--limit", type=float, default=900.0, help="with --stream: give up after this many seconds")
    args = parser.parse_args()
    with open(args.prompts) as lines:
        prompts = [json.loads(line)["prompt"] for line in lines]

    engine = LocalEngine.load(EngineConfig(target=args.target, draft=args.draft, compile=True))
    try:
        if args.stream:
            return stream(engine, prompts, args.limit)
        prompts = prompts[:2]
        while_compiling = [seconds(engine, prompt) for prompt in prompts]
        engine.compiled.wait()
        compiled = [seconds(engine, prompt) for prompt in prompts]
        print(f"(a) after the load, while compiling: {while_compiling}; once compiled: {compiled}")
        queued = [seconds(engine, LONG_PROMPT)]
        for _ in range(2):
            time.sleep(2)
            queued.append(seconds(engine, LONG_PROMPT))
        engine.compiled.wait()
        compiled = [seconds(engine, LONG_PROMPT) for _ in range(2)]
        print(f"(b) {len(engine.encode(LONG_PROMPT))}-token prompt, its bucket compiling: {queued}; "
              f"once compiled: {compiled}")
        print(f"compile: {engine.compiled.report.as_dict()}")
    finally:
        engine.close()
        engine.compiled.join()


if __name__ == "__main__":
    main()
