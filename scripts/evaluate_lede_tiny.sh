#!/usr/bin/env bash
# After scripts/train_lede_tiny.sh: evaluates the exits, trains the LEDE
# policies, benchmarks LEDE against its baselines and writes the model card.
# Training jobs run two at a time, one thread each (this machine has 2
# cores); the two benchmarks run one after the other (two at once share the
# 32 MB L3 that holds lede-tiny's 22 MB of weights, which changes the very
# cost ratios being measured); every speed-up is a ratio measured inside one
# process. The results go to bench/results/<model>-{eval-exits,bench}.json
# (bench/record.py: with the command, commit, date and machine), whence the
# model card's and the docs' tables are generated.
# usage: scripts/evaluate_lede_tiny.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${LEDE_MODEL:-models/lede-tiny}
CANDIDATES=${LEDE_CANDIDATES:-1,2,3,4,5,6}
LEDE=build/services/cli/lede
LEDE_BENCH=build/bench/lede-bench
RESULTS=bench/results/$(basename "$MODEL")
mkdir -p out
# Rounds are timed in whole generations of the policies' training prompts
# (never evaluation ones), as the workload runs them.
python3 scripts/make_policy_training_prompts.py out/policy-prompts 80
"$LEDE" calibrate --model "$MODEL" --threads 1 --round-passes 15 --round-max-draft-len 6 \
  --prompts out/policy-prompts/train-story.jsonl,out/policy-prompts/train-code.jsonl --new-tokens 64 \
  --out "$MODEL/calibration-cpu.json"
python3 bench/record.py "$RESULTS-eval-exits.json" -- build/trainer/lede-eval-exits --model "$MODEL" \
  --calibration "$MODEL/calibration-cpu.json" \
  --data out/corpus/stories.val.txt,out/corpus/code.val.txt --exit-layers 1,2,3,4,6 --draft-lens 1,2,3,4,6 \
  --prompts 24 --new-tokens 64 --threads 1 --out '{json}' > out/eval_exits.txt 2>&1 &
LEDE_CANDIDATES="$CANDIDATES" scripts/train_policies.sh 1 > out/train_policies.txt 2>&1
wait
bench() {  # the lede-bench command of one prompt set
  echo "$LEDE_BENCH" bench --model "$MODEL" --calibration "$MODEL/calibration-cpu.json" \
    --prompts "$MODEL/prompts/$1.jsonl" --candidate-layers "$CANDIDATES" \
    --policy "$MODEL/policy/accelerator-v7,$MODEL/policy/measured-v9,$MODEL/policy/story-accelerator-v5,$MODEL/policy/story-measured-v8" \
    --max-draft-len 6 --prompts-per-set 48 --new-tokens 64 --threads 1 --json '{json}'
}
# The story set, then the code set, in one result file.
# shellcheck disable=SC2046  # the commands are split into words on purpose
python3 bench/record.py "$RESULTS-bench.json" -- $(bench story) -- $(bench code) > out/bench.txt 2> out/bench.err
cat out/eval_exits.txt out/bench.txt
python3 scripts/make_model_card.py "$MODEL"
python3 scripts/make_docs_tables.py
