#!/usr/bin/env bash
# A deeper default coder trained on one GPU, offline, and scored against the shipped one:
#
#   1. `train target` grows the shipped target to LAYERS decoder layers (the added ones start as
#      the identity, so it starts out answering exactly as the shipped one) and trains it on the
#      default coder's data (`--data coder`: the tasks in many wordings, follow-ups that edit the
#      previous function, stated edge cases and names, and edits of its own first replies), with
#      fp32 weights and bf16 autocast forwards, on tens of millions of tokens where the 2-core CPU
#      trains about 1,700 a second;
#   2. `train draft` distils its draft from the shipped draft, whose target layers are moved to
#      where the grown stack put them, on the new target's own replies (fp32, as the app decodes);
#   3. `train proposals` lets it propose from the 2,048 ids the new target wrote most;
#   4. `train eval --pass1` scores both pairs on every pass@1 set (strict / lenient, each request
#      alone and the follow-up chats), and `bench --json` gives the new pair's τ and speedup on
#      held-out prompts on the CPU, where the app runs it, with its greedy output checked
#      against plain decoding.
#
#   bash scripts/gpu_train_coder.sh            # one GPU: about 11 minutes (estimated: not yet run on one)
#   bash scripts/gpu_train_coder.sh --tiny     # every step at toy scale on the CPU (CI: about 3 minutes)
#
# Environment: OUT (default runs/gpu_coder; rerunning with the same OUT resumes), LAYERS (default
# 16), TARGET_MINUTES (default 3.5), DRAFT_MINUTES (default 3), REPLIES (draft replies, default
# 40000), OWN_REPLIES (default 3000), HELDOUT (default assets/prompts/unseen6.jsonl), DEVICE
# (default cuda). Nothing is copied into assets/: ship the pair by hand when compare.json says it
# answers more requests, keeps greedy output identical and drafts at least as far as the shipped one.
set -euo pipefail
cd "$(dirname "$0")/.."

TINY=0
[[ "${1:-}" == "--tiny" ]] && TINY=1
FROM_TARGET=assets/models/tiny-coder-requests/target
FROM_DRAFT=assets/models/tiny-coder-requests/draft
HELDOUT=${HELDOUT:-assets/prompts/unseen6.jsonl}
OUT=${OUT:-runs/gpu_coder}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # everything is local; never reach for the hub
DS=(python3 -m app.cli)
TARGET_DATA=(--data coder --name-weight 3 --chat-fraction 0.8)  # the shipped coder's data (scripts/train_coder.sh)

if [[ "$TINY" == 1 ]]; then
  DEVICE=${DEVICE:-cpu}
  LAYERS=${LAYERS:-13}
  TARGET=(--own-replies "${OWN_REPLIES:-4}" --batch-size 2 --seq-len 64 --max-steps 2 --eval-windows 2
          --samples 0 --threads 1 --no-progress)
  DRAFT=(--num-sequences "${REPLIES:-8}" --new-tokens 12 --gen-batch 8 --prompt-tokens 48 --batch-size 2
         --anchors 8 --eval-sequences 2 --max-steps 2 --threads 1 --no-progress)
  DRAFT_PROMPTS=()  # corpus prompts only (the coder mix alone is thousands of prompts)
  PROPOSAL_SIZE=256
  EVAL=(--pass1-sets requests --no-followups --threads 1)
  BENCH=(--limit 2 --max-new-tokens 24 --threads 1 --no-compile)
else
  DEVICE=${DEVICE:-cuda}
  LAYERS=${LAYERS:-16}
  TARGET=(--own-replies "${OWN_REPLIES:-3000}" --batch-size 64 --lr 5e-4 --max-minutes "${TARGET_MINUTES:-3.5}"
          --checkpoint-minutes 1 --samples 4)
  DRAFT=(--dtype float32 --num-sequences "${REPLIES:-40000}" --new-tokens 96 --gen-batch 2048
         --prompt-tokens 128 --batch-size 64 --anchors 64 --eval-sequences 256 --lr 4e-4
         --max-minutes "${DRAFT_MINUTES:-3}" --gen-fraction 0.5 --cache-features-gb 0 --checkpoint-minutes 1)
  DRAFT_PROMPTS=(--prompts coder)
  PROPOSAL_SIZE=2048
  EVAL=()
  BENCH=(--max-new-tokens 96 --no-compile)  # eager paths: a cold compile on a fresh machine takes minutes
fi

mkdir -p "$OUT"
start=$(date +%s)
echo "== 1. grow $FROM_TARGET to $LAYERS layers and train it on the coder data ($DEVICE) -> $OUT/target"
"${DS[@]}" train target --init "$FROM_TARGET" --layers "$LAYERS" "${TARGET_DATA[@]}" --device "$DEVICE" \
  --seed 131 --out "$OUT/target" --work "$OUT/target_work" "${TARGET[@]}"
echo "train target took $(( $(date +%s) - start )) s"

echo "== 2. its draft, from $FROM_DRAFT with its target layers moved to the grown stack -> $OUT/draft"
python3 - "$FROM_DRAFT" "$OUT/draft_init" "$FROM_TARGET" "$LAYERS" <<'PY'
import json
import shutil
import sys
from pathlib import Path

from training.target import grown_layer_ids

shipped, init, target, layers = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
if not (init / "config.json").exists():
    shutil.copytree(shipped, init, dirs_exist_ok=True)
    config = json.loads((shipped / "config.json").read_text())
    depth = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    ids = config["dflash_config"]["target_layer_ids"]
    config["dflash_config"]["target_layer_ids"] = grown_layer_ids(ids, depth, layers)
    (init / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"target layers {ids} -> {config['dflash_config']['target_layer_ids']}")
PY
"${DS[@]}" train draft --target "$OUT/target" --init "$OUT/draft_init" "${DRAFT_PROMPTS[@]}" --chat-fraction 0.5 \
  --device "$DEVICE" --seed 132 --out "$OUT/draft" --work "$OUT/draft_work" "${DRAFT[@]}"

echo "== 3. propose from the $PROPOSAL_SIZE ids the new target wrote most"
"${DS[@]}" train proposals --target "$OUT/target" --draft "$OUT/draft" --size "$PROPOSAL_SIZE" \
  --pool "$OUT/draft_work/train_sequences.pt" --no-progress
trained=$(date +%s)
echo "training took $((trained - start)) s"

echo "== 4. pass@1 of both pairs, and the new pair's speed on $HELDOUT (CPU, greedy, fixed blocks)"
for which in new shipped; do
  pair=$([[ $which == new ]] && echo "$OUT" || echo "${FROM_TARGET%/target}")
  "${DS[@]}" train eval --pass1 --target "$pair/target" --draft "$pair/draft" "${EVAL[@]}" --json \
    2> "$OUT/pass1_$which.log" > "$OUT/pass1_$which.json" \
    || { echo "pass@1 of the $which pair failed:"; tail -n 5 "$OUT/pass1_$which.log"; exit 1; }
done
"${DS[@]}" bench --target "$OUT/target" --draft "$OUT/draft" --prompts "$HELDOUT" --no-fallback --device cpu \
  "${BENCH[@]}" --json 2> "$OUT/bench_new.log" | tail -n 1 > "$OUT/bench_new.json" \
  || { echo "bench of the new pair failed:"; tail -n 5 "$OUT/bench_new.log"; exit 1; }
python3 - "$OUT" <<'PY'
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])


def scores(which: str) -> dict:
    """Per set: strict / lenient passes of each request alone, and of whole follow-up chats."""
    rows = json.loads((out / f"pass1_{which}.json").read_text())
    return {row["set"]: {"alone": [row["alone"]["strict"], row["alone"]["lenient"], row["alone"]["n"]],
                         "chats": [row["whole_chats"]["strict"], row["whole_chats"]["lenient"], row["whole_chats"]["n"]]}
            for row in rows}


new, shipped = scores("new"), scores("shipped")
bench = json.loads((out / "bench_new.json").read_text())
for name in new:
    for kind in ("alone", "chats"):
        (s, l, n), (s0, l0, _) = new[name][kind], shipped[name][kind]
        if n:
            print(f"{name:12} {kind:6} strict {s}/{n} (shipped {s0}), lenient {l}/{n} (shipped {l0})")
tau, identical = bench["dflash"]["mean_acceptance_length"], bench["identical"] == bench["prompts"]
print(f"new pair on the CPU: mean tau {tau:.2f}, speedup {bench['speedup']:.2f}x, "
      f"identical {bench['identical']}/{bench['prompts']}")
strict = sum(v["alone"][0] + v["chats"][0] for v in new.values())
strict_shipped = sum(v["alone"][0] + v["chats"][0] for v in shipped.values())
verdict = {"strict_passes": strict, "strict_passes_shipped": strict_shipped, "identical": identical,
           "answers_more": strict > strict_shipped, "tau": tau, "speedup": bench["speedup"],
           "new": new, "shipped": shipped}
(out / "compare.json").write_text(json.dumps(verdict, indent=2) + "\n")
if not identical:
    print("the new pair's greedy output differs from plain decoding: do not ship it")
print(f"strict passes, every set: {strict} against the shipped pair's {strict_shipped}: "
      + ("the new target answers more" if strict > strict_shipped else "the new target does not answer more"))
PY
echo "done in $(( $(date +%s) - start )) s"
