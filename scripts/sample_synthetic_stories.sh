#!/usr/bin/env bash
# Samples synthetic TinyStories-style stories from ../shared/models/stories260K
# with the engine (temperature 0.7, top-p 0.95, one seed per story) into
# OUT/synthetic_stories.txt, documents separated by <|doc|> lines, for
# scripts/build_corpus.py. usage: sample_synthetic_stories.sh OUT N_STORIES
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/corpus}
N=${2:-2500}
LEDE=${LEDE_BIN:-build/services/cli/lede}
openers=("Once upon a time" "One day" "Once upon a time, there was" "Lily and Ben" "Tom had a" "There was a little")
mkdir -p "$OUT"
tmp="$OUT/synthetic_stories.txt.tmp"
: > "$tmp"
for ((i = 0; i < N; i++)); do
  opener=${openers[$((i % ${#openers[@]}))]}
  "$LEDE" generate --model ../shared/models/stories260K --prompt "$opener" --mode ar \
    --max-new-tokens 400 --temperature 0.7 --top-p 0.95 --seed "$i" --threads 1 2>/dev/null >> "$tmp"
  printf '<|doc|>\n' >> "$tmp"
done
mv "$tmp" "$OUT/synthetic_stories.txt"
