"""`dflash-studio generate`: one prompt, the reply coloured by token origin, or one JSON line."""

from __future__ import annotations

import argparse
import json
import sys

from engine.errors import CONTEXT_FULL

from .options import add_fallback_options, add_model_options, add_sampling_options, fallback_config, open_engine, sampling_config

# ANSI styles per origin (as in the app): accepted draft tokens green, the target's own tokens blue,
# rejected drafts red, struck through and dim.
STYLES = {"accepted": "\x1b[32m", "bonus": "\x1b[34m", "rejected": "\x1b[2;9;31m"}
RESET = "\x1b[0m"


def register(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="generate a reply to one prompt, showing what DFlash did")
    add_model_options(parser, compile_by_default=False)
    add_sampling_options(parser)
    add_fallback_options(parser)
    parser.add_argument("--raw", action="store_true", help="use the prompt as raw text, not through the chat template")
    parser.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=None,
                        help="a reasoning model's thinking on/off, where its template takes it (default: the "
                             "template's; docs/models.md, Chat formats)")
    parser.add_argument("--reasoning-effort", choices=["low", "medium", "high"], default=None,
                        help="harmony models (gpt-oss): the system message's reasoning level")
    parser.add_argument("--json", action="store_true", help="print one JSON object (last line of stdout)")
    parser.add_argument("--events", action="store_true", help="with --json: include every cycle")
    parser.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    parser.add_argument("--hide-rejected", action="store_true", help="do not print rejected draft tokens")
    parser.add_argument("prompt", help="the prompt ('-' reads standard input)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from engine.errors import check_prompt_text

    prompt = check_prompt_text(sys.stdin.read() if args.prompt == "-" else args.prompt)  # before loading anything
    sampling = sampling_config(args)
    engine = open_engine(args)
    try:
        return generate_with(engine, args, prompt, sampling)
    finally:
        engine.close()  # stops a vLLM server this command started


def generate_with(engine, args, prompt: str, sampling) -> int:
    from engine.errors import PromptTooLongError
    from engine.events import Cycle, Failed, Finished, Started, event_to_dict
    from engine.interface import capabilities_of

    from engine.chat_formats import ChatOptions
    from engine.errors import InvalidRequestError
    from engine.reasoning import encode_chat, reasoning_events

    options = ChatOptions(getattr(args, "thinking", None), getattr(args, "reasoning_effort", None))
    try:
        prompt_ids = encode_chat(engine, prompt, args.raw, options)
    except InvalidRequestError as exc:
        print(f"dflash-studio: error: {exc}", file=sys.stderr)
        return 2
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty() and not args.json)
    out = sys.stdout
    cycles, finished = [], None
    try:
        events = reasoning_events(engine, prompt_ids, args.raw, engine.generate(prompt_ids, sampling, fallback_config(args)))
    except PromptTooLongError as exc:
        print(f"dflash-studio: error: {exc}. Shorten the prompt.", file=sys.stderr)
        return 2
    for event in events:
        if isinstance(event, Started) and not args.json:
            out.write(paint(event.first_text, "bonus", color))
        elif isinstance(event, Cycle):
            cycles.append(event)
            if not args.json:
                write_cycle(out, event, color, show_rejected=not args.hide_rejected)
        elif isinstance(event, Finished):
            finished = event
        elif isinstance(event, Failed):
            print(f"\ndflash-studio: error: {event.message}", file=sys.stderr)
            return 2
        out.flush()
    summary = {
        "text": finished.text,  # a reasoning model's answer; its reasoning is apart
        "reasoning": finished.reasoning,
        "reasoning_tokens": finished.reasoning_tokens,
        "token_ids": list(finished.token_ids),
        "acceptance_lengths": list(finished.acceptance_lengths),
        "mean_acceptance_length": round(finished.mean_acceptance_length, 4),
        "per_position_acceptance": [round(p, 4) for p in finished.per_position_acceptance],
        "tokens": finished.new_tokens,
        "prompt_tokens": finished.prompt_tokens,
        "tokens_per_s": round(finished.tokens_per_s, 3),
        "seconds": round(finished.total_ms / 1000, 4),
        "finish_reason": finished.reason,
        "finish_note": CONTEXT_FULL if finished.context_full else "",
        "block_size": sampling.block_size or engine.block_size,
        "model": engine.name,
        "engine": capabilities_of(engine).kind,
    }
    if args.json:
        if args.events:
            summary["cycles"] = [event_to_dict(c) for c in cycles]
        print(json.dumps(summary, ensure_ascii=False))
    else:
        print()
        print(
            f"-- {finished.new_tokens} tokens in {finished.total_ms / 1000:.2f} s "
            f"({finished.tokens_per_s:.1f} tok/s), {finished.cycles} cycles, mean τ {finished.mean_acceptance_length:.2f}, "
            f"finish: {finished.reason}" + (f" ({CONTEXT_FULL})" if finished.context_full else ""),
            file=sys.stderr,
        )
        if not capabilities_of(engine).rejected_drafts:
            print(f"-- {capabilities_of(engine).rejected_note}", file=sys.stderr)
    return 0


def paint(text: str, origin: str, color: bool) -> str:
    return f"{STYLES[origin]}{text}{RESET}" if color and text else text


def write_cycle(out, cycle, color: bool, show_rejected: bool) -> None:
    for piece, origin in zip(cycle.emitted_pieces[: cycle.accepted], cycle.origins()):
        out.write(paint(piece, origin, color))
    if show_rejected and color and cycle.rejected:
        out.write(paint(cycle.rejected_text, "rejected", color))
    for piece in cycle.emitted_pieces[cycle.accepted:]:
        out.write(paint(piece, "bonus", color))
    if cycle.fallback.changed and color:
        out.write(f"\x1b[2;36m⟨{cycle.fallback.reason}⟩{RESET}")
