"""Command-line options shared by several commands, and their conversion to config objects."""

from __future__ import annotations

import argparse

from engine.config import PROPOSALS, EngineConfig, FallbackConfig, SamplingConfig


def add_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--target", metavar="DIR|REPO", help="target model (default: the embedded tiny coder)")
    group.add_argument("--draft", metavar="DIR|REPO", help="DFlash draft (z-lab format; REPO/SUBFOLDER allowed)")
    group.add_argument("--device", help="cpu, cuda, cuda:1 … (default: cuda if available)")
    group.add_argument("--dtype", help="float32, bfloat16, float16 (default: bfloat16 on cuda, float32 on cpu)")
    group.add_argument("--threads", type=int, help="CPU threads for torch (default: 1 for small models on CPU)")


def add_sampling_options(parser: argparse.ArgumentParser, max_new_tokens: int = 256) -> None:
    group = parser.add_argument_group("decoding")
    group.add_argument("--block-size", type=int, help="tokens per draft+verify block (1 = no speculation; default: the draft's)")
    group.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    group.add_argument("--temperature", type=float, default=0.0)
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--top-k", type=int, default=0)
    group.add_argument("--seed", type=int)
    add_proposal_option(group)


def add_proposal_option(group) -> None:
    group.add_argument("--proposal", choices=list(PROPOSALS), default="sample",
                       help="T > 0: draft tokens drawn from the draft's distribution (sample, default) or its "
                            "argmax; both are lossless speculative sampling")


def add_fallback_options(parser: argparse.ArgumentParser, default: bool = False) -> None:
    parser.add_argument("--fallback", action=argparse.BooleanOptionalAction, default=default,
                        help="dynamic fallback: smaller blocks or no speculation when drafting stops paying")
    parser.add_argument("--fallback-preset", choices=["code", "math", "agent"],
                        help="use the fixed τ thresholds of the seed articles instead of the cost model")


def engine_config(args) -> EngineConfig:
    return EngineConfig(target=args.target, draft=args.draft, device=args.device, dtype=args.dtype,
                        threads=getattr(args, "threads", None))


def sampling_config(args) -> SamplingConfig:
    return SamplingConfig(
        max_new_tokens=args.max_new_tokens, block_size=args.block_size, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, seed=args.seed, proposal=args.proposal,
    ).validate()


def fallback_config(args) -> FallbackConfig:
    return FallbackConfig(enabled=bool(args.fallback), preset=getattr(args, "fallback_preset", None))
