#!/usr/bin/env bash
# The long versions of the reliability tests, then a table of their figures (the README's
# "Reliability" table comes from this). CI runs the same tests with small counts.
#
#   bash scripts/reliability.sh              # 200 kills, 60 s of load, 100 Stops, 200 fuzz cases per endpoint,
#                                            # and 30 minutes of four streams on the compiled tiny coder
#   KILLS=20 LOAD_S=10 STOPS=20 FUZZ=30 SOAK_S=120 bash scripts/reliability.sh   # a quicker pass
#   ONLY="fuzz load" FIGURES=runs/figures.jsonl bash scripts/reliability.sh
#       # some groups only, their figures appended to FIGURES (kept), and the table from all of it:
#       # the long groups can run on different days and still make one table
#
# Runs in the project's .venv with its test extras, as scripts/test.sh does (created or updated
# here when needed); the XSS part needs Chromium, which scripts/test.sh installs.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
ensure_venv test || exit 1  # its python3 first on PATH from here on

KILLS=${KILLS:-200}
LOAD_S=${LOAD_S:-60}
STOPS=${STOPS:-100}
SOAK_S=${SOAK_S:-1800}
SOAK_PAIR=${SOAK_PAIR:-embedded}  # the shipped tiny coder; 'tiny' is CI's random pair
FUZZ=${FUZZ:-200}
ONLY=${ONLY:-}
if [ -n "${FIGURES:-}" ]; then
    figures=$FIGURES
    touch "$figures"
else
    figures=$(mktemp /tmp/dflash-reliability-XXXXXX.jsonl)
fi
export GRADIO_ANALYTICS_ENABLED=False PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" DFLASH_FIGURES="$figures"
export DFLASH_KILLS=$KILLS DFLASH_LOAD_S=$LOAD_S DFLASH_STOPS=$STOPS DFLASH_FUZZ_EXAMPLES=$FUZZ
export DFLASH_SOAK_S=$SOAK_S DFLASH_SOAK_PAIR=$SOAK_PAIR

status=0
run() {  # run NAME pytest-args...: one group, its result remembered for the table
    local name=$1
    shift
    if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then
        return
    fi
    echo "== $name: python3 -m pytest $*"
    if python3 -m pytest -q -p no:warnings "$@"; then
        echo "{\"figure\": \"result\", \"group\": \"$name\", \"passed\": true}" >>"$figures"
    else
        echo "{\"figure\": \"result\", \"group\": \"$name\", \"passed\": false}" >>"$figures"
        status=1
    fi
}

run network tests/test_network.py
run models tests/test_model_files.py
run edges tests/test_new_user_edges.py
run fuzz tests/test_fuzz.py
run xss tests/e2e/test_xss.py tests/e2e/test_refusals.py
run kills tests/test_app_crash_load.py -k sigkill
run load tests/test_app_crash_load.py -k four_sessions
run stop tests/test_app_crash_load.py -k stop
run storage-kills tests/test_storage_crash.py
run soak tests/test_compiled_soak.py

python3 - "$figures" <<'EOF'
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8") if line.strip()]
fig = {r["figure"]: r for r in rows if r["figure"] != "result"}
results = {r["group"]: r["passed"] for r in rows if r["figure"] == "result"}


def line(what, figure, group):
    mark = {True: "pass", False: "FAIL", None: "not run"}[results.get(group)]
    print(f"| {what} | {figure} | {mark} |")


print()
print("| check | figure | result |")
print("|---|---|---|")
g = lambda name, key, default="?": fig.get(name, {}).get(key, default)  # noqa: E731
line("routes refusing a request without login (--auth)", f"{g('routes_without_login', 'requests')} requests, "
     f"{g('routes_without_login', 'leaked')} leaked, {g('routes_without_login', 'not_refused')} not refused", "network")
line("file-route traversal corpus", f"{g('traversal', 'requests')} requests ({g('traversal', 'variants')} variants), "
     f"{g('traversal', 'served_outside')} served outside the app", "network")
line("fuzz (hypothesis: Gradio endpoints, imports, /v1)", f"{g('fuzz', 'cases')} cases reached the server "
     f"({g('fuzz', 'endpoints')} endpoints, at least {g('fuzz', 'fewest_per_endpoint')} each; "
     f"{g('fuzz', 'not_sent')} more the client could not encode), {g('fuzz', 'server_errors')} server errors", "fuzz")
for figure, what in (("xss_typed", "typed and generated"), ("xss_imported", "imported")):
    line(f"XSS / exfiltration payloads in Chromium ({what})", f"{g(figure, 'payloads')} payloads, checked at "
         f"{g(figure, 'places')} places, {g(figure, 'scripts_ran')} scripts ran, {g(figure, 'dialogs')} dialogs, "
         f"{g(figure, 'foreign_requests')} foreign requests", "xss")
line("SIGKILL of the running app mid-reply", f"{g('sigkill', 'kills')} kills, integrity_check ok "
     f"{g('sigkill', 'integrity_ok')}/{g('sigkill', 'checks')}, {g('sigkill', 'acknowledged')} acknowledged, "
     f"{g('sigkill', 'lost')} lost", "kills")
line("4 sessions streaming at once", f"{g('load', 'seconds')} s, {g('load', 'replies')} replies, "
     f"{g('load', 'lost')} lost, {g('load', 'duplicated')} doubled, {g('load', 'locked_errors')} 'database is locked', "
     f"{g('load', 'other_errors')} other errors",
     "load")
line("Stop presses", f"{g('stop', 'presses')} presses, worst {g('stop', 'worst_latency_ms')} ms "
     f"(median {g('stop', 'median_latency_ms')} ms; cycle {g('stop', 'cycle_ms')} ms), "
     f"{g('stop', 'max_cycles_after_stop')} cycles after Stop; client round trip worst "
     f"{g('stop', 'worst_round_trip_ms')} ms", "stop")
line("compiled path: 2 page + 2 API streams at once", f"{g('soak', 'seconds')} s on {g('soak', 'pair')}, "
     f"{g('soak', 'page_replies')} page + {g('soak', 'api_replies')} API replies, {g('soak', 'lost')} lost, "
     f"{g('soak', 'recompiles')} recompiles after warm-up, resident memory {g('soak', 'rss_start_mb')} -> "
     f"{g('soak', 'rss_end_mb')} MB ({g('soak', 'rss_growth_pct')} %)", "soak")
line("model files (pickle, truncated, inconsistent, NaN, OOM)", "see tests/test_model_files.py", "models")
line("new-user edges (empty prompt, context window, delete, import, MiMo)", "see tests/test_new_user_edges.py", "edges")
EOF
[ -n "${FIGURES:-}" ] || rm -f "$figures"
exit $status
