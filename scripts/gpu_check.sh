#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py): a random-weight Qwen3-8B-shaped target and a b16 draft in
# bf16 on one GPU; verify and draft costs at B = 1, 2, 4, 8, 16, the share of greedy replies
# identical to plain decoding over 32 prompts, tokens/s. Prints one JSON line on stdout.
# Needs no network and no checkpoint; stops itself after 8 minutes.
#   bash scripts/gpu_check.sh           # on a GPU
#   bash scripts/gpu_check.sh --tiny    # tiny scale on the CPU, in seconds (what CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec timeout --signal=TERM --kill-after=10 480 python3 scripts/gpu_check.py "$@"
