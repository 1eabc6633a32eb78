#!/usr/bin/env bash
# Trains LEDE's exit policies for models/lede-tiny on counterfactual
# experience (lede-train-counterfactual: greedy requests of the tuning split
# of each prompt set and of extra training prompts that no evaluation prompt
# was cut near, their shadow tokens, Dinkelbach iteration of the DQN with
# rollout targets and a conservative margin of 0.2 tokens per round):
#   accelerator-v7  tokens - rho * cost under the accelerator cost model,
#                   policy iteration from the calibrated stopping rule
#                   (--initial-policy calibrated; v5 started from static; v6
#                   trained on HumanEval as its extra code prompts, v7 on
#                   standard-library code, the evaluation's domain)
#   measured-v9     tokens - rho * cost under this machine's measured cost model
#                   (calibration-cpu.json: rounds timed in whole generations of
#                   the training prompts on the fused path, priced by their own
#                   entries), from the calibrated rule (v8: the same with
#                   --lookahead-probe and HumanEval, exits at layer 2 on code;
#                   v7 started from static and never beat it)
#   story-measured-v8: trained on story requests only, from the calibrated rule
#   story-accelerator-v5: trained on story requests only, from static (from the
#                   rule it exits at layer 1 and runs below autoregressive
#                   decoding on code in wall-clock)
#                   (the story-* policies are the generalization check: run on code)
#   accelerator-load-v1  the accelerator model at loads 1, 64, 128, 256 (the policy
#                   sees the load; the others are of the load-blind spec v3)
# Calibrates first unless MODEL/calibration-cpu.json exists, and points
# SERVING at measured-v9 (level with story-measured-v8 in wall-clock on this
# CPU in two lede-bench runs, ahead of it under the measured cost model on
# both sets, and trained on both domains; `lede generate --mode lede` picks the accelerator
# policy trained on the most requests on CUDA, accelerator-v7). Only the first half of each prompt file
# (--prompts-per-set 48: 24 tuning prompts) is ever seen in training.
# usage: scripts/train_policies.sh [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-1}
MODEL=${LEDE_MODEL:-models/lede-tiny}
LEDE=build/services/cli/lede
TRAIN=build/trainer/lede-train-counterfactual
CANDIDATES=${LEDE_CANDIDATES:-1,2,3,4,5,6}
MAX_DRAFT_LEN=${LEDE_MAX_DRAFT_LEN:-6}
NEW_TOKENS=${LEDE_TRAIN_NEW_TOKENS:-128}
EXTRA=${LEDE_EXTRA_PROMPTS:-40}  # extra training prompts per domain (scripts/make_policy_training_prompts.py)
MARGIN=${LEDE_CONSERVATIVE_MARGIN:-0.2}  # tokens per round (trainer/dinkelbach.h conservative_margin)
mkdir -p "$MODEL/policy" out/policies
python3 scripts/make_policy_training_prompts.py out/policy-prompts $((2 * EXTRA))
[[ -f "$MODEL/calibration-cpu.json" ]] ||
  "$LEDE" calibrate --model "$MODEL" --threads "$THREADS" --round-passes 15 --round-max-draft-len "$MAX_DRAFT_LEN" \
    --prompts out/policy-prompts/train-story.jsonl,out/policy-prompts/train-code.jsonl --new-tokens 64 \
    --out "$MODEL/calibration-cpu.json"
train() {  # name reward cost_model prompt-sets [extra flags]
  local name=$1 reward=$2 cost=$3 sets=$4 prompts="" extra=""
  for s in ${sets//,/ }; do
    prompts+="${prompts:+,}$MODEL/prompts/$s.jsonl"
    extra+="${extra:+,}out/policy-prompts/train-$s.jsonl"
  done
  "$TRAIN" --model "$MODEL" --prompts "$prompts" --prompts-per-set 48 --new-tokens "$NEW_TOKENS" \
    --extra-prompts "$extra" --extra-count "$EXTRA" --exclude-prompts "$prompts" --iterations 6 --epochs 16 \
    --reward "$reward" --cost-model "$cost" --calibration "$MODEL/calibration-cpu.json" \
    --candidate-layers "$CANDIDATES" --max-draft-len "$MAX_DRAFT_LEN" --threads "$THREADS" --seed 1 \
    --conservative-margin "$MARGIN" "${@:5}" \
    --out "$MODEL/policy/$name" --version "$name" --overwrite 2>&1 | tee "out/policies/train-$name.log"
  cp "out/policies/train-$name.log" "$MODEL/policy/$name/training_report.txt"
}
train accelerator-v7 throughput accelerator story,code --initial-policy calibrated
train measured-v9 throughput measured story,code --initial-policy calibrated
train story-measured-v8 throughput measured story --initial-policy calibrated
train story-accelerator-v5 throughput accelerator story
# The load-aware policy (feature spec lede-features-v4): one policy trained at four loads of the
# accelerator roofline (docs/serving.md "Speculation at a load"); not SERVING.
train accelerator-load-v1 throughput accelerator story,code --loads 1,64,128,256
# SERVING: the measured-cost policy trained on both domains, which the last lede-bench runs
# (scripts/evaluate_lede_tiny.sh) measured level with the fastest in wall-clock on this CPU on
# both sets (the model card, models/lede-tiny/README.md).
printf 'measured-v9\n' > "$MODEL/policy/SERVING.tmp" && mv "$MODEL/policy/SERVING.tmp" "$MODEL/policy/SERVING"
