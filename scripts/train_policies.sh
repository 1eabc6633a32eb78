#!/usr/bin/env bash
# Trains LEDE's exit policies for models/lede-tiny, one per reward cost model:
#   1. calibrates this machine's measured cost model,
#   2. collects exploration experience on the tuning split of the prompt sets
#      (`lede collect`; the evaluation split is never seen),
#   3. trains a DQN per cost model offline (`lede-train`),
#   4. points SERVING at the policy whose cost model fits this hardware
#      (measured on CPU; accelerator where a GPU serves).
# usage: scripts/train_policies.sh [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-1}
MODEL=${LEDE_MODEL:-models/lede-tiny}
LEDE=build/services/cli/lede
PROMPTS="$MODEL/prompts/story.jsonl,$MODEL/prompts/code.jsonl"
CANDIDATES=${LEDE_CANDIDATES:-2,3,4,6}
mkdir -p "$MODEL/policy" out/experience
[[ -f "$MODEL/calibration-cpu.json" ]] || "$LEDE" calibrate --model "$MODEL" --threads "$THREADS" --out "$MODEL/calibration-cpu.json"
for cost in accelerator measured; do
  rm -rf "out/experience/$cost"
  "$LEDE" collect --model "$MODEL" --prompts "$PROMPTS" --out "out/experience/$cost" --cost-model "$cost" \
    --calibration "$MODEL/calibration-cpu.json" --candidate-layers "$CANDIDATES" --seeds 8 \
    --epsilon 0.2 --threads "$THREADS"
  rm -rf "$MODEL/policy/$cost-v1"
  build/trainer/lede-train --experience "out/experience/$cost" --out "$MODEL/policy/$cost-v1" \
    --version "$cost-v1" --seed 1 2>&1 | tee "out/experience/train-$cost.log"
  cp "out/experience/train-$cost.log" "$MODEL/policy/$cost-v1/training_report.txt"
done
printf 'measured-v1\n' > "$MODEL/policy/SERVING.tmp" && mv "$MODEL/policy/SERVING.tmp" "$MODEL/policy/SERVING"
