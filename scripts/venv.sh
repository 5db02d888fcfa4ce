# Sourced by scripts/start.sh and scripts/test.sh: the project's own virtual environment, .venv.
#
#   ensure_venv [EXTRAS]   creates .venv with `python3 -m venv` when it is missing, and runs
#                          `pip install -e .[EXTRAS]` inside it when pyproject.toml or the extras
#                          changed since the last install (a second start takes a second).
#
# Why a venv: Debian 12 and Ubuntu 24.04 refuse `pip install` into the system Python (PEP 668,
# "externally-managed-environment"). Debian ships `python3 -m venv` in a package of its own,
# python3-venv: as root it is installed here, otherwise the one command that installs it is printed.
# DFLASH_STUDIO_VENV=DIR puts the environment elsewhere.

ROOT="${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
VENV="${DFLASH_STUDIO_VENV:-$ROOT/.venv}"

_venv_create() {
    local log
    log="$(mktemp)"
    if python3 -m venv "$VENV" >"$log" 2>&1; then
        rm -f "$log"
        return 0
    fi
    rm -rf "$VENV"
    if grep -q "ensurepip" "$log" && [ -x /usr/bin/apt-get ] && [ "$(id -u)" = 0 ]; then
        echo "== installing Debian's python3-venv (python3 -m venv needs it)"
        apt-get update -qq
        local minor
        minor="$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv "python${minor}-venv" >/dev/null
        python3 -m venv "$VENV" && { rm -f "$log"; return 0; }
    fi
    cat "$log" >&2
    rm -f "$log"
    echo "Cannot create the virtual environment $VENV. On Debian or Ubuntu: sudo apt install python3-venv" >&2
    return 1
}

# The extras that an install with EXTRAS brought: [test] includes [train], [bench] and [vllm].
_extras_of() {
    local list="${1//,/ }"
    case " $list " in *" test "*) list="$list train bench vllm" ;; esac
    echo "$list"
}

# Whether STAMP records an install of pyproject.toml VERSION whose extras cover WANTED.
_installed_with() {
    local stamp="$1" version="$2" wanted="$3" line have extra covered
    [ -f "$stamp" ] || return 1
    while read -r line; do
        [ "${line%% *}" = "$version" ] || continue
        have=" $(_extras_of "${line#"$version"}") "
        covered=1
        for extra in $(_extras_of "$wanted"); do
            case "$have" in *" $extra "*) ;; *) covered=0 ;; esac
        done
        [ "$covered" = 1 ] && return 0
    done <"$stamp"
    return 1
}

ensure_venv() {
    local extras="${1:-}" stamp version
    if [ ! -x "$VENV/bin/python" ]; then
        echo "== creating the virtual environment $VENV"
        _venv_create || return 1
    fi
    # installed for this pyproject.toml with these extras, or more (the plain app needs none)
    stamp="$VENV/.dflash-studio-installed"
    version="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
    if ! _installed_with "$stamp" "$version" "$extras"; then
        echo "== installing dflash-studio${extras:+ with its $extras extras} into $VENV (pip install -e)"
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT${extras:+[$extras]}" || return 1
        echo "$version ${extras:-}" >>"$stamp"
    fi
    export PATH="$VENV/bin:$PATH"
}
