#!/usr/bin/env bash
# Samples synthetic TinyStories-style stories from testdata/models/stories260K
# with the engine (temperature 0.7, top-p 0.95) into OUT_FILE, documents
# separated by <|doc|> lines, for scripts/build_corpus.py. One process per
# story opener samples its stories with consecutive seeds starting at
# FIRST_SEED + opener * 1000000 (`lede generate --samples`).
# usage: sample_synthetic_stories.sh OUT_FILE N_STORIES [FIRST_SEED] [MAX_NEW_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_FILE=${1:?usage: sample_synthetic_stories.sh OUT_FILE N_STORIES [FIRST_SEED] [MAX_NEW_TOKENS]}
N=${2:?N_STORIES}
FIRST_SEED=${3:-0}
MAX_NEW=${4:-400}
LEDE=${LEDE_BIN:-build/services/cli/lede}
openers=("Once upon a time" "One day" "Once upon a time, there was" "Lily and Ben" "Tom had a" "There was a little")
mkdir -p "$(dirname "$OUT_FILE")"
tmp="$OUT_FILE.tmp"
: > "$tmp"
for ((o = 0; o < ${#openers[@]}; o++)); do
  n=$(( N / ${#openers[@]} + (o < N % ${#openers[@]} ? 1 : 0) ))
  (( n > 0 )) || continue
  "$LEDE" generate --model testdata/models/stories260K --prompt "${openers[$o]}" --mode ar \
    --max-new-tokens "$MAX_NEW" --temperature 0.7 --top-p 0.95 --seed $((FIRST_SEED + o * 1000000)) \
    --samples "$n" --separator '<|doc|>' --threads 1 2>/dev/null >> "$tmp"
done
mv "$tmp" "$OUT_FILE"
