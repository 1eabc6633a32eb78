#!/usr/bin/env bash
# Reproduces models/lede-tiny from scratch in two stages (each resumable: rerun
# the same command after an interruption).
#   stage 1: corpus (with 320 synthetic stories), SentencePiece tokenizer,
#            LayerSkip-style pretraining from a random init -> out/lede-tiny-stage1
#   stage 2: continued pretraining of stage 1 on a story-heavy mixture with
#            9000 more synthetic stories (training split only, so the held-out
#            split is stage 1's), shallow exits trained at every step -> models/lede-tiny
# usage: scripts/train_lede_tiny.sh [STEPS1] [THREADS1] [STEPS2] [THREADS2]
#        (lede-tiny: 1200 steps on 1 thread, then 2100 steps on 2 threads)
# Needs a build (scripts/build); the source texts are in testdata/corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS1=${1:-1200}
THREADS1=${2:-1}
STEPS2=${3:-2100}
THREADS2=${4:-2}
OUT=${LEDE_TINY_OUT:-models/lede-tiny}
WORK=out
STAGE1=$WORK/lede-tiny-stage1
mkdir -p "$WORK/corpus" "$WORK/tokenizer" "$WORK/stage2"
# 1. Synthetic stories from stories260K (skipped when already sampled).
if [[ ! -f "$WORK/corpus/synthetic_stories.txt" ]]; then
  scripts/sample_synthetic_stories.sh "$WORK/corpus/synthetic_stories.txt" 320 0 400
fi
# 2. Corpus with held-out splits and a manifest of what went in.
python3 scripts/build_corpus.py --out "$WORK/corpus"
# 3. SentencePiece BPE tokenizer, 2048 pieces with byte fallback; identity
#    normalization keeps newlines (as bytes) and indentation for code.
if [[ ! -f "$WORK/tokenizer/tokenizer.model" ]]; then
  spm_train --input="$WORK/corpus/spm_input.txt" --model_prefix="$WORK/tokenizer/tokenizer" \
    --vocab_size=2048 --model_type=bpe --character_coverage=1.0 --byte_fallback=true \
    --normalization_rule_name=identity --remove_extra_whitespaces=false \
    --allow_whitespace_only_pieces=true --split_digits=true --max_sentence_length=8192 \
    --input_sentence_size=400000 --shuffle_input_sentence=true --num_threads=1 \
    --bos_id=1 --eos_id=2 --unk_id=0 --pad_id=-1 --random_seed=1 > "$WORK/tokenizer/train.log" 2>&1
fi
# 4. Stage 1: 12 layers, d=192, GQA 6/2 heads, LayerSkip recipe.
build/trainer/lede-pretrain --data "$WORK/corpus" --tokenizer "$WORK/tokenizer/tokenizer.model" \
  --out "$STAGE1" --checkpoint-dir "$WORK/lede-tiny.ckpt" --steps "$STEPS1" --threads "$THREADS1" \
  --layers 12 --dim 192 --hidden-dim 512 --heads 6 --kv-heads 2 --max-seq-len 512 \
  --batch-size 16 --seq-len 256 --lr 2e-3 --warmup-steps 100 --layer-dropout 0.1 \
  --exit-scale 1.0 --curriculum-period 3 --checkpoint-every 100 --seed 1
# 5. Stage 2 data: 6000 + 3000 more synthetic stories (300 new tokens each), added
#    to the stories training split only.
[[ -f "$WORK/stage2/synthetic_stories_extra1.txt" ]] ||
  scripts/sample_synthetic_stories.sh "$WORK/stage2/synthetic_stories_extra1.txt" 6000 5000000 300
[[ -f "$WORK/stage2/synthetic_stories_extra2.txt" ]] ||
  scripts/sample_synthetic_stories.sh "$WORK/stage2/synthetic_stories_extra2.txt" 3000 20000000 300
python3 scripts/build_corpus.py --out "$WORK/corpus-stage2" --synthetic "$WORK/corpus/synthetic_stories.txt" \
  --extra-train-stories "$WORK/stage2/synthetic_stories_extra1.txt" \
  --extra-train-stories "$WORK/stage2/synthetic_stories_extra2.txt"
# 6. Stage 2: continued pretraining, story-heavy, exits 1-4 trained at every step.
build/trainer/lede-pretrain --data "$WORK/corpus-stage2" --tokenizer "$WORK/tokenizer/tokenizer.model" \
  --init-from "$STAGE1" --out "$OUT" --checkpoint-dir "$WORK/lede-tiny-stage2.ckpt" --steps "$STEPS2" \
  --threads "$THREADS2" --batch-size 16 --seq-len 256 --lr 1e-3 --warmup-steps 50 --layer-dropout 0.1 \
  --mixture stories=0.8,code=0.12,tales=0.04,drama=0.04 --exit-scale 2.0 --exit-always 4 \
  --curriculum-period 3 --checkpoint-every 100 --seed 2
cp "$WORK/corpus-stage2/manifest.json" "$OUT/data_manifest.json"
cp "$STAGE1/report.json" "$OUT/report_stage1.json"
# 7. Held-out prompt sets for the benchmarks (story openings, code heads).
python3 scripts/make_prompt_sets.py "$WORK/corpus" "$OUT/prompts" 48
