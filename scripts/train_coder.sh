#!/usr/bin/env bash
# The next default coder, trained on from the shipped one (assets/models/tiny-coder-requests) with
# `--data coder` (docs/training.md): the tasks in many wordings, follow-ups that edit the previous
# function, stated edge cases and names. Then its draft, distilled on the new target's own replies,
# the ids it proposes from, and pass@1 and speed on held-out prompts. Every step resumes from its
# --work checkpoint, so rerun this script after an interruption; run it in the background:
#   nohup bash scripts/train_coder.sh > runs/coder.log 2>&1 &
# Budgets are wall-clock (override with A_MIN, B_MIN, D_MIN): on a busy machine the same flags train
# fewer tokens. Nothing is copied into assets/: ship the pair by hand when its figures beat the
# shipped one's (the model card says how they were measured).
set -euo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-runs/coder}
DRAFT_FLAGS="--layers 2 --block-size 8 --batch-size 4 --anchors 64 --prompt-tokens 128 --gen-batch 64 --eval-sequences 48 --threads 2"

# stage A: from the shipped target, 45 minutes
dflash-studio train target --init assets/models/tiny-coder-requests/target --data coder --name-weight 3 --lr 5e-4 \
    --chat-fraction 0.8 --batch-size 8 --threads 2 --max-minutes "${A_MIN:-45}" --checkpoint-minutes 6 --seed 41 \
    --samples 4 --out "$R/stageA/model" --work "$R/stageA/work"
# stage B: the same data drawn again with a new seed (a fresh warmup and cosine decay)
dflash-studio train target --init "$R/stageA/model" --data coder --name-weight 3 --lr 5e-4 \
    --chat-fraction 0.8 --batch-size 8 --threads 2 --max-minutes "${B_MIN:-30}" --checkpoint-minutes 6 --seed 42 \
    --samples 4 --out "$R/stageB/model" --work "$R/stageB/work"
# its draft: from the shipped draft, on the new target's replies to the coder prompts and wide ones
dflash-studio train draft --init assets/models/tiny-coder-requests/draft --target "$R/stageB/model" $DRAFT_FLAGS \
    --prompts coder --chat-fraction 0.5 --lr 5e-4 --num-sequences 3000 --new-tokens 96 --gen-fraction 0.3 \
    --max-minutes "${D_MIN:-32}" --cache-features-gb 8 --checkpoint-minutes 8 --seed 43 \
    --out "$R/draft1/model" --work "$R/draft1/work"
# the 2,048 ids the new target writes most (the fine-tune moved them)
dflash-studio train proposals --target "$R/stageB/model" --draft "$R/draft1/model" --prompts coder \
    --num-sequences 600 --seed 77 --threads 2 --work "$R/proposals"
# the figures: pass@1 on the three sets (strict first), then speed on held-out prompts
dflash-studio train eval --pass1 --target "$R/stageB/model" --draft "$R/draft1/model" --out "$R/pass1.json"
dflash-studio bench --target "$R/stageB/model" --draft "$R/draft1/model" --prompts assets/prompts/unseen6.jsonl --no-fallback
