#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py): a random-weight Qwen3-8B-shaped target and a b16 draft in
# bf16 on one GPU; verify and draft costs at B = 1, 2, 4, 8, 16, the share of greedy replies
# identical to plain decoding over 32 prompts, tokens/s. Prints one JSON line on stdout.
# Needs no network and no checkpoint; stops itself after 9 minutes.
#   bash scripts/gpu_check.sh           # on a GPU
#   bash scripts/gpu_check.sh --tiny    # tiny scale on the CPU (what CI runs)
# Then the same replies on the compiled path (static caches, torch.compile; CUDA graphs on a GPU)
# against the eager one: tokens/s of both, compile time, recompiles (--no-compile skips it).
# Runs in the project's .venv (scripts/venv.sh creates or updates it), or in the interpreter
# PYTHON names.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    . scripts/venv.sh
    ensure_venv || exit 1
    PYTHON="$VENV/bin/python"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec timeout --signal=TERM --kill-after=10 540 "$PYTHON" scripts/gpu_check.py "$@"
