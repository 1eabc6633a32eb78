#!/usr/bin/env bash
# Reproduces models/lede-tiny from scratch: corpus, tokenizer, LayerSkip-style
# pretraining (resumable: rerun the same command after an interruption).
# usage: scripts/train_lede_tiny.sh [STEPS] [THREADS]   (lede-tiny: 1200 steps, 1 thread)
# Needs a build (scripts/build) and ../shared beside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-1200}
THREADS=${2:-1}
OUT=${LEDE_TINY_OUT:-models/lede-tiny}
WORK=out
mkdir -p "$WORK/corpus" "$WORK/tokenizer"
# 1. Synthetic stories from stories260K (skipped when already sampled).
if [[ ! -f "$WORK/corpus/synthetic_stories.txt" ]]; then
  scripts/sample_synthetic_stories.sh "$WORK/corpus" "${LEDE_SYNTHETIC_STORIES:-320}"
fi
# 2. Corpus with held-out splits and a manifest of what went in.
python3 scripts/build_corpus.py --out "$WORK/corpus"
# 3. SentencePiece BPE tokenizer, 2048 pieces with byte fallback; identity
#    normalization keeps newlines (as bytes) and indentation for code.
spm_train --input="$WORK/corpus/spm_input.txt" --model_prefix="$WORK/tokenizer/tokenizer" \
  --vocab_size=2048 --model_type=bpe --character_coverage=1.0 --byte_fallback=true \
  --normalization_rule_name=identity --remove_extra_whitespaces=false \
  --allow_whitespace_only_pieces=true --split_digits=true --max_sentence_length=8192 \
  --input_sentence_size=400000 --shuffle_input_sentence=true --num_threads=1 \
  --bos_id=1 --eos_id=2 --unk_id=0 --pad_id=-1 --random_seed=1 > "$WORK/tokenizer/train.log" 2>&1
# 4. Pretraining: 12 layers, d=192, GQA 6/2 heads, LayerSkip recipe.
build/trainer/lede-pretrain --data "$WORK/corpus" --tokenizer "$WORK/tokenizer/tokenizer.model" \
  --out "$OUT" --checkpoint-dir "$WORK/lede-tiny.ckpt" --steps "$STEPS" --threads "$THREADS" \
  --layers 12 --dim 192 --hidden-dim 512 --heads 6 --kv-heads 2 --max-seq-len 512 \
  --batch-size 16 --seq-len 256 --lr 2e-3 --warmup-steps 100 --layer-dropout 0.1 \
  --exit-scale 1.0 --curriculum-period 3 --checkpoint-every 100 --seed 1
cp "$WORK/corpus/manifest.json" "$OUT/data_manifest.json"
# 5. Held-out prompt sets for the benchmarks (story openings, code heads).
python3 scripts/make_prompt_sets.py "$WORK/corpus" "$OUT/prompts" 48
