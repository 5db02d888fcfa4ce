#!/usr/bin/env bash
# Rebuild both shipped pairs from scratch on a CPU, ending with the default one:
#   tiny-coder-fast (assets/models/tiny-coder): the speed demo, high acceptance, does not answer
#     requests; about 11 hours on 2 cores;
#   tiny-coder (assets/models/tiny-coder-requests): the default, answers simple requests; built
#     from the first pair's target and draft, about 17 hours more (6.5 for a request pair, then
#     about 10.5 in scripts/train_coder.sh).
# (The folders keep the names they were built under; engine/shipped.py names the pairs.) Every
# step resumes from its --work checkpoint, so rerun this script after an interruption. Run it in
# the background:
#   nohup bash scripts/rebuild_tiny_coder.sh > runs/rebuild.log 2>&1 &
# The budgets are wall-clock: on a busy machine the same flags train fewer tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
DRAFT_FLAGS="--layers 2 --block-size 8 --batch-size 4 --anchors 64 --prompt-tokens 128 --gen-batch 64 --eval-sequences 48 --threads 2"

# copy a draft run's regenerated sequences into a new work dir, once (a rerun must not reset a grown pool)
seed_pool() { mkdir -p "$2"; [ -f "$2/train_sequences.pt" ] || cp "$1"/{train,eval}_sequences.pt "$2"/; }

dflash-studio train tokenizer --out runs/tokenizer
# the base target: 12 x 256 Qwen3 on standard-library source + request->code chat pairs
dflash-studio train target --tokenizer runs/tokenizer --out runs/target/model --work runs/target/work \
    --max-minutes 88 --batch-size 8 --lr 1.5e-3 --threads 2 --checkpoint-minutes 8 --seed 0
# draft stage 1: self-distillation from scratch
dflash-studio train draft --target runs/target/model --out runs/draft/model --work runs/draft/work $DRAFT_FLAGS \
    --lr 1e-3 --num-sequences 4000 --new-tokens 160 --gen-fraction 0.3 --max-minutes 36 --checkpoint-minutes 6 --seed 0
# draft stage 2: keep stage 1's sequences (and its held-out ones), regenerate more, fine-tune an hour
seed_pool runs/draft/work runs/draft2/work
dflash-studio train draft --target runs/target/model --out runs/draft2/model --work runs/draft2/work $DRAFT_FLAGS \
    --init runs/draft/model --lr 6e-4 --num-sequences 9000 --new-tokens 128 --gen-fraction 0.3 \
    --max-minutes 90 --cache-features-gb 12 --checkpoint-minutes 8 --seed 3
# the anti-loop fine-tune of the target: unlikelihood on stage 2's looping text, layers 10-11 only
dflash-studio train target --init runs/target/model --unlikelihood runs/draft2/work \
    --out runs/target_ul/model --work runs/target_ul/work --train-from-layer 10 --max-steps 100 \
    --batch-size 8 --lr 5e-4 --unlikelihood-weight 1.0 --threads 2 --samples 0 --seed 7
# draft stage 3: the stage 2 draft on the new target, stage 2's sequences as contexts plus new ones
seed_pool runs/draft2/work runs/draft3/work
dflash-studio train draft --target runs/target_ul/model --out runs/draft3/model --work runs/draft3/work $DRAFT_FLAGS \
    --init runs/draft2/model --lr 5e-4 --num-sequences 7900 --new-tokens 128 --gen-fraction 0.1 \
    --max-minutes 48 --cache-features-gb 14 --checkpoint-minutes 6 --seed 8
# draft stage 4: only the new target's own text (a fresh --work), 70 minutes of training
dflash-studio train draft --target runs/target_ul/model --out runs/draft4/model --work runs/draft4/work $DRAFT_FLAGS \
    --init runs/draft3/model --lr 4e-4 --num-sequences 6400 --new-tokens 128 --gen-fraction 0.3 \
    --max-minutes 92 --cache-features-gb 14 --checkpoint-minutes 8 --seed 9
# draft stage 6: prompts stage 4 never had (requests, and requests / def prefixes from 20 other packages)
dflash-studio train draft --target runs/target_ul/model --out runs/draft6/model --work runs/draft6/work $DRAFT_FLAGS \
    --init runs/draft4/model --prompts requests-wide --chat-fraction 0.3 --lr 3e-4 --num-sequences 3000 \
    --new-tokens 96 --gen-fraction 0.25 --max-minutes 80 --cache-features-gb 10 --checkpoint-minutes 10 --seed 31
# draft stage 8 (shipped): code prefixes in the shapes users paste (imports above a def, bare def lines, methods)
dflash-studio train draft --target runs/target_ul/model --out runs/draft8/model --work runs/draft8/work $DRAFT_FLAGS \
    --init runs/draft6/model --prompts code-wide --chat-fraction 0.2 --lr 3e-4 --num-sequences 3000 \
    --new-tokens 96 --gen-fraction 0.25 --max-minutes 80 --cache-features-gb 10 --checkpoint-minutes 10 --seed 51

# the draft proposes from the first 2,048 token ids only (a cheaper head on a CPU; docs/performance.md)
cap_proposals() {
    python3 -c 'import json, sys; p = sys.argv[1]; c = json.load(open(p)); c["dflash_config"]["proposal_vocab_size"] = 2048; open(p, "w").write(json.dumps(c, indent=2) + "\n")' "$1"
}
mkdir -p assets/models/tiny-coder/target assets/models/tiny-coder/draft
cp runs/target_ul/model/* assets/models/tiny-coder/target/
cp runs/draft8/model/* assets/models/tiny-coder/draft/
cap_proposals assets/models/tiny-coder/draft/config.json
dflash-studio bench --target assets/models/tiny-coder/target --draft assets/models/tiny-coder/draft \
    --no-fallback   # the speed demo: greedy, block 8, the shipped prompt set

# ---- the default pair, tiny-coder (assets/models/tiny-coder-requests/README.md): the target that answers ----
# every layer of the anti-loop target fine-tuned on request -> code pairs with invented names (--data copy)
dflash-studio train target --init runs/target_ul/model --data copy --name-weight 3 --lr 8e-4 \
    --chat-fraction 0.75 --batch-size 8 --threads 2 --max-minutes 62 --checkpoint-minutes 8 --seed 24 \
    --out runs/requests/target/model --work runs/requests/target/work
# its draft: four distillation runs on the new target's own replies, each from the one before
dflash-studio train draft --init runs/draft4/model --target runs/requests/target/model $DRAFT_FLAGS \
    --prompts requests --chat-fraction 0.5 --lr 6e-4 --num-sequences 4000 --new-tokens 96 --gen-fraction 0.22 \
    --max-minutes 68 --cache-features-gb 8 --checkpoint-minutes 8 --seed 25 \
    --out runs/requests/draft1/model --work runs/requests/draft1/work
dflash-studio train draft --init runs/requests/draft1/model --target runs/requests/target/model $DRAFT_FLAGS \
    --prompts requests --chat-fraction 0.5 --lr 5e-4 --num-sequences 8000 --new-tokens 96 --gen-fraction 0.2 \
    --max-minutes 125 --cache-features-gb 10 --checkpoint-minutes 10 --seed 26 \
    --out runs/requests/draft2/model --work runs/requests/draft2/work
# the third on prompts the target never saw (requests from 20 other packages' docstrings)
dflash-studio train draft --init runs/requests/draft2/model --target runs/requests/target/model $DRAFT_FLAGS \
    --prompts requests-wide --chat-fraction 0.3 --lr 4e-4 --num-sequences 3000 --new-tokens 96 --gen-fraction 0.28 \
    --max-minutes 100 --cache-features-gb 10 --checkpoint-minutes 10 --seed 27 \
    --out runs/requests/draft3/model --work runs/requests/draft3/work
# the fourth: more of the same with more chat requests, fresh seed
dflash-studio train draft --init runs/requests/draft3/model --target runs/requests/target/model $DRAFT_FLAGS \
    --prompts requests-wide --chat-fraction 0.5 --lr 3e-4 --num-sequences 3000 --new-tokens 96 --gen-fraction 0.28 \
    --max-minutes 100 --cache-features-gb 8 --checkpoint-minutes 10 --seed 32 \
    --out runs/requests/draft4/model --work runs/requests/draft4/work

# it proposes from the 2,048 ids this target writes most in 1,200 greedy replies:
# the first 2,048 ids miss the English words the fine-tune added (~7 min)
dflash-studio train proposals --target runs/requests/target/model --draft runs/requests/draft4/model \
    --prompts requests-wide --num-sequences 1200 --seed 77 --threads 2 --work runs/requests/proposals

# ---- then that pair trained on with --data coder: three target stages, six draft stages (~10.5 h) ----
FROM_TARGET=runs/requests/target/model FROM_DRAFT=runs/requests/draft4/model OUT=runs/coder bash scripts/train_coder.sh
mkdir -p assets/models/tiny-coder-requests/target assets/models/tiny-coder-requests/draft
cp runs/coder/stageC/model/* assets/models/tiny-coder-requests/target/
cp runs/coder/draft6/model/* assets/models/tiny-coder-requests/draft/
# the default pair, as the app, generate and bench run it with no --target
dflash-studio train eval --target assets/models/tiny-coder-requests/target \
    --prompts assets/prompts/fresh_requests.jsonl --max-new-tokens 96   # parse / on-topic rates
dflash-studio bench --prompts assets/prompts/unseen6.jsonl --no-fallback
