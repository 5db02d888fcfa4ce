#!/usr/bin/env bash
# A larger draft for the answering pair, distilled on one GPU in about ten minutes, offline:
#
#   1. `train draft` regenerates at least 200,000 greedy replies of the answering target
#      (batched generation on the GPU, in fp32 as the CPU app decodes) from the request target's
#      own kind of prompts and standard-library code, and distils a 4-layer draft on them,
#      starting from the shipped 2-layer draft (its new layers start as the identity, so training
#      begins from the shipped draft's proposals);
#   2. `train proposals` lets it propose from the 2,048 ids the target wrote most in those replies
#      (as the shipped draft does: on a CPU the head is a large share of a draft pass);
#   3. `bench --json` runs both drafts on held-out prompts on the CPU, where the app runs them,
#      and says whether the new one beats the shipped one with identical greedy output.
#
#   bash scripts/gpu_train_draft.sh            # one GPU: about 10 minutes, then the comparison
#   bash scripts/gpu_train_draft.sh --tiny     # every step at toy scale on the CPU (CI: seconds)
#
# Environment: OUT (default runs/gpu_draft; rerunning with the same OUT resumes), TARGET,
# SHIPPED_DRAFT, HELDOUT (a prompt file never trained on), REPLIES (default 200000),
# MINUTES (the `train draft` budget, default 9.5), LAYERS (default 4), DEVICE (default cuda).
# Nothing is copied into assets/: ship the new draft by hand when the comparison says it wins.
set -euo pipefail
cd "$(dirname "$0")/.."

TINY=${GPU_DRAFT_TINY:-0}
[[ "${1:-}" == "--tiny" ]] && TINY=1
TARGET=${TARGET:-assets/models/tiny-coder-requests/target}
SHIPPED=${SHIPPED_DRAFT:-assets/models/tiny-coder-requests/draft}
HELDOUT=${HELDOUT:-assets/prompts/unseen6.jsonl}
OUT=${OUT:-runs/gpu_draft}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # everything is local; never reach for the hub
DS=(python3 -m app.cli)

if [[ "$TINY" == 1 ]]; then
  REPLIES=${REPLIES:-24}
  TRAIN=(--device "${DEVICE:-cpu}" --layers "${LAYERS:-3}" --num-sequences "$REPLIES" --new-tokens 16
         --gen-batch 12 --prompt-tokens 48 --batch-size 4 --anchors 8 --eval-sequences 4 --max-steps 3
         --threads 1 --no-progress)  # one thread: two spin and collapse on a busy machine
  PROMPTS=()  # corpus prompts only (the request mix alone is about 1,900 prompts)
  PROPOSAL_SIZE=256
  BENCH=(--limit 2 --max-new-tokens 24 --threads 1)
else
  REPLIES=${REPLIES:-200000}
  # generation first (half the budget), then training; features are computed online (200,000
  # sequences of them would not fit in RAM) by the frozen target, which is cheap on a GPU
  TRAIN=(--device "${DEVICE:-cuda}" --dtype float32 --layers "${LAYERS:-4}" --num-sequences "$REPLIES"
         --new-tokens 96 --gen-batch 4096 --prompt-tokens 128 --batch-size 64 --anchors 64
         --eval-sequences 256 --lr 4e-4 --max-minutes "${MINUTES:-9.5}" --gen-fraction 0.5
         --cache-features-gb 0 --checkpoint-minutes 3)
  PROMPTS=(--prompts requests)  # about 1,900 prompts of the request target's own kind, then corpus ones
  PROPOSAL_SIZE=2048
  BENCH=(--max-new-tokens 160)
fi

mkdir -p "$OUT"
start=$(date +%s)
echo "== 1. regenerate $REPLIES replies of $TARGET and distil a draft from $SHIPPED -> $OUT/draft"
"${DS[@]}" train draft --target "$TARGET" --init "$SHIPPED" "${PROMPTS[@]}" --chat-fraction 0.5 \
  --out "$OUT/draft" --work "$OUT/work" --seed 40 "${TRAIN[@]}"
trained=$(date +%s)
made=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["train_sequences"])' "$OUT/draft/training_meta.json")
echo "regenerated $made replies; train draft took $((trained - start)) s"

echo "== 2. propose from the $PROPOSAL_SIZE ids the target wrote most in them"
"${DS[@]}" train proposals --target "$TARGET" --draft "$OUT/draft" --size "$PROPOSAL_SIZE" \
  --pool "$OUT/work/train_sequences.pt" --no-progress

echo "== 3. both drafts on $HELDOUT (CPU, greedy, fixed blocks)"
for which in new shipped; do
  draft=$([[ $which == new ]] && echo "$OUT/draft" || echo "$SHIPPED")
  "${DS[@]}" bench --target "$TARGET" --draft "$draft" --prompts "$HELDOUT" --no-fallback --device cpu \
    "${BENCH[@]}" --json 2> "$OUT/bench_$which.log" | tail -n 1 > "$OUT/bench_$which.json" \
    || { echo "bench of the $which draft failed:"; tail -n 5 "$OUT/bench_$which.log"; exit 1; }
done
python3 - "$OUT" "$made" "$REPLIES" <<'PY'
import json
import sys
from pathlib import Path

out, made, asked = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
runs = {which: json.loads((out / f"bench_{which}.json").read_text()) for which in ("new", "shipped")}
for which, r in runs.items():
    print(f"{which:8} draft: mean tau {r['dflash']['mean_acceptance_length']:.2f}, speedup {r['speedup']:.2f}x, "
          f"identical {r['identical']}/{r['prompts']}")
new, old = runs["new"], runs["shipped"]
identical = new["identical"] == new["prompts"]
beats = (identical and new["dflash"]["mean_acceptance_length"] > old["dflash"]["mean_acceptance_length"]
         and new["speedup"] > old["speedup"])
verdict = {"replies": made, "replies_asked": asked, "identical": identical, "beats_shipped": beats,
           "new": {k: new[k] for k in ("speedup", "identical", "prompts")} | {"tau": new["dflash"]["mean_acceptance_length"]},
           "shipped": {k: old[k] for k in ("speedup", "identical", "prompts")} | {"tau": old["dflash"]["mean_acceptance_length"]}}
(out / "compare.json").write_text(json.dumps(verdict, indent=2) + "\n")
if not identical:
    print("the new draft's greedy output differs from plain decoding: do not ship it")
print("the new draft beats the shipped one (higher tau and speedup, identical greedy output)" if beats
      else "the new draft does not beat the shipped one")
if made < asked:
    print(f"only {made} of the {asked} replies were regenerated before generation's share of the budget ran out")
    sys.exit(3)
PY
echo "done in $(( $(date +%s) - start )) s"
