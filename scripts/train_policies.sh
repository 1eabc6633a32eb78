#!/usr/bin/env bash
# Trains LEDE's exit policies for models/lede-tiny:
#   paper-v1        the rewards of DESIGN.md §2, accelerator depth term
#   accelerator-v1  throughput rewards (tokens minus cost) under the accelerator cost model
#   measured-v1     throughput rewards under this machine's measured cost model
# Steps: calibrate (unless MODEL/calibration-cpu.json exists), collect
# exploration experience on the tuning split of the prompt sets only
# (`lede collect`), train a DQN per reward offline (`lede-train`), and point
# SERVING at the policy whose cost model fits this hardware (measured-v1 on
# CPU; `lede generate --mode lede` picks accelerator-v1 on CUDA).
# usage: scripts/train_policies.sh [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-1}
MODEL=${LEDE_MODEL:-models/lede-tiny}
LEDE=build/services/cli/lede
PROMPTS="$MODEL/prompts/story.jsonl,$MODEL/prompts/code.jsonl"
CANDIDATES=${LEDE_CANDIDATES:-2,3,4,6}
MAX_DRAFT_LEN=${LEDE_MAX_DRAFT_LEN:-4}  # D_max: with 8 the policies learned drafts of ~7.5 and trailed static
mkdir -p "$MODEL/policy" out/experience
[[ -f "$MODEL/calibration-cpu.json" ]] ||
  "$LEDE" calibrate --model "$MODEL" --threads "$THREADS" --out "$MODEL/calibration-cpu.json"
train() {  # name reward cost_model
  local name=$1 reward=$2 cost=$3
  rm -rf "out/experience/$name" "$MODEL/policy/$name-v1"
  "$LEDE" collect --model "$MODEL" --prompts "$PROMPTS" --out "out/experience/$name" --reward "$reward" \
    --cost-model "$cost" --calibration "$MODEL/calibration-cpu.json" --candidate-layers "$CANDIDATES" \
    --max-draft-len "$MAX_DRAFT_LEN" --seeds 8 --epsilon 0.2 --prompts-per-set 48 --threads "$THREADS" --version "explore-$name"
  build/trainer/lede-train --experience "out/experience/$name" --out "$MODEL/policy/$name-v1" \
    --max-draft-len "$MAX_DRAFT_LEN" --version "$name-v1" --seed 1 2>&1 | tee "out/experience/train-$name.log"
  cp "out/experience/train-$name.log" "$MODEL/policy/$name-v1/training_report.txt"
}
train paper paper accelerator
train accelerator throughput accelerator
train measured throughput measured
printf 'measured-v1\n' > "$MODEL/policy/SERVING.tmp" && mv "$MODEL/policy/SERVING.tmp" "$MODEL/policy/SERVING"
