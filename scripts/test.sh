#!/usr/bin/env bash
# Sets up and runs the whole test suite on a fresh machine (Debian, Python 3.11):
#   Debian's chromium for the Playwright end-to-end tests (Playwright cannot download its own
#   browser here), the project with its test extras in the virtual environment .venv that
#   scripts/start.sh uses too (scripts/venv.sh: created once, reused; torch==2.13.0 takes the
#   CPU wheel), then pytest inside it. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null 2>&1 && [ -x /usr/bin/apt-get ] && [ "$(id -u)" = 0 ]; then
    echo "== installing Debian's chromium for the end-to-end tests"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

. scripts/venv.sh
ensure_venv test  # a system pip refuses installs on Debian 12 / Ubuntu 24.04 (PEP 668)

echo "== vLLM's own environment for the --engine vllm tests (minutes the first time, seconds after)"
vllm_log="$(mktemp)"
if bash scripts/install_vllm.sh > "$vllm_log" 2>&1; then
    tail -n 2 "$vllm_log"
else
    tail -n 40 "$vllm_log" >&2
    if "$VENV/bin/python" -m tests.needs; then  # the tests' own answer to "in CI" (CI=1, true or yes)
        echo "scripts/install_vllm.sh failed: CI runs the vLLM tests for real" >&2
        exit 1
    fi
    echo "(vLLM is not installed: its tests will be skipped)" >&2
fi

export GRADIO_ANALYTICS_ENABLED=False
echo "== running the tests"
set +e
"$VENV/bin/python" -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$status"
