#!/usr/bin/env bash
# The whole batch-retraining loop, locally on models/lede-tiny:
#   1. copy the model's policy root to a state dir and serve it: lede-policy
#      (hot reload of SERVING), a co-located lede-model following it, and
#      lede-coordinator logging experience to <state>/experience;
#   2. "before": a fixed evaluation prompt set, greedy (epsilon 0);
#   3. traffic: N prompts with epsilon-greedy exploration (--epsilon) and a
#      few without, which the coordinator logs as experience (evaluation
#      requests go through a second coordinator that logs nothing);
#   4. lede-train --once: new shards -> warm-started candidate -> offline and
#      replay evaluation -> published only if better (report.json beside it);
#   5. wait until the drafter serves the new version (summaries'
#      policy_version), then "after": the same evaluation set;
#   6. print before/after acceptance rate, tokens/round and tokens/s.
# Takes under a minute with the defaults on 2 cores.
#
# usage: scripts/retrain_loop.sh [--requests N] [--greedy N] [--eval N] [--new-tokens N]
#                                [--epsilon E] [--margin M | --force] [--state-dir DIR]
#   --requests N    exploration requests (default 48)      --greedy N  greedy traffic requests (8)
#   --eval N        evaluation prompts, before and after (12, at most 16)   --new-tokens N  per request (48)
#   --margin M      lede-train --publish-margin (0.0)      --force     publish whatever the numbers
# env: LEDE_BUILD_DIR (build), LEDE_MODEL (models/lede-tiny), LEDE_PYTHON (/usr/bin/python3)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${LEDE_BUILD_DIR:-build}
MODEL=${LEDE_MODEL:-models/lede-tiny}
PY=${LEDE_PYTHON:-/usr/bin/python3}
STATE=out/retrain-loop
N_EXPLORE=48 N_GREEDY=8 N_EVAL=12 NEW_TOKENS=48 EPSILON=0.2 MARGIN=0.0

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --requests) N_EXPLORE=$2; shift ;;
    --greedy) N_GREEDY=$2; shift ;;
    --eval) N_EVAL=$2; shift ;;
    --new-tokens) NEW_TOKENS=$2; shift ;;
    --epsilon) EPSILON=$2; shift ;;
    --margin) MARGIN=$2; shift ;;
    --force) MARGIN=-inf ;;
    --state-dir) STATE=$2; shift ;;
    -h|--help) usage 0 ;;
    *) echo "retrain_loop: unknown argument $1" >&2; usage 2 ;;
  esac
  shift
done
for b in services/policy/lede-policy services/model/lede-model services/coordinator/lede-coordinator trainer/lede-train; do
  [[ -x $BUILD/$b ]] || { echo "retrain_loop: $BUILD/$b is missing; build it first (scripts/build)" >&2; exit 1; }
done
"$PY" -c 'import grpc' 2>/dev/null || { echo "retrain_loop: $PY lacks grpcio (set LEDE_PYTHON)" >&2; exit 1; }

rm -rf "$STATE"
mkdir -p "$STATE/logs"
STATE=$(cd "$STATE" && pwd)
cp -r "$MODEL/policy" "$STATE/policy"
rm -f "$STATE/policy/retrain_state.json"
LOGS=$STATE/logs
CAL=()
[[ -f $MODEL/calibration-cpu.json ]] && CAL=(--calibration "$MODEL/calibration-cpu.json")
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME ARGS...: runs it in the background, waits for its started line,
# and sets GRPC_PORT / METRICS_PORT.
start() {
  local name=$1 i line
  shift
  "$@" > "$LOGS/$name.log" 2>&1 &
  PIDS+=($!)
  for ((i = 0; i < 600; i++)); do
    line=$(grep -m1 -E 'event="?started' "$LOGS/$name.log" 2>/dev/null || true)
    if [[ -n $line ]]; then
      GRPC_PORT=$(sed -E 's/.*grpc_port="?([0-9]+).*/\1/' <<< "$line")
      METRICS_PORT=$(sed -E 's/.*metrics_port="?([0-9]+).*/\1/' <<< "$line")
      echo "  $name: pid ${PIDS[-1]}, grpc 127.0.0.1:$GRPC_PORT, metrics 127.0.0.1:$METRICS_PORT"
      return 0
    fi
    kill -0 "${PIDS[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "retrain_loop: $name did not start; last lines of $LOGS/$name.log:" >&2
  tail -n 20 "$LOGS/$name.log" >&2
  exit 1
}

echo "== serving $MODEL (state $STATE)"
start policy "$BUILD/services/policy/lede-policy" --policy-root "$STATE/policy" --model-config "$MODEL/config.json" \
  --listen 127.0.0.1:0 --metrics 127.0.0.1:0 --reload-interval-ms 200
POLICY=127.0.0.1:$GRPC_PORT POLICY_METRICS=$METRICS_PORT
start model "$BUILD/services/model/lede-model" --role both --model "$MODEL" --slots 4 "${CAL[@]}" \
  --policy "$POLICY" --listen 127.0.0.1:0 --metrics 127.0.0.1:0
MODEL_TARGET=127.0.0.1:$GRPC_PORT
start coordinator "$BUILD/services/coordinator/lede-coordinator" --model "$MODEL" --verifier "$MODEL_TARGET" \
  --drafter "$MODEL_TARGET" --listen 127.0.0.1:0 --metrics 127.0.0.1:0 \
  --experience "$STATE/experience" --experience-shard-age-s 0.5
API=127.0.0.1:$GRPC_PORT
# A second coordinator over the same model process, without experience
# logging, serves the evaluation prompts: they never become training data.
start coordinator-eval "$BUILD/services/coordinator/lede-coordinator" --model "$MODEL" --verifier "$MODEL_TARGET" \
  --drafter "$MODEL_TARGET" --listen 127.0.0.1:0 --metrics 127.0.0.1:0
EVAL_API=127.0.0.1:$GRPC_PORT

# client MODE ARGS: one Python process sends a batch of requests and prints
# one JSON line of totals (acceptance = accepted / drafted over the batch,
# tokens/s = generated tokens / decode time, policy versions seen).
client() {
  local api=$API
  [[ $1 == eval ]] && api=$EVAL_API
  "$PY" - "$api" "$MODEL" "$@" <<'EOF'
import json, os, sys, time
api, model, mode, skip, count, epsilon, new_tokens = sys.argv[1:8]
sys.path.insert(0, "scripts")
import grpc
from lede_client import load_stubs
pb, pb_grpc = load_stubs()
def load(name):
    with open(os.path.join(model, "prompts", name + ".jsonl")) as f:
        return [json.loads(l)["prompt"] for l in f if l.strip()]
story, code = load("story"), load("code")
if mode == "traffic":  # the tuning split: the first 24 prompts of each set
    prompts = story[:24] + code[:24]
    prompts = prompts[int(skip):] + prompts[:int(skip)]
else:  # evaluation: story prompts from line `skip` on
    prompts = story[int(skip):]
stub = pb_grpc.GenerationStub(grpc.insecure_channel(api))
tot = dict(requests=0, drafted=0, accepted=0, generated=0, rounds=0, decode_us=0, versions={})
for i in range(int(count)):
    req = pb.GenerateRequest(request_id="%s-%d-%d" % (mode, os.getpid(), i), prompt=prompts[i % len(prompts)],
                             max_new_tokens=int(new_tokens), seed=i, method=pb.SPECULATION_METHOD_LEDE,
                             speculation=pb.SpeculationParams(epsilon=float(epsilon)))
    summary = None
    for resp in stub.Generate(req, timeout=120):
        if resp.HasField("summary"):
            summary = resp.summary
    tot["requests"] += 1
    tot["drafted"] += summary.drafted_tokens
    tot["accepted"] += summary.accepted_tokens
    tot["generated"] += max(0, summary.generated_tokens - 1)
    tot["rounds"] += summary.rounds
    tot["decode_us"] += summary.decode_time_us
    tot["versions"][summary.policy_version] = tot["versions"].get(summary.policy_version, 0) + 1
tot["acceptance_rate"] = tot["accepted"] / max(1, tot["drafted"])
tot["tokens_per_round"] = tot["generated"] / max(1, tot["rounds"])
tot["tokens_per_s"] = tot["generated"] / max(1e-9, tot["decode_us"] / 1e6)
print(json.dumps(tot))
EOF
}
field() { "$PY" -c 'import json,sys; d=json.loads(sys.argv[1]); v=d[sys.argv[2]]; print(v if not isinstance(v, float) else "%.4f" % v)' "$1" "$2"; }

# Evaluation prompts: story.jsonl from line 24 (the policies' tuning split is
# the first 24 of each set; the retrainer's replay uses lines 40+).
echo "== before: $N_EVAL evaluation prompts, greedy"
client eval 24 "$N_EVAL" 0 "$NEW_TOKENS" > /dev/null  # warm-up (first requests pay for allocation)
BEFORE=$(client eval 24 "$N_EVAL" 0 "$NEW_TOKENS")
echo "  $BEFORE"
V0=$(cat "$STATE/policy/SERVING")

echo "== traffic: $N_EXPLORE requests with epsilon $EPSILON, $N_GREEDY greedy"
T0=$SECONDS
client traffic 0 "$N_EXPLORE" "$EPSILON" "$NEW_TOKENS"
client traffic "$N_EXPLORE" "$N_GREEDY" 0 "$NEW_TOKENS"
# The coordinator publishes a shard at least every 0.5 s: wait until the
# shard count stops changing.
prev=-1
for ((i = 0; i < 60; i++)); do
  n=$(find "$STATE/experience" -name '*.lexp' 2>/dev/null | wc -l)
  [[ $n -gt 0 && $n -eq $prev ]] && break
  prev=$n
  sleep 1
done
echo "  $n experience shards in $STATE/experience (after $((SECONDS - T0)) s)"

echo "== lede-train --once (warm start from $V0, margin $MARGIN)"
"$BUILD/trainer/lede-train" --once --experience "$STATE/experience" --policy-root "$STATE/policy" \
  --model "$MODEL" "${CAL[@]}" --eval-prompts "$MODEL/prompts/story.jsonl" --eval-prompt-skip 40 \
  --eval-prompt-count 8 --eval-new-tokens "$NEW_TOKENS" --eval-threads 1 --publish-margin="$MARGIN" \
  --version-prefix retrain 2>&1 | tee "$LOGS/train.log"
DECISION=$(sed -nE 's/.*event=retrain decision=([a-z_]+).*/\1/p' "$LOGS/train.log")
V1=$(cat "$STATE/policy/SERVING")
REPORT=$(sed -nE 's/.*report=([^ ]+).*/\1/p' "$LOGS/train.log")

if [[ $V1 != "$V0" ]]; then
  echo "== waiting for the drafter to serve $V1"
  for ((i = 0; i < 60; i++)); do
    seen=$(client eval 24 1 0 8)
    grep -q "\"$V1\"" <<< "$seen" && break
    sleep 0.5
  done
  grep -q "\"$V1\"" <<< "$seen" || { echo "retrain_loop: $V1 was not picked up; see $LOGS" >&2; exit 1; }
  curl -fsS "http://127.0.0.1:$POLICY_METRICS/metrics" 2>/dev/null | grep -E '^lede_policy_(version\{|reloads_total)' | sed 's/^/  /' || true
else
  echo "== candidate not published ($DECISION): \"after\" runs the same policy"
fi

echo "== after: the same $N_EVAL evaluation prompts, greedy"
AFTER=$(client eval 24 "$N_EVAL" 0 "$NEW_TOKENS")
echo "  $AFTER"

echo
printf '%-22s %-24s %-24s\n' "" "before ($V0)" "after ($V1)"
for k in acceptance_rate tokens_per_round tokens_per_s drafted accepted generated; do
  printf '%-22s %-24s %-24s\n' "$k" "$(field "$BEFORE" "$k")" "$(field "$AFTER" "$k")"
done
if [[ -n $REPORT && $REPORT != - && -f $REPORT ]]; then
  "$PY" - "$REPORT" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print("\nretrainer: %s %s (%s)" % (r["decision"], r["candidate_version"], r["reason"]))
rp = r.get("replay") or {}
if rp:
    print("replay on %d held-out prompts x %d tokens, cost model %s:" % (rp["prompts"], rp["new_tokens"], rp["cost_model"]))
    for who in ("serving", "candidate"):
        x = rp[who]
        print("  %-9s predicted speed-up %.3f  acceptance %.3f  tokens/round %.2f  tokens/s %.0f" % (
            who, x["predicted_speedup"], x["acceptance_rate"], x["tokens_per_round"], x["tokens_per_s"]))
for who in ("serving", "candidate"):
    o = r["offline"][who]
    print("  offline %-9s held-out td_loss %.4f  agreement %.3f  matched return %s (%d episodes)" % (
        who, o["td_loss"], o["action_agreement"], o["matched_return"], o["matched_episodes"]))
print("behaviour versions: " + ", ".join("%s: %d" % (k, v["transitions"]) for k, v in r["data"]["behaviour_versions"].items()))
print("report: " + sys.argv[1])
EOF
fi
