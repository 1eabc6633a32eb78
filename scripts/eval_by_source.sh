#!/usr/bin/env bash
# Held-out story perplexity and agreement per source (real TinyStories vs
# synthetic stories260K samples) for lede-tiny's stage-1 and final weights,
# into bench/results/<model>-eval-sources.json (bench/record.py) for the
# model card: stage 2 trains mostly on
# synthetic stories, and this shows what that costs on real text.
# usage: scripts/eval_by_source.sh [STAGE1_DIR]   (after scripts/train_lede_tiny.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${LEDE_MODEL:-models/lede-tiny}
STAGE1=${1:-out/lede-tiny-stage1}
SPLIT=out/corpus/heldout  # scripts/build_corpus.py
run() {  # model out.json
  build/trainer/lede-eval-exits --model "$1" --calibration "$MODEL/calibration-cpu.json" \
    --data "$SPLIT/stories-tinystories.val.txt,$SPLIT/stories-synthetic.val.txt" --exit-layers 2 --draft-lens 2 --prompts 2 \
    --new-tokens 8 --eval-tokens 32768 --threads 1 --out "$2" > /dev/null 2>&1
}
run "$STAGE1" out/eval_sources_stage1.json &
run "$MODEL" out/eval_sources_final.json
wait
python3 - out/eval_sources.json out/eval_sources_stage1.json out/eval_sources_final.json <<'PY'
import json, sys
out = {}
for label, path in (("stage 1", sys.argv[2]), ("final", sys.argv[3])):
    out[label] = {dom: r["layers"] for dom, r in json.load(open(path))["domains"].items()}
json.dump(out, open(sys.argv[1], "w"), indent=2)
PY
python3 bench/record.py "bench/results/$(basename "$MODEL")-eval-sources.json" --from out/eval_sources.json \
  --command "scripts/eval_by_source.sh $STAGE1"
