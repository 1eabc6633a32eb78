#!/usr/bin/env bash
# Full-size smoke test: a random-weight Llama-3.2-1B-shaped bf16 checkpoint
# with the real Llama-3 tokenizer (scripts/make_llama32_1b_smoke.py, written
# once into $LEDE_SMOKE_DIR, default build/smoke/llama32-1b; never
# committed), then the engine loads it, generates autoregressively and with
# static self-speculation (which must emit the same text: lossless), and
# `lede calibrate` measures it. Prints load time, peak RSS and tokens/s.
# About 2.5 GB on disk; loads as bf16 (--weights auto: every matrix packed
# straight from the file's bf16, no float32 copy) in about 2.7 GiB
# of peak RSS for `lede generate`, 2.8 GiB for `lede calibrate` (measured
# 2026-12-04; LEDE_SMOKE_WEIGHTS=f32 for the float32 path, which holds the
# f32 tensors and a packed f32 copy: about 4x that, not measured here); a
# few minutes on 2 cores. Not part of the default ctest run
# (configure with -DLEDE_SMOKE_TESTS=ON for a `smoke`-labelled test).
# The same checkpoint through the services (scripts/run with its defaults:
# start with the cold start, KV budget, concurrent long prompts, prefill
# against `lede generate`) is bench/big_model_serving.py.
#
#   scripts/smoke_llama32_1b.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-${LEDE_BUILD_DIR:-build}}"
lede="$build/services/cli/lede"
dir="${LEDE_SMOKE_DIR:-$build/smoke/llama32-1b}"
threads="${LEDE_SMOKE_THREADS:-2}"
new_tokens="${LEDE_SMOKE_TOKENS:-16}"
weights="${LEDE_SMOKE_WEIGHTS:-auto}"
[[ -x "$lede" ]] || { echo "smoke: $lede not built" >&2; exit 1; }
if [[ ! -f "$dir/config.json" ]]; then
  /usr/bin/python3 scripts/make_llama32_1b_smoke.py "$dir"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prompt="The capital of France is"

echo "== tokenize (Llama-3 tokenizer.json, chat template)"
"$lede" tokenize --model "$dir" "$prompt"
"$lede" tokenize --model "$dir" --chat --system "Be brief." "$prompt"

run() {  # name, extra generate flags...
  local name=$1
  shift
  /usr/bin/time -v "$lede" generate --model "$dir" --chat --system "Be brief." --prompt "$prompt" \
    --max-new-tokens "$new_tokens" \
    --threads "$threads" --weights "$weights" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local rss wall stats
  rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.2f", $2 / 1048576}' "$tmp/$name.err")
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$tmp/$name.err")
  stats=$(grep '^\[' "$tmp/$name.err" | grep -v '^\[load\]' | tail -1)
  echo "$name: peak RSS ${rss} GiB, process wall $wall, $(grep '^\[load\]' "$tmp/$name.err" | sed "s/.* in /load (weights $weights) /")"
  echo "  $stats"
}
echo "== generate"
run ar --mode ar
run static --mode static --exit-layer 4 --draft-len 4
run static12 --mode static --exit-layer 12 --draft-len 3
for s in static static12; do
  if cmp -s "$tmp/ar.out" "$tmp/$s.out"; then
    echo "lossless ($s vs ar): yes"
  else
    echo "lossless ($s vs ar): NO"
    diff "$tmp/ar.out" "$tmp/$s.out" || true
    exit 1
  fi
done
echo "text: $(head -c 300 "$tmp/ar.out")"

echo "== calibrate --repeats 3"
/usr/bin/time -v "$lede" calibrate --model "$dir" --repeats 3 --round-passes 0 --threads "$threads" --weights "$weights" --out "$tmp/calibration.json" \
  2>"$tmp/cal.err"
grep -E '^step|^wrote' "$tmp/cal.err" || true
awk -F': ' '/Maximum resident set size/ {printf "calibrate: peak RSS %.2f GiB\n", $2 / 1048576}
            /Elapsed \(wall clock\)/ {print "calibrate: process wall " $2}' "$tmp/cal.err"
/usr/bin/python3 - "$tmp/calibration.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
print("LM head, measured: %.2f layer-equivalents at T=1 (head_us[0] / block_us[0]); "
      "weights ratio V*d/block = 4.32" % (c["head_us"][0] / c["block_us"][0]))
PY
