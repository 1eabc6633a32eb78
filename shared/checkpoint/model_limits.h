// File: shared/checkpoint/model_limits.h
//
// Upper bounds on what a checkpoint may declare (config.json, a GGUF
// file's llama.* keys, a llama2.c header), checked before anything is
// sized by these numbers: model files are untrusted input (docs/design.md
// §5). Real models sit far below each bound. Torch-free.
#ifndef LEDE_SHARED_CHECKPOINT_MODEL_LIMITS_H_
#define LEDE_SHARED_CHECKPOINT_MODEL_LIMITS_H_

#include <cstdint>

namespace lede::model {

// Context window in tokens (max_position_embeddings, llama.context_length):
// 2^24 = 16,777,216. Past it float32 cannot hold every position exactly,
// so RoPE angles (position * frequency) would repeat; the largest published
// windows are about 10M tokens.
inline constexpr int64_t kMaxContextTokens = int64_t{1} << 24;

// hidden_size, intermediate_size and the head counts: 2^20, so that the
// product of any two stays far inside int64.
inline constexpr int64_t kMaxModelDim = int64_t{1} << 20;

// num_hidden_layers: 2^16. The loaders also refuse a count the weight files
// do not hold (9 tensors per layer) before sizing anything by it.
inline constexpr int64_t kMaxLayers = int64_t{1} << 16;

// vocab_size: 2^31 - 1 (token ids are int32).
inline constexpr int64_t kMaxVocabSize = (int64_t{1} << 31) - 1;

}  // namespace lede::model

#endif  // LEDE_SHARED_CHECKPOINT_MODEL_LIMITS_H_
