"""The GPU check: a random-weight target shaped like Qwen3-8B and a draft shaped like z-lab's
Qwen3-8B-DFlash-b16 (5 layers, block 16), built on the device in bf16 — no download, no network.
It measures what a verify over B tokens and a draft pass for a block of B cost (B = 1, 2, 4, 8,
16), decodes the same prompts greedily with plain decoding and with DFlash, and prints one JSON
line: the costs, the share of replies identical to plain decoding, and tokens/s of both. Then
the compiled path (engine/compiled.py: static caches and torch.compile, CUDA graphs on a GPU)
decodes the same prompts: its tokens/s beside the eager path's, its compile time, the share of
its replies identical to the eager path's, and the graphs it compiled again (0 expected).

    bash scripts/gpu_check.sh                 # on a GPU: at most 8 minutes
    bash scripts/gpu_check.sh --tiny          # the same check at tiny scale on the CPU (CI)

What the figures mean with random weights: the costs are those of the real shapes (what a cycle
costs in plain steps decides when speculation pays); a random draft's guesses are almost never
accepted, so DFlash's tokens/s here is its floor (one token per cycle), not its speed with a
trained draft. In bf16 a verify block and a single step can round a near-tie differently, so
the identical share is measured, not assumed (in fp32 it must be 1.0).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from anywhere

import torch  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """The target's and the draft's dimensions (the draft's as z-lab's b16 drafts have them)."""

    name: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    draft_layers: int
    draft_layer_ids: tuple[int, ...]
    block_size: int = 16


QWEN3_8B = Shape("Qwen3-8B + DFlash b16", vocab=151936, hidden=4096, intermediate=12288, layers=36, heads=32,
                 kv_heads=8, head_dim=128, draft_layers=5, draft_layer_ids=(1, 9, 17, 25, 33))
TINY = Shape("tiny (Qwen3-8B's proportions)", vocab=512, hidden=64, intermediate=192, layers=6, heads=4,
             kv_heads=2, head_dim=16, draft_layers=2, draft_layer_ids=(1, 4))
SIZES = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class CheckConfig:
    shape: Shape
    device: str
    dtype: str
    prompts: int = 32
    prompt_tokens: int = 64
    max_new_tokens: int = 64
    context: int = 512  # tokens of context for the cost measurement
    repeats: int = 20
    budget_s: float = 420.0  # stop decoding prompts past this, so the whole check stays under 8 minutes
    seed: int = 0
    compile: bool = True  # then the compiled path on the same prompts


def parse_args(argv=None) -> CheckConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny scale on the CPU in fp32 (seconds; what CI runs)")
    parser.add_argument("--device", help="default: cuda (cpu with --tiny)")
    parser.add_argument("--dtype", help="default: bfloat16 (float32 with --tiny)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop starting new prompts after this many seconds of decoding (default: 420, "
                             "200 with the compiled path, which decodes them again)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="also decode the prompts on the compiled path (default: on)")
    args = parser.parse_args(argv)
    budget = args.budget_s if args.budget_s is not None else (200.0 if args.compile else 420.0)
    if args.tiny:
        return CheckConfig(TINY, args.device or "cpu", args.dtype or "float32", prompts=args.prompts,
                           prompt_tokens=16, max_new_tokens=args.max_new_tokens or 24, context=32, repeats=5,
                           budget_s=budget, compile=args.compile)
    if args.device is None and not torch.cuda.is_available():
        parser.error("no CUDA device here: run on a GPU, or pass --tiny (or --device cpu for the full shape)")
    return CheckConfig(QWEN3_8B, args.device or "cuda", args.dtype or "bfloat16", prompts=args.prompts,
                       max_new_tokens=args.max_new_tokens or 64, budget_s=budget, compile=args.compile)


def build_models(config: CheckConfig):
    """Random-weight target and draft, created on the device in the check's dtype."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from engine.draft import DFlashDraftModel, new_draft_config
    from engine.loading import LoadedModels

    shape, device, dtype = config.shape, torch.device(config.device), getattr(torch, config.dtype)
    torch.manual_seed(config.seed)
    target_config = Qwen3Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, max_position_embeddings=40960, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    with torch.device(device):
        target = AutoModelForCausalLM.from_config(target_config, dtype=dtype).eval()
        with torch.no_grad():
            # a trained model's next-token distribution is peaked; random init gives near-ties everywhere
            target.lm_head.weight.mul_(8.0)
        draft_config = new_draft_config(target_config, shape.draft_layers, shape.block_size, shape.vocab - 1,
                                        target_layer_ids=list(shape.draft_layer_ids))
        draft = DFlashDraftModel(draft_config).to(dtype).eval()
    from engine.draft import place_draft

    draft = place_draft(draft, device, dtype)
    return LoadedModels(target, None, draft, device, dtype, shape.name, [], 40960)


def random_prompts(config: CheckConfig) -> list[list[int]]:
    generator = torch.Generator().manual_seed(config.seed + 1)
    high = config.shape.vocab - 1  # the last id is the draft's mask token
    return [torch.randint(0, high, (config.prompt_tokens,), generator=generator).tolist()
            for _ in range(config.prompts)]


def run_check(config: CheckConfig) -> dict:
    from engine.bench import forward_costs, run_dflash
    from engine.config import SamplingConfig
    from engine.loading import pick_threads
    from engine.runtime import LocalEngine

    started = time.perf_counter()
    models = build_models(config)
    built_s = time.perf_counter() - started
    threads = pick_threads(None, models.device, sum(p.numel() for p in models.target.parameters()))
    if threads:  # a small model on a shared CPU: one thread (see engine.loading.pick_threads)
        torch.set_num_threads(threads)
    engine = LocalEngine(models)
    costs = forward_costs(engine, context=config.context, sizes=SIZES, repeats=config.repeats)
    greedy = SamplingConfig(max_new_tokens=config.max_new_tokens, temperature=0.0)
    plain = SamplingConfig(max_new_tokens=config.max_new_tokens, temperature=0.0, block_size=1)
    prompts = random_prompts(config)
    run_dflash(engine, prompts[0], plain, None)  # warm-up: kernels, allocator
    run_dflash(engine, prompts[0], greedy, None)
    eager = decode_prompts(engine, prompts, plain, greedy, config.budget_s)
    done, identical = eager["prompts"], eager["identical"]
    compiled = compiled_check(models, engine, prompts[:done], plain, greedy, eager) if config.compile else None
    return {
        "check": "gpu_check", "shape": config.shape.name, "weights": "random", "device": str(models.device),
        "device_name": torch.cuda.get_device_name(models.device) if models.device.type == "cuda" else "cpu",
        "dtype": config.dtype, "torch": torch.__version__,
        "target_parameters": sum(p.numel() for p in models.target.parameters()),
        "draft_parameters": sum(p.numel() for p in models.draft.parameters()),
        "block_size": config.shape.block_size, "context": costs["context"],
        "verify_ms": {str(b): costs["verify_ms"][b] for b in SIZES},
        "draft_ms": {str(b): costs["draft_ms"][b] for b in SIZES if b in costs["draft_ms"]},
        "cycle_in_plain_steps": {str(b): costs["cycle_in_plain_steps"][b] for b in SIZES},
        "prompts": done, "prompts_asked": config.prompts, "max_new_tokens": config.max_new_tokens,
        "identical": identical, "identical_share": round(identical / done, 4) if done else 0.0,
        "plain_tokens_per_s": eager["plain_tokens_per_s"], "dflash_tokens_per_s": eager["dflash_tokens_per_s"],
        "mean_acceptance_length": eager["mean_acceptance_length"], "compiled": compiled,
        "peak_memory_gb": round(torch.cuda.max_memory_allocated(models.device) / 1e9, 2)
        if models.device.type == "cuda" else None,
        "build_s": round(built_s, 2), "seconds": round(time.perf_counter() - started, 2),
    }


def decode_prompts(engine, prompts, plain, greedy, budget_s: float) -> dict:
    """Plain and DFlash replies for each prompt (within the time budget), on the engine's path."""
    from engine.bench import run_dflash

    identical, taus, replies = 0, [], []
    plain_tokens = plain_s = dflash_tokens = dflash_s = 0.0
    started = time.perf_counter()
    for ids in prompts:
        if time.perf_counter() - started > budget_s:
            break
        reference, _ = run_dflash(engine, ids, plain, None)
        drafted, _ = run_dflash(engine, ids, greedy, None)
        identical += list(reference.token_ids) == list(drafted.token_ids)
        replies.append((list(reference.token_ids), list(drafted.token_ids)))
        plain_tokens, plain_s = plain_tokens + reference.new_tokens, plain_s + reference.total_ms / 1000
        dflash_tokens, dflash_s = dflash_tokens + drafted.new_tokens, dflash_s + drafted.total_ms / 1000
        taus.extend(drafted.acceptance_lengths)
    return {"prompts": len(replies), "identical": identical, "replies": replies,
            "plain_tokens_per_s": round(plain_tokens / plain_s, 3) if plain_s else 0.0,
            "dflash_tokens_per_s": round(dflash_tokens / dflash_s, 3) if dflash_s else 0.0,
            "mean_acceptance_length": round(sum(taus) / len(taus), 4) if taus else 0.0}


def compiled_check(models, eager_engine, prompts, plain, greedy, eager: dict) -> dict:
    """The same prompts on the compiled path: compile time (waited for here, before timing),
    tokens/s against the eager path's, replies identical to the eager ones, recompiles."""
    from engine.bench import run_dflash
    from engine.runtime import LocalEngine

    started = time.perf_counter()
    engine = LocalEngine(models, compile=True)
    path = engine.compiled
    length = len(prompts[0]) + plain.max_new_tokens
    path.queue({(kind, path.backend.bucket(length), width) for kind, width in path.widths(engine.block_size)})
    ready = path.wait(timeout=300)
    compile_s = time.perf_counter() - started
    if not ready:
        engine.close()
        path.join(timeout=60)
        return {"ready": False, "state": path.state, "error": path.error, "compile_s": round(compile_s, 2)}
    run_dflash(engine, prompts[0], plain, None)  # warm-up, as for the eager path
    run_dflash(engine, prompts[0], greedy, None)
    before = path.recompiles
    result = decode_prompts(engine, prompts, plain, greedy, budget_s=float("inf"))
    same = sum(mine == theirs for mine, theirs in zip(result.pop("replies"), eager["replies"]))
    engine.close()
    path.join(timeout=60)
    return {
        "ready": True, "mode": path.mode or "default", "compile_s": round(compile_s, 2),
        "graphs": path.report.graphs, "passes": len(path.report.seconds),
        "recompiles_after_warm_up": path.recompiles - before,
        "prompts": result["prompts"], "identical_to_eager": same, "identical": result["identical"],
        "plain_tokens_per_s": result["plain_tokens_per_s"], "dflash_tokens_per_s": result["dflash_tokens_per_s"],
        "dflash_over_eager": round(result["dflash_tokens_per_s"] / eager["dflash_tokens_per_s"], 3)
        if eager["dflash_tokens_per_s"] else 0.0,
        "plain_over_eager": round(result["plain_tokens_per_s"] / eager["plain_tokens_per_s"], 3)
        if eager["plain_tokens_per_s"] else 0.0,
        "peak_memory_gb": round(torch.cuda.max_memory_allocated(models.device) / 1e9, 2)
        if models.device.type == "cuda" else None,
    }


def main(argv=None) -> int:
    config = parse_args(argv)
    torch.set_grad_enabled(False)
    print(json.dumps(run_check(config)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
