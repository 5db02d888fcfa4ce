"""Command-line options shared by several commands, and their conversion to config objects."""

from __future__ import annotations

import argparse
import shlex

from engine.config import PROPOSALS, EngineConfig, FallbackConfig, SamplingConfig


def number(kind, low: float, high: float | None = None, what: str = ""):
    """An argparse type: a ``kind`` number from ``low`` (up to ``high``), refused in one line otherwise."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {what or f'at least {low:g}'} (got {text})")
        return value
    return parse


def layer_list(text: str) -> list[int]:
    """An argparse type: comma-separated layer numbers (``1,4,6,9``), refused in one line otherwise."""
    try:
        layers = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of layer numbers (e.g. 1,4,6,9)") from None
    if any(layer < 0 for layer in layers):
        raise argparse.ArgumentTypeError(f"layer numbers start at 0 (got {text})")
    return layers


def output_file(path, option: str, example: str) -> None:
    """A file a command writes when it ends, refused before any work when it names a directory."""
    from pathlib import Path

    from engine.errors import InvalidRequestError

    if path is not None and Path(path).is_dir():
        raise InvalidRequestError(f"{option} {path} is a directory; give a file, such as {Path(path) / example}")


POSITIVE_INT = number(int, 1)
COUNT = number(int, 0)  # zero allowed: "none"
FRACTION = number(float, 0.0, 1.0, "between 0 and 1")
POSITIVE = number(float, 1e-12, what="above 0")
NON_NEGATIVE = number(float, 0.0)


def add_model_options(parser: argparse.ArgumentParser, compile_by_default: bool = True) -> None:
    """``compile_by_default``: False for commands that answer one reply (the compile would
    finish after it)."""
    group = parser.add_argument_group("model")
    group.add_argument("--target", metavar="DIR|REPO", help="target model (default: tiny-coder, the shipped pair that answers requests)")
    group.add_argument("--draft", metavar="DIR|REPO", help="DFlash draft (z-lab format; REPO/SUBFOLDER and @REVISION allowed)")
    group.add_argument("--device", help="cpu, cuda, cuda:1 … (default: cuda if available)")
    group.add_argument("--dtype", help="float32, bfloat16, float16 (default: bfloat16 on cuda, float32 on cpu)")
    group.add_argument("--threads", type=POSITIVE_INT, help="CPU threads for torch (default: 1 for small models on CPU)")
    group.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                       help="the compiled path: static caches and torch.compile (CUDA graphs on a GPU), compiled in "
                            "the background while the eager path answers the first replies (default: "
                            + (f"on; {COMPILE_ENV}=0 turns the default off)" if compile_by_default else "off)"))
    parser.set_defaults(compile_by_default=compile_by_default)
    add_engine_options(parser)


COMPILE_ENV = "DFLASH_STUDIO_COMPILE"


def compile_default(args) -> bool:
    """--compile / --no-compile, else on unless the environment says 0 (the test suite does:
    a compile in every engine it loads would cost minutes of CPU)."""
    import os

    chosen = getattr(args, "compile", None)
    if chosen is not None:
        return bool(chosen)
    if not getattr(args, "compile_by_default", True):
        return False
    return os.environ.get(COMPILE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine (vLLM: see README, 'Run on vLLM')")
    group.add_argument("--engine", choices=["local", "vllm"], default="local",
                       help="local: torch in this process (default); vllm: DFlash served by vLLM")
    group.add_argument("--engine-url", metavar="URL", help="with --engine vllm: a running vLLM server "
                       "(started with --per-request-spec-decode-metrics detailed --enable-per-request-metrics)")
    group.add_argument("--engine-api-key", metavar="KEY", help="the API key of --engine-url")
    group.add_argument("--engine-plain-url", metavar="URL", help="with --engine-url: a second server for the same "
                       "target without a draft, for Compare and bench's plain runs")
    group.add_argument("--vllm-python", metavar="PATH", help="vLLM's interpreter (default: the venv that "
                       "scripts/install_vllm.sh builds)")
    group.add_argument("--tensor-parallel-size", type=POSITIVE_INT, default=1, help="vLLM: GPUs per pipeline stage")
    group.add_argument("--pipeline-parallel-size", type=POSITIVE_INT, default=1, help="vLLM: pipeline stages (nodes)")
    group.add_argument("--vllm-args", action="append", default=[], metavar="'ARGS'",
                       help="more arguments for the vLLM server, as one quoted string (repeatable)")


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
                        help="fixed τ thresholds by kind of task (code 6, math 5, agent 4) instead of the cost model")


def engine_config(args) -> EngineConfig:
    return EngineConfig(target=args.target, draft=args.draft, device=args.device, dtype=args.dtype,
                        threads=getattr(args, "threads", None), compile=compile_default(args))


def vllm_config(args):
    """The vLLM settings of ``--engine vllm`` (None for the local engine), checked at the edge."""
    if getattr(args, "engine", "local") != "vllm":
        return None
    from engine.vllm import VLLMConfig

    extra = tuple(part for chunk in args.vllm_args for part in shlex.split(chunk))
    return VLLMConfig(
        url=args.engine_url, api_key=args.engine_api_key, target=args.target, draft=args.draft,
        block_size=block if (block := getattr(args, "block_size", None)) and block > 1 else None,
        python=args.vllm_python, device=args.device, dtype=args.dtype,
        tensor_parallel_size=args.tensor_parallel_size, pipeline_parallel_size=args.pipeline_parallel_size,
        extra_args=extra, plain_url=args.engine_plain_url,
    ).validate()


def open_engine(args, progress=None):
    """The engine the command line asks for: the local one, or vLLM (started, or at --engine-url)."""
    config = vllm_config(args)
    if config is None:
        from engine.runtime import Engine

        return Engine.load(engine_config(args), progress=progress)
    from engine.vllm import VLLMEngine

    return VLLMEngine.open(config, progress or StderrProgress())


class StderrProgress:
    """Start-up progress on stderr, at most every few seconds (a vLLM server takes a while)."""

    def __init__(self, every_s: float = 5.0):
        self.every_s = every_s
        self.last = float("-inf")

    def __call__(self, fraction: float, message: str) -> None:
        import sys
        import time

        now = time.monotonic()
        if now - self.last >= self.every_s or fraction >= 1.0:
            self.last = now
            print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)


def sampling_config(args) -> SamplingConfig:
    return SamplingConfig(
        max_new_tokens=args.max_new_tokens, block_size=args.block_size, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, seed=args.seed, proposal=args.proposal,
    ).validate()


def fallback_config(args) -> FallbackConfig:
    return FallbackConfig(enabled=bool(args.fallback), preset=getattr(args, "fallback_preset", None))
