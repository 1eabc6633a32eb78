#!/usr/bin/env bash
# After scripts/train_lede_tiny.sh: evaluates the exits, trains the LEDE
# policies, benchmarks LEDE against its baselines and writes the model card.
# usage: scripts/evaluate_lede_tiny.sh [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-1}
MODEL=${LEDE_MODEL:-models/lede-tiny}
CANDIDATES=${LEDE_CANDIDATES:-2,3,4,6}
mkdir -p out
build/services/cli/lede calibrate --model "$MODEL" --threads "$THREADS" --out "$MODEL/calibration-cpu.json"
build/trainer/lede-eval-exits --model "$MODEL" --calibration "$MODEL/calibration-cpu.json" \
  --data out/corpus/stories.val.txt,out/corpus/code.val.txt --exit-layers 1,2,3,4,6 --draft-lens 1,2,3,4,6 \
  --prompts 24 --new-tokens 64 --threads "$THREADS" --out "$MODEL/eval_exits.json" | tee out/eval_exits.txt
LEDE_CANDIDATES="$CANDIDATES" scripts/train_policies.sh "$THREADS"
build/services/cli/lede bench --model "$MODEL" --calibration "$MODEL/calibration-cpu.json" \
  --prompts "$MODEL/prompts/story.jsonl,$MODEL/prompts/code.jsonl" --candidate-layers "$CANDIDATES" \
  --policy "$MODEL/policy/paper-v1,$MODEL/policy/accelerator-v1,$MODEL/policy/measured-v1" --prompts-per-set 48 --new-tokens 64 \
  --threads "$THREADS" --json "$MODEL/bench.json" | tee out/bench.txt
python3 scripts/make_model_card.py "$MODEL"
