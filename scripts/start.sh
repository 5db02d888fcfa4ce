#!/usr/bin/env bash
# Starts DFlash Studio from a clone, on a fresh Debian or Ubuntu machine as on any other:
#   bash scripts/start.sh [dflash-studio options]      e.g. --port 7861, or: sessions list
# The first run creates the virtual environment .venv (`python3 -m venv`) and installs the
# project into it (`pip install -e .[train,bench,vllm]`: torch==2.13.0 takes the CPU wheel; the
# extras are what `train`, `bench --prompts humaneval` and `--engine vllm` add, a few small
# packages); later runs reuse it and start in seconds. Without options it runs `dflash-studio serve`: the page and the
# OpenAI-compatible API on http://127.0.0.1:7860 (the port it prints).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
. "$ROOT/scripts/venv.sh"
ensure_venv train,bench,vllm  # every command it passes arguments on to works
exec "$VENV/bin/dflash-studio" "$@"
