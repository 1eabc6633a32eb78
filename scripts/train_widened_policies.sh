#!/usr/bin/env bash
# Trains LEDE's exit policies for lede-tiny widened by FACTOR (`lede widen`,
# docs/models.md "The memory-bound regime") and ships them under
# models/lede-tiny/widened/<fingerprint>/policy, whence `lede widen` installs
# them into every output of that shape (with SERVING):
#   accelerator-v1  tokens - rho * cost under the accelerator cost model of the
#                   wide shape (machine-independent: the LM head costs ~0.4
#                   layer-equivalents at factor 3, ~0.2 at factor 5, 1.0 in
#                   lede-tiny)
#   cost-v5         with LEDE_WIDEN_COST=1 only (LEDE_WIDEN_COST_VERSION names
#                   it; cost-v2 was the same recipe on 48 prompts per set,
#                   under the single-fit round table, cost-v3 on calibrations
#                   from before they timed their steps in context, cost-v4
#                   without the lookahead probe and with three profiles
#                   around the AMD VM's costs): one cost-conditioned policy
#                   (lede-features-v5) trained across cost profiles: the
#                   accelerator model, this machine's measured f32, bf16 and
#                   q8_0 calibrations of the wide shape (one thread; made
#                   here when missing) and the profiles of
#                   LEDE_WIDEN_AROUND around them (PROBE:LAYER:VERIFY;
#                   default: layer 0.45, 0.75 and 1.4 at the probe and
#                   verify of this machine's formats, whose layer is 0.60 at
#                   q8_0 and 1.17 at bf16, so that each measured profile has
#                   neighbours on both sides; a costly verification, 0.3; and
#                   one where no speculation pays, 0.8; docs/training.md "What the policy
#                   sees of the hardware"); from the calibrated rule per
#                   profile, autoregressive where even the rule loses. A
#                   calibration's features are those of its steps timed in
#                   the tuning prompts' generations, as the services time
#                   their served steps (cost-v1 saw its round table's, which
#                   the services never show). With --lookahead-probe: a draft-
#                   length decision sees the next token's own exit
#                   distribution, as the calibrated rule the benchmarks tune
#                   does; a stop wastes that head, 0.015 of a step here.
#                   cost-v5 ran 0.4-4.6% below cost-v4 on the held-out
#                   prompts at q8_0 and bf16 (docs/training.md), so SERVING
#                   stayed cost-v4 (this script at commit aaff638 trains it)
#                   until cost-v6 (below), SERVING after it was measured
#                   with the costs a deployment meters
#   measured-v1     with LEDE_WIDEN_MEASURED=1 only: the same under the wide
#                   shape's measured cost model (MODEL/calibration-cpu.json of
#                   `lede widen --calibrate` on this machine; machine-specific,
#                   so not shipped by default: on this shared VM the round
#                   timings of that calibration moved by 2-4x between entries)
# Both as scripts/train_policies.sh's accelerator-v7 / measured-v9 (same
# prompts, flags and seed), except that the shadow traces are computed by
# lede-tiny itself (--trace-model): the widened model computes lede-tiny's
# function, so its greedy trajectories and exit signals are lede-tiny's (the
# trainer checks this on the first trace) and only the cost model is the
# wide shape's. Training then takes the same few minutes for every factor.
# The prompt sets train with --prompts-per-set 24, their first 12 prompts:
# the tuning split of the widened benchmarks (lede-bench --prompts-per-set
# 24), whose evaluation prompts 12..23 no policy may see (the policies up to
# cost-v2 read 48, so they trained on those).
# LEDE_WIDEN_FORMATS lists the cost-conditioned policy's measured profiles as FORMAT or
# FORMAT@THREADS (default "q8_0 f32 bf16", one thread each); factor 8's
# rows are multiples of 256, so it adds the K-quant file users download:
# "q8_0 f32 bf16 q4_k_m q4_k_m@2".
# With LEDE_WIDEN_ONLY_COST=1 accelerator-v1 is not retrained: the cost-conditioned policy joins
# the policies already shipped for the shape.
# LEDE_WIDEN_COST_FLAGS (default --lookahead-probe): the cost-conditioned policy's own
# lede-train-counterfactual flags. cost-v6 is the recipe of cost-v4 (no lookahead probe; the
# two synthetic profiles 0.01:0.8:0.3 and 0.01:0.8:0.8) with the two-thread q8_0 profile
# (LEDE_WIDEN_FORMATS="q8_0 bf16 q8_0@2") and sampled requests beside the greedy ones, which
# its state tells apart by the temperature (lede-features-v6):
# LEDE_WIDEN_COST_FLAGS="--temperature 0.8 --seeds 1 --also-greedy"; it was SERVING until cost-v8.
# cost-v7 is cost-v6's recipe across both VM types the project has run on: the AMD EPYC VM's one-thread
# q8_0 calibration (LEDE_WIDEN_FORMATS=q8_0, a verified position 0.28 of a step) with neighbours of it, and
# the Intel Xeon VM's three measured profiles as synthetic ones (LEDE_WIDEN_AROUND in
# scripts/docs_table_commands.py COST_V7_AROUND). cost-v8 is cost-v7's with the lookahead probe
# (LEDE_WIDEN_COST_FLAGS="--temperature 0.8 --seeds 1 --also-greedy --lookahead-probe"), SERVING
# (FACTOR 5, SERVING cost-v8; docs/training.md). cost-v10 is cost-v8's with the exit layer chosen on
# the candidate layers' probes (--probe-candidates: a round's first draft is seen before it is
# drafted, so the policy can decline it, as the calibrated rule does), and cost-v11 is cost-v10's
# with a rho and a pi_0 per kind of request (--rho-per-sampling).
# usage: scripts/train_widened_policies.sh FACTOR [SERVING]   (SERVING: the version to serve; default accelerator-v1)
set -euo pipefail
cd "$(dirname "$0")/.."
FACTOR=${1:?usage: scripts/train_widened_policies.sh FACTOR [SERVING]}
SERVING=${2:-accelerator-v1}
MEASURED=${LEDE_WIDEN_MEASURED:-0}
COST=${LEDE_WIDEN_COST:-0}
COST_VERSION=${LEDE_WIDEN_COST_VERSION:-cost-v5}
ONLY_COST=${LEDE_WIDEN_ONLY_COST:-0}
FORMATS=${LEDE_WIDEN_FORMATS:-q8_0 f32 bf16}
AROUND=${LEDE_WIDEN_AROUND:-0.015:0.45:0.05 0.015:0.75:0.05 0.015:1.4:0.03 0.01:0.8:0.3 0.01:0.8:0.8}
SOURCE=models/lede-tiny
MODEL=${LEDE_MODEL:-out/lede-tiny-w$FACTOR}
LEDE=build/services/cli/lede
TRAIN=build/trainer/lede-train-counterfactual
EXTRA=40
mkdir -p out/policies "out/widened-policies/w$FACTOR"
python3 scripts/make_policy_training_prompts.py out/policy-prompts $((2 * EXTRA))
[[ -f "$MODEL/config.json" ]] || "$LEDE" widen --model "$SOURCE" --factor "$FACTOR" --out "$MODEL" --overwrite
[[ $MEASURED == 0 || -f "$MODEL/calibration-cpu.json" ]] ||
  "$LEDE" calibrate --model "$MODEL" --threads 1 --round-passes 8 --round-max-draft-len 6 --out "$MODEL/calibration-cpu.json"
train() {  # name cost_model [extra flags]
  local name=$1 cost=$2 out="out/widened-policies/w$FACTOR/$1"
  "$TRAIN" --model "$MODEL" --trace-model "$SOURCE" \
    --prompts "$SOURCE/prompts/story.jsonl,$SOURCE/prompts/code.jsonl" --prompts-per-set 24 --new-tokens 128 \
    --extra-prompts out/policy-prompts/train-story.jsonl,out/policy-prompts/train-code.jsonl --extra-count "$EXTRA" \
    --exclude-prompts "$SOURCE/prompts/story.jsonl,$SOURCE/prompts/code.jsonl" --iterations 6 --epochs 16 \
    --reward throughput --cost-model "$cost" --calibration "$MODEL/calibration-cpu.json" \
    --candidate-layers 1,2,3,4,5,6 --max-draft-len 6 --threads 1 --seed 1 --conservative-margin 0.2 \
    --initial-policy calibrated --out "$out" --version "$name" --overwrite "${@:3}" 2>&1 |
    tr '\r' '\n' | grep -v '^shadow traces' | tee "out/policies/train-w$FACTOR-$name.log"
  cp "out/policies/train-w$FACTOR-$name.log" "$out/training_report.txt"
}
fingerprint() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model_fingerprint"])' "$1"; }
if [[ $ONLY_COST == 0 ]]; then
  train accelerator-v1 accelerator
  SHIP="$SOURCE/widened/$(fingerprint "out/widened-policies/w$FACTOR/accelerator-v1/policy.json")/policy"
  rm -rf "$SHIP" && mkdir -p "$SHIP"
  cp -r "out/widened-policies/w$FACTOR/accelerator-v1" "$SHIP/"
else  # the shape's policies, as `lede widen` installed them
  SHIP="$SOURCE/widened/$(fingerprint "$MODEL/policy/accelerator-v1/policy.json")/policy"
fi
if [[ $COST != 0 ]]; then
  # The calibrations time their rounds in whole generations of the tuning prompts (the first 12
  # of each set, as the benchmarks split them): rounds in context, the first ones after the
  # prefill included, as a deployment's own served steps are. On one synthetic prompt with the
  # warm rounds only, the rounds at E >= 5 timed 10-30% under what they cost in generations.
  TUNING=out/widened-policies/tuning-prompts.jsonl
  { head -n 12 "$SOURCE/prompts/story.jsonl"; head -n 12 "$SOURCE/prompts/code.jsonl"; } > "$TUNING"
  PROFILES=accelerator
  for profile in $FORMATS; do  # FORMAT or FORMAT@THREADS
    w=${profile%@*} t=1
    [[ $profile == *@* ]] && t=${profile#*@}
    cal="$MODEL/calibration-$w.json"
    [[ $t == 1 ]] || cal="$MODEL/calibration-$w-${t}t.json"
    [[ -f "$cal" ]] ||
      "$LEDE" calibrate --model "$MODEL" --weights "$w" --threads "$t" --repeats 20 --round-passes 3 \
        --round-max-draft-len 6 --batch-sizes "" --prompts "$TUNING" --new-tokens 64 --out "$cal"
    PROFILES+=",calibration:$cal"
  done
  # Every request is replayed once per profile and iteration (eight profiles with two formats):
  # four iterations over 20 extra prompts per domain (the later flags win) keep it to minutes.
  for profile in $AROUND; do PROFILES+=",$profile"; done
  # shellcheck disable=SC2086  # LEDE_WIDEN_COST_FLAGS is a list of flags
  train "$COST_VERSION" accelerator --cost-profiles "$PROFILES" \
    --iterations 4 --extra-count 20 ${LEDE_WIDEN_COST_FLAGS---lookahead-probe}
  cp -r "out/widened-policies/w$FACTOR/$COST_VERSION" "$SHIP/"
  # LEDE_WIDEN_DEPLOYMENT=1: per format, a policy trained under that calibration alone
  # (deployment-FORMAT), what a deployment's retraining on its own traffic converges to; a
  # record of this machine's timings, so kept under out/widened-policies, not shipped.
  if [[ ${LEDE_WIDEN_DEPLOYMENT:-0} != 0 ]]; then
    for cal in ${PROFILES//,/ }; do
      [[ $cal == calibration:* ]] || continue
      name=${cal##*/calibration-}
      train "deployment-${name%.json}" accelerator --cost-profiles "$cal" --iterations 4 --extra-count 20 \
        --lookahead-probe
    done
  fi
fi
if [[ $MEASURED != 0 ]]; then
  train measured-v1 measured
  cp -r "out/widened-policies/w$FACTOR/measured-v1" "$SHIP/"
  cp "$MODEL/calibration-cpu.json" "$SHIP/measured-v1/calibration-cpu.json"  # the measured model it was trained under
fi
printf '%s\n' "$SERVING" > "$SHIP/SERVING"
echo "shipped $SHIP (factor $FACTOR, SERVING $SERVING)"
