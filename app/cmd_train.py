"""`dflash-studio train {tokenizer,target,draft,proposals,eval}`: build the embedded tiny coder, or a DFlash
draft for any transformers causal-LM target. Every command is seeded, resumable from the last
checkpoint in its work directory, shows a progress bar and writes a JSON-lines log."""

from __future__ import annotations

import argparse
from pathlib import Path

from .options import COUNT, FRACTION, NON_NEGATIVE, POSITIVE, POSITIVE_INT, layer_list, number, output_file


def _budget(args):
    from engine.extras import require
    from training.common import Budget

    require("tqdm", "train", "training (its progress bars)")  # before any work, not when the first bar opens

    if not (args.max_steps or args.max_tokens or args.max_minutes):
        args.max_minutes = args.default_minutes
    return Budget(max_steps=args.max_steps, max_tokens=args.max_tokens, max_minutes=args.max_minutes)


def _directory(path: Path | None, what: str) -> Path | None:
    """``path`` when it is a directory (or None); else a clear error before any work."""
    from engine.errors import InvalidRequestError

    if path is not None and not path.is_dir():
        raise InvalidRequestError(f"{what} {path} is a file; give a directory" if path.exists()
                                  else f"{what} not found: {path} (no such directory)")
    return path


def _output_dirs(args) -> None:
    """--out / --work: folders a run writes into (made when missing), refused when a file is there."""
    from engine.errors import InvalidRequestError

    for option in ("out", "work"):
        path = getattr(args, option, None)
        if path is not None and path.exists() and not path.is_dir():
            raise InvalidRequestError(f"--{option} {path} is a file; give a directory (it is made when missing)")


def _write_report(path: Path, report) -> None:
    import json

    from engine.errors import InvalidRequestError
    from engine.files import write_text_atomically

    try:
        write_text_atomically(path, json.dumps(report, indent=2) + "\n")
    except OSError as exc:
        raise InvalidRequestError(f"--out {path}: the report could not be written ({exc.strerror or exc})") from None


def _corpus(path: Path | None) -> Path | None:
    """--corpus: a directory with Python files in it (None: the standard library)."""
    from engine.errors import InvalidRequestError
    from training.corpus import list_source_files

    if _directory(path, "--corpus") is not None and not list_source_files(path):
        raise InvalidRequestError(f"--corpus {path} holds no .py file to train on")
    return path


def _tokenizer_dir(path: Path | None) -> Path | None:
    from engine.errors import InvalidRequestError

    if _directory(path, "--tokenizer") is not None and not any(
            (path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise InvalidRequestError(f"--tokenizer {path} holds no tokenizer (tokenizer.json), "
                                  "make one with `train tokenizer`")
    return path


def _target(source: str) -> str:
    """--target: a local directory, or a hub id from the cache (or downloaded), as the app loads it."""
    from engine.loading import resolve

    return str(resolve(source, "target"))


def _prompts(value: Path | None) -> Path | None:
    """--prompts: one of the built-in mixes, or a JSONL file whose every row is checked now."""
    from engine.errors import InvalidRequestError
    from training.draft import PROMPT_MIXES, read_prompt_rows

    if value is None or str(value) in PROMPT_MIXES:
        return value
    if not value.exists():
        raise InvalidRequestError(f"--prompts {value}: no such file (nor one of the mixes: {', '.join(PROMPT_MIXES)})")
    read_prompt_rows(value)
    return value


def _common(p: argparse.ArgumentParser, default_minutes: float) -> None:
    p.add_argument("--out", type=Path, required=True, help="output directory (the trained model)")
    p.add_argument("--work", type=Path, default=None,
                   help="checkpoints, cached data and log.jsonl (default: OUT/_train); "
                        "rerunning with the same --work resumes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=POSITIVE_INT, default=None, help="torch CPU threads")
    p.add_argument("--max-minutes", type=POSITIVE, default=None,
                   help=f"wall-clock training budget (default {default_minutes:g} when no other limit)")
    p.add_argument("--max-steps", type=POSITIVE_INT, default=None)
    p.add_argument("--max-tokens", type=POSITIVE_INT, default=None)
    p.add_argument("--checkpoint-minutes", type=POSITIVE, default=5.0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(default_minutes=default_minutes)


def run_tokenizer(args) -> int:
    from training.tokenizer import train_tokenizer

    _output_dirs(args)
    train_tokenizer(args.out, corpus=_corpus(args.corpus), vocab_size=args.vocab_size, seed=args.seed)
    return 0


def run_target(args) -> int:
    from engine.errors import InvalidRequestError
    from training.common import decay_start
    from training.target import TargetShape, TargetTrainConfig, train_target

    _output_dirs(args)
    shape = TargetShape(layers=args.layers or 12, hidden=args.hidden, intermediate=args.intermediate,
                        heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                        max_positions=args.max_positions)
    cfg = TargetTrainConfig(seq_len=args.seq_len, batch_size=args.batch_size, lr=args.lr,
                            chat_fraction=args.chat_fraction, name_weight=args.name_weight,
                            checkpoint_minutes=args.checkpoint_minutes,
                            eval_windows=args.eval_windows, samples=args.samples,
                            sample_tokens=args.sample_tokens,
                            unlikelihood_weight=args.unlikelihood_weight, decay_minutes=args.decay_minutes)
    if args.tokenizer is None and args.init is None:
        raise InvalidRequestError("train target: give --tokenizer (from `train tokenizer`), or --init")
    _tokenizer_dir(args.tokenizer)
    _directory(args.init, "--init")
    _directory(args.unlikelihood, "--unlikelihood")
    _corpus(args.corpus)
    budget = _budget(args)
    decay_start(budget, args.decay_minutes)  # refuses a decay without a time budget before any work
    train_target(args.out, args.tokenizer, work=args.work, corpus=args.corpus, shape=shape,
                 cfg=cfg, budget=budget, seed=args.seed, threads=args.threads,
                 progress=not args.no_progress, init=args.init, unlikelihood=args.unlikelihood,
                 train_from_layer=args.train_from_layer, data_mix=args.data, own_replies=args.own_replies,
                 grow_to=args.layers if args.init else None, device=args.device)
    return 0


def run_draft(args) -> int:
    from training.draft import DraftTrainConfig, train_draft

    _output_dirs(args)
    cfg = DraftTrainConfig(
        layers=args.layers, block_size=args.block_size, gamma=args.gamma,
        target_layer_ids=args.target_layer_ids, num_target_features=args.num_features,
        lr=args.lr, batch_size=args.batch_size, anchors=args.anchors,
        num_sequences=args.num_sequences, prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens, gen_batch=args.gen_batch, chat_fraction=args.chat_fraction,
        gen_fraction=args.gen_fraction, checkpoint_minutes=args.checkpoint_minutes,
        eval_sequences=args.eval_sequences, dtype=args.dtype, device=args.device,
        cache_features_gb=args.cache_features_gb, min_prompt_tokens=args.min_prompt_tokens,
        init_from=str(args.init) if args.init else None, trim_loops=args.trim_loops,
        intermediate_size=args.intermediate_size,
    )
    target, corpus, prompts = _target(args.target), _corpus(args.corpus), _prompts(args.prompts)
    _directory(args.init, "--init")
    train_draft(args.out, target, work=args.work, corpus=corpus,
                prompts_file=prompts, cfg=cfg, budget=_budget(args), seed=args.seed,
                threads=args.threads, progress=not args.no_progress)
    return 0


def run_eval(args) -> int:
    import json

    if args.pass1:
        return run_pass1(args)
    from engine.loading import assets_dir, embedded_pair
    from training.evaluate import evaluate_target

    output_file(args.out, "--out", "report.json")
    target = args.target or embedded_pair()[0]
    prompts = args.prompts or assets_dir() / "prompts" / "heldout_requests.jsonl"
    report = evaluate_target(target, prompts, args.max_new_tokens, args.threads,
                             log=(lambda _line: None) if args.json else print)
    if args.out:
        _write_report(args.out, report)
    summary = {k: v for k, v in report.items() if k != "replies"}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_eval_summary(summary))
    return 0


def pass1_pairs(args) -> list[tuple[str, str, str | None]]:
    """(name, target, draft) to score: the pair given, else every shipped pair (by the names
    the app's menu shows)."""
    from engine.shipped import SHIPPED_PAIRS, pair_dirs, pair_name

    if args.target or args.draft:
        from engine.loading import embedded_pair

        target = args.target or embedded_pair()[0]
        draft = str(args.draft) if args.draft else None
        return [(pair_name(target, draft), str(target), draft)]
    return [(pair.name, str(target), str(draft)) for pair in SHIPPED_PAIRS
            for target, draft in [pair_dirs(pair)] if target.is_dir() and draft.is_dir()]


def pass1_set_names(text: str) -> list[str]:
    """--pass1-sets: comma-separated names of training.pass1.PASS1_SETS."""
    from training.pass1 import PASS1_SETS

    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PASS1_SETS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"choose among {', '.join(PASS1_SETS)} (comma-separated), "
                                         f"not {text!r}")
    return names


def pass1_sets(args) -> list[tuple[str, Path]]:
    """(set name, file) to score: --prompts alone when given, else the --pass1-sets chosen (default all)."""
    from engine.loading import assets_dir
    from training.pass1 import PASS1_SETS

    if args.prompts:
        return [(args.prompts.stem, args.prompts)]
    return [(name, assets_dir() / "prompts" / PASS1_SETS[name]) for name in args.pass1_sets or PASS1_SETS]


def run_pass1(args) -> int:
    """`train eval --pass1`: pass@1 of each pair's greedy replies on requests with unit tests,
    one report per pair and set."""
    import json
    import time

    from engine.config import EngineConfig
    from engine.runtime import Engine
    from training.pass1 import SandboxLimits, pair_replies, read_tasks, score_pair

    output_file(args.out, "--out", "report.json")
    sets = [(name, path, read_tasks(path)) for name, path in pass1_sets(args)]  # a bad file fails before loading
    quiet = (lambda _line: None) if args.json else print
    reports = []
    for label, target, draft in pass1_pairs(args):
        engine = Engine.load(EngineConfig(target=target, draft=draft, device=args.device, threads=args.threads,
                                          speculative=draft is not None))
        pair_reports = []
        for name, path, tasks in sets:
            quiet(f"{label}: set {name} ({path})")
            start = time.time()
            replies = pair_replies(engine, tasks, args.max_new_tokens, followups=not args.no_followups,
                                   compare_plain=args.compare_plain, log=quiet)
            seconds = time.time() - start
            report = score_pair(tasks, replies, SandboxLimits(), log=quiet)
            pair_reports.append({"pair": label, "set": name, "target": target, "draft": draft, "prompts": str(path),
                                 "block_size": engine.block_size, "max_new_tokens": args.max_new_tokens,
                                 "generation_seconds": round(seconds, 1), **report})
        reports += pair_reports
        if not args.json:
            print(format_pass1_pair(pair_reports))
    if args.out:
        _write_report(args.out, reports)
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "replies"} for r in reports]))
    return 0


def _counts(t: dict, cut: bool = False) -> str:
    strict, lenient = (t["cut_strict"], t["cut_lenient"]) if cut else (t["strict"], t["lenient"])
    pct = (lambda k: f"{100.0 * k / t['n']:.1f} %") if t["n"] else (lambda k: "-")
    return f"strict {strict}/{t['n']} ({pct(strict)}), lenient {lenient}/{t['n']} ({pct(lenient)})"


def _strict_lenient(t: dict) -> str:
    return f"{t['strict']}/{t['n']} / {t['lenient']}/{t['n']}" if t["n"] else "-"


def format_pass1_pair(reports: list[dict]) -> str:
    """One pair's sets: a headline of every figure (strict first), then each set in full."""
    figures = []
    for r in reports:
        figure = f"{r['set']}: alone {_strict_lenient(r['alone'])}"
        if r["followups"]["n"]:
            figure += f", {'edits' if r['edit_followups'] else 'follow-ups'} {_strict_lenient(r['followups'])}"
        figures.append(figure)
    headline = f"pair {reports[0]['pair']}, pass@1 strict / lenient · " + " · ".join(figures)
    return "\n".join([headline] + [format_pass1_summary(r) for r in reports])


def format_pass1_summary(r: dict) -> str:
    edits = r.get("edit_followups")
    lines = [
        f"set {r.get('set', r['prompts'])}: pair {r['pair']}, greedy, block {r['block_size']}, up to "
        f"{r['max_new_tokens']} new tokens, {r['alone']['n']} requests" + (" opening a chat" if edits else "")
        + f" from {r['prompts']}, generated in {r['generation_seconds']} s"
        + (f", mean τ {r['mean_tau']:.2f}" if r.get("mean_tau") else "")
        + (f", identical to plain decoding {r['identical']}" if r.get("identical") else ""),
        f"  pass@1, each {'opening ' if edits else ''}request alone: {_counts(r['alone'])}",
        f"    cut after the reply's first definition: {_counts(r['alone'], cut=True)}",
    ]
    if not edits:  # the openings of edit chats are few and not what that set measures
        lines.append(f"    tasks the training data covers in other words: {_counts(r['alone_trained_topic'])}; "
                     f"others: {_counts(r['alone_other_topic'])}")
    if r["followups"]["n"]:
        turns = " · ".join(f"turn {t}: {_counts(c)}" for t, c in r["followups_by_turn"].items())
        what = "edits of the previous turn's function" if edits else "follow-ups in one chat"
        lines.append(f"  pass@1, {what}: {_counts(r['followups'])} ({turns})")
        if r["followup_requests_alone"]["n"]:
            lines.append(f"    the same requests alone: {_counts(r['followup_requests_alone'])}")
        lines.append(f"    cut after the first definition: {_counts(r['followups'], cut=True)}")
        if r["whole_chats"]["n"]:
            lines.append(f"    whole chats, every turn passed: {_counts(r['whole_chats'])}")
    lines.append("  strict: the function must have the expected name (after a rename, the new one); "
                 "lenient: or be the only one the reply defines")
    return "\n".join(lines)


def run_proposals(args) -> int:
    from engine.errors import InvalidRequestError
    from training.proposal_vocab import build_proposal_ids

    _output_dirs(args)
    missing = [str(pool) for pool in args.pool or () if not pool.is_file()]
    if missing:
        raise InvalidRequestError(f"--pool: no such file: {', '.join(missing)}")
    build_proposal_ids(_target(args.target), _directory(args.draft, "--draft"), args.size, pools=args.pool,
                       work=args.work, prompts_file=_prompts(args.prompts), corpus=_corpus(args.corpus),
                       num_sequences=args.num_sequences,
                       chat_fraction=args.chat_fraction, new_tokens=args.new_tokens, seed=args.seed,
                       threads=args.threads, progress=not args.no_progress)
    return 0


def format_eval_summary(s: dict) -> str:
    def pct(key: str) -> str:  # None where the set has no prompt of that kind
        return "-" if s[key] is None else f"{s[key]} %"

    return "\n".join([
        f"target {s['target']} on {s['prompts']} ({s['seconds']} s, greedy, up to {s['max_new_tokens']} new tokens)",
        f"chat requests: {s['chat_requests']}  parse + define a function/class {pct('chat_parse_define_pct')}  "
        f"on topic {pct('chat_on_topic_pct')} (key word in the name: {pct('chat_names_it_pct')})",
        f"code prefixes: {s['code_prefixes']}  parse when closed {pct('prefix_parses_closed_pct')}  "
        f"use the function's parameters {pct('prefix_uses_params_pct')}",
        f"replies ending at a stop token {pct('ended_pct')}, loops {s['loops']}",
    ])


def register(subparsers) -> None:
    train = subparsers.add_parser("train", help="train the tokenizer, the target or a DFlash draft")
    sub = train.add_subparsers(dest="train_command", metavar="WHAT")
    _register_tokenizer(sub)
    _register_target(sub)
    _register_draft(sub)
    _register_proposals(sub)
    _register_eval(sub)
    train.set_defaults(func=lambda args: (train.print_help() or 1))


def _register_tokenizer(sub) -> None:
    p = sub.add_parser("tokenizer", help="byte-level BPE on Python source")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--corpus", type=Path, default=None,
                   help="directory of *.py files (default: this Python's standard library)")
    p.add_argument("--vocab-size", type=POSITIVE_INT, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_tokenizer)


def _register_target(sub) -> None:
    p = sub.add_parser("target", help="a small Qwen3ForCausalLM coder, from scratch or fine-tuned")
    _common(p, default_minutes=50)
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="directory from `train tokenizer` (default with --init: the init model's)")
    p.add_argument("--init", type=Path, default=None,
                   help="fine-tune this saved target instead of starting from scratch (its shape is kept, "
                        "but for a deeper --layers)")
    p.add_argument("--unlikelihood", type=Path, default=None,
                   help="a `train draft` --work directory: the target's own greedy continuations; "
                        "tokens that continue a back-to-back repeat of 8+ tokens get an unlikelihood "
                        "loss, so greedy replies stop looping")
    p.add_argument("--unlikelihood-weight", type=NON_NEGATIVE, default=1.0)
    p.add_argument("--train-from-layer", type=COUNT, default=0,
                   help="with --init: train only the decoder layers from this index up (and the final "
                        "norm); the embedding, lm_head and lower layers stay bit-identical, so an existing "
                        "DFlash draft whose target layers all lie below keeps working")
    p.add_argument("--corpus", type=Path, default=None)
    p.add_argument("--data", choices=("corpus", "requests", "copy", "wording", "tasks", "coder"), default="corpus",
                   help="corpus: raw source + docstring chat pairs (the base run); requests: request -> "
                        "code fine-tuning data (simple tasks written as data, docstring pairs from the "
                        "standard library and permissively licensed packages, raw code); copy: requests with "
                        "4,000 invented words in the record tasks (names right only by copying the "
                        "request); wording: copy with half the requests worded as users type them "
                        "(capitalised names and acronyms, 'check if'); tasks: only the simple tasks (a "
                        "second, sharpening fine-tune); coder: the default coder's data (copy, with the "
                        "tasks in many wordings, the extra tasks, follow-ups that edit the previous "
                        "function, requests that state an edge case or a name)")
    p.add_argument("--layers", type=POSITIVE_INT, default=None,
                   help="decoder layers (default 12); with --init, a depth above the init model's grows it: "
                        "the added layers are copies spread evenly through the stack whose output projections "
                        "start at zero, so the grown model starts out computing exactly what the init did")
    p.add_argument("--hidden", type=POSITIVE_INT, default=256)
    p.add_argument("--intermediate", type=POSITIVE_INT, default=768)
    p.add_argument("--heads", type=POSITIVE_INT, default=4)
    p.add_argument("--kv-heads", type=POSITIVE_INT, default=2)
    p.add_argument("--head-dim", type=POSITIVE_INT, default=64)
    p.add_argument("--max-positions", type=POSITIVE_INT, default=1024)
    p.add_argument("--seq-len", type=number(int, 2), default=256)
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:1 … (default: cuda if available); the weights stay fp32, "
                        "CUDA runs the forward passes in bf16 autocast")
    p.add_argument("--batch-size", type=POSITIVE_INT, default=16)
    p.add_argument("--lr", type=NON_NEGATIVE, default=1.5e-3)
    p.add_argument("--decay-minutes", type=POSITIVE, default=None,
                   help="hold the peak learning rate and decay it over the budget's last N minutes "
                        "(warmup-stable-decay), instead of a cosine over the whole run: a resumed run can "
                        "be given a longer --max-minutes, and a copy of its work directory resumed with "
                        "--max-minutes ELAPSED+N cools any checkpoint into a model")
    p.add_argument("--chat-fraction", type=FRACTION, default=0.5)
    p.add_argument("--name-weight", type=POSITIVE, default=1.0,
                   help="with --data requests: loss weight of a reply's first line (the def/class name)")
    p.add_argument("--own-replies", type=COUNT, default=0,
                   help="with --init and --data coder: the init model first answers this many training requests; "
                        "follow-up chats then edit those replies too, answered by the requested function")
    p.add_argument("--eval-windows", type=POSITIVE_INT, default=24)
    p.add_argument("--samples", type=COUNT, default=6, help="greedy samples per evaluation")
    p.add_argument("--sample-tokens", type=POSITIVE_INT, default=96)
    p.set_defaults(func=run_target)


def _register_draft(sub) -> None:
    p = sub.add_parser("draft", help="a DFlash draft for any causal-LM target (self-distillation)")
    _common(p, default_minutes=35)
    p.add_argument("--target", required=True, help="target model directory or hub id")
    p.add_argument("--corpus", type=Path, default=None,
                   help="directory of *.py files for prompts (default: the standard library)")
    p.add_argument("--prompts", type=Path, default=None,
                   help='optional JSONL of {prompt|messages} records used as extra prompts, or "requests": the '
                        "request -> code target's own kind of prompts (request_data.draft_prompt_rows), or "
                        '"requests-wide": those and as many again that it never saw (draft_prompts), or "coder": '
                        "the --data coder target's prompts (every wording, the extra tasks, follow-ups that ask "
                        'to edit a first reply) and as many it never saw, or "code-wide": '
                        'fewer of those and more code prefixes, in more shapes (imports above a def, bare '
                        'signatures, methods under their class)')
    p.add_argument("--layers", type=POSITIVE_INT, default=2)
    p.add_argument("--intermediate-size", type=POSITIVE_INT, default=None,
                   help="the draft's MLP width (default: the target's); its hidden size is the target's, "
                        "whose embedding and head it shares")
    p.add_argument("--block-size", type=number(int, 2, 16, "between 2 and 16"), default=8)
    p.add_argument("--gamma", type=POSITIVE, default=None, help="loss decay (default: 4 for B=8, 7 for 16)")
    p.add_argument("--target-layer-ids", type=layer_list, default=None,
                   help="the target layers whose features feed the draft (e.g. 1,4,6,9; default: --num-features "
                        "layers spread from layer 1 to depth - 3)")
    p.add_argument("--num-features", type=POSITIVE_INT, default=4,
                   help="how many target layers feed the draft when --target-layer-ids is not set")
    p.add_argument("--lr", type=NON_NEGATIVE, default=6e-4)
    p.add_argument("--batch-size", type=POSITIVE_INT, default=8, help="sequences per step")
    p.add_argument("--anchors", type=POSITIVE_INT, default=64, help="random blocks per sequence")
    p.add_argument("--num-sequences", type=POSITIVE_INT, default=2048, help="regenerated sequences (at most)")
    p.add_argument("--prompt-tokens", type=POSITIVE_INT, default=128)
    p.add_argument("--new-tokens", type=POSITIVE_INT, default=160)
    p.add_argument("--gen-batch", type=POSITIVE_INT, default=64)
    p.add_argument("--chat-fraction", type=FRACTION, default=0.5)
    p.add_argument("--gen-fraction", type=number(float, 0.01, 0.99, "between 0.01 and 0.99"), default=0.35,
                   help="share of the time budget for regenerating data")
    p.add_argument("--eval-sequences", type=POSITIVE_INT, default=32)
    p.add_argument("--min-prompt-tokens", type=POSITIVE_INT, default=16)
    p.add_argument("--cache-features-gb", type=NON_NEGATIVE, default=4.0,
                   help="keep the frozen target's features in RAM when they fit (0: always online)")
    p.add_argument("--dtype", default=None, help="target dtype (float32, bfloat16); default auto")
    p.add_argument("--device", default=None)
    p.add_argument("--init", type=Path, default=None,
                   help="fine-tune an existing draft (z-lab format) instead of starting from random "
                        "weights, e.g. after the target was trained further; its target layers and "
                        "mask id are kept. With --layers above its depth, or --target-layer-ids "
                        "adding layers to the ones it reads, the draft grows: the new parts start "
                        "unused, so training begins from the same proposals")
    p.add_argument("--trim-loops", action="store_true",
                   help="cut each regenerated continuation after the second copy of a repeated span "
                        "of 8+ tokens (for targets whose greedy text loops; the held-out estimate of "
                        "tau then stops counting easy repetition)")
    p.set_defaults(func=run_draft)


def _register_proposals(sub) -> None:
    p = sub.add_parser("proposals", help="let a draft propose from the ids its target writes most (a cheap head "
                                         "that can still propose the target's words)")
    p.add_argument("--target", required=True, help="the target the draft serves")
    p.add_argument("--draft", type=Path, required=True,
                   help="draft directory: its config.json gets dflash_config.proposal_ids (weights untouched)")
    p.add_argument("--size", type=POSITIVE_INT, default=2048, help="how many ids it may propose (default 2048)")
    p.add_argument("--pool", type=Path, nargs="+", default=None,
                   help="count the target's replies already in these sequence pools (a `train draft` work "
                        "directory's train_sequences.pt) instead of generating new ones")
    p.add_argument("--work", type=Path, default=None,
                   help="where to generate the replies to count (resumable); needed without --pool")
    p.add_argument("--prompts", type=Path, default=None,
                   help="prompt mix, as for `train draft --prompts` (a JSONL file, requests, requests-wide, "
                        "code-wide); default: code prefixes and chat requests from the corpus")
    p.add_argument("--corpus", type=Path, default=None, help="directory of *.py files (default: the standard library)")
    p.add_argument("--num-sequences", type=POSITIVE_INT, default=1200, help="replies to generate (default 1200)")
    p.add_argument("--chat-fraction", type=FRACTION, default=0.5)
    p.add_argument("--new-tokens", type=POSITIVE_INT, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=POSITIVE_INT, default=None)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_proposals)


def _register_eval(sub) -> None:
    p = sub.add_parser("eval", help="score a target's greedy replies to coding requests (held-out set), "
                                    "or pass@1 on requests with unit tests (--pass1)")
    p.add_argument("--target", type=Path, default=None, help="target directory (default: the embedded one)")
    p.add_argument("--prompts", type=Path, default=None,
                   help="JSONL prompts (default: assets/prompts/heldout_requests.jsonl, never trained on; "
                        "with --pass1: one set in place of --pass1-sets)")
    p.add_argument("--max-new-tokens", type=POSITIVE_INT, default=160)
    p.add_argument("--threads", type=POSITIVE_INT, default=None)
    p.add_argument("--out", type=Path, default=None, help="write the full report (every reply) as JSON")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--pass1", action="store_true",
                   help="pass@1 instead: run each greedy reply's code against the unit tests of each set "
                        "(in a sandboxed child Python), for each request alone and as follow-ups in one chat; "
                        "for the pair given by --target/--draft, else every shipped pair")
    p.add_argument("--pass1-sets", type=pass1_set_names, default=None, metavar="SET[,SET...]",
                   help="with --pass1: which sets to score (default all): requests "
                        "(assets/prompts/requests_pass1.jsonl), requests_b (requests_pass1_b.jsonl, a second set "
                        "written apart), requests_c (requests_pass1_c.jsonl, a third, written blind to the "
                        "training data), edits (followups_pass1.jsonl, chats whose later turns edit the previous "
                        "function), edits_b (followups_pass1_b.jsonl, a second such set written apart); "
                        "--prompts replaces them with one file")
    p.add_argument("--draft", type=Path, default=None, help="with --pass1: the pair's draft (DFlash decoding)")
    p.add_argument("--device", default=None, help="with --pass1: cpu, cuda … (default: cuda if available)")
    p.add_argument("--no-followups", action="store_true", help="with --pass1: each request alone only")
    p.add_argument("--compare-plain", action="store_true",
                   help="with --pass1: also decode every request without the draft and count identical replies")
    p.set_defaults(func=run_eval)
