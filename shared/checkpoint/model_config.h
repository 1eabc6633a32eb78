// File: shared/checkpoint/model_config.h
//
// ModelConfig: the hyper-parameters of a Llama-architecture decoder, read from
// a Hugging Face config.json or a llama2.c checkpoint header. Torch-free.
#ifndef LEDE_SHARED_CHECKPOINT_MODEL_CONFIG_H_
#define LEDE_SHARED_CHECKPOINT_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "shared/status/status.h"

namespace lede::model {

// How RoPE pairs the dimensions of a head.
//   kRotateHalf:    dimension i pairs with i + head_dim/2 (Hugging Face Llama).
//   kAdjacentPairs: dimension 2i pairs with 2i+1 (Meta / llama2.c).
// The engine computes with kRotateHalf; checkpoints that use kAdjacentPairs
// have their wq/wk rows permuted at load (same logits, one kernel).
enum class RopeStyle { kRotateHalf, kAdjacentPairs };

// rope_scaling of config.json. kLlama3 is Llama-3.1's frequency-dependent
// scaling (factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings); kLinear divides positions by factor.
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  int64_t dim = 0;          // hidden_size d
  int64_t hidden_dim = 0;   // intermediate_size of the SwiGLU FFN
  int64_t n_layers = 0;     // L, num_hidden_layers
  int64_t n_heads = 0;      // query heads H
  int64_t n_kv_heads = 0;   // key/value heads (GQA); divides n_heads
  int64_t vocab_size = 0;   // V
  int64_t max_seq_len = 0;  // context window in tokens (max_position_embeddings)
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  RopeStyle rope_style = RopeStyle::kRotateHalf;  // of the checkpoint's wq/wk
  bool tie_word_embeddings = false;  // LM head shares the token embedding
  int32_t bos_id = 1;
  std::vector<int32_t> eos_ids = {2};

  int64_t head_dim() const { return n_heads > 0 ? dim / n_heads : 0; }
  int64_t kv_dim() const { return head_dim() * n_kv_heads; }

  // kInvalidArgument naming the first field that is non-positive, above
  // its bound (model_limits.h: kMaxContextTokens, kMaxModelDim, kMaxLayers,
  // kMaxVocabSize) or inconsistent (dim % n_heads, n_heads % n_kv_heads,
  // odd head_dim).
  Status Validate() const;

  // A short stable hash of the architecture fields (hex), used to refuse a
  // KV pool or policy artifact built for another model.
  std::string ArchitectureFingerprint() const;
};

// Parses a Hugging Face Llama config.json. `source` names the file in errors.
// Errors: kInvalidArgument for bad JSON, a missing or mistyped required field
// (named), a count or dimension outside its bound (model_limits.h; named by
// its config.json key, e.g. max_position_embeddings above 2^24), or an
// unknown rope_scaling type. Nothing is allocated by the values read.
StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text,
                                    const std::string& source);

// Serializes to Hugging Face config.json text (LlamaForCausalLM).
std::string ToHfConfigJson(const ModelConfig& config);

}  // namespace lede::model

#endif  // LEDE_SHARED_CHECKPOINT_MODEL_CONFIG_H_
