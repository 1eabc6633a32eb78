// File: shared/checkpoint/widen.h
//
// The function-exact embedding of a Llama checkpoint in a wider shape
// (`lede widen`): the widened model computes the same logits as
// the source (to float rounding) at the cost of the wider shape, so that the
// memory-bound regime can be measured with a model whose behaviour is known.
//
// With source hidden size d, factor K and FFN factor K2 (D = K * d):
//   - the hidden size is zero-padded d -> D: every weight keeps its source
//     values in its top-left block and is zero elsewhere;
//   - attention heads: num_attention_heads and num_key_value_heads both
//     times K (head_dim and the GQA group size kept); the source heads come
//     first, so source query head h still reads source KV head h / group;
//     the new heads have zero q/k/v rows and zero o_proj columns;
//   - intermediate_size times K2 (new FFN units have zero rows and columns);
//   - embedding and LM head get zero columns (the vocabulary is unchanged).
// The residual stream is then zero outside the first d dimensions. For such
// a vector x, mean over D of x^2 = (d/D) * mean over d of x^2, so with every
// RMSNorm weight multiplied by sqrt(d/D) and rms_norm_eps by d/D:
//   x_i * w_i sqrt(d/D) / sqrt((d/D) mean_d(x^2) + eps d/D)
//     = x_i * w_i / sqrt(mean_d(x^2) + eps),
// the source norm's output on the first d dimensions, and zero elsewhere.
// Every later product therefore sees the source activations plus zeros.
//
// Torch-free: reads with SafetensorsFile and writes with WriteSafetensors
// (float32, name order), so the output is byte-identical for the same input.
#ifndef LEDE_SHARED_CHECKPOINT_WIDEN_H_
#define LEDE_SHARED_CHECKPOINT_WIDEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "shared/checkpoint/model_config.h"
#include "shared/status/status.h"

namespace lede::checkpoint {

struct WidenOptions {
  int64_t factor = 2;      // K: hidden size and head counts times K (>= 1)
  int64_t ffn_factor = 0;  // K2: intermediate_size times K2 (0: K)
  bool overwrite = false;  // replace an existing checkpoint in the output directory
};

struct WidenResult {
  ModelConfig source;
  ModelConfig widened;
  int64_t source_parameters = 0;
  int64_t widened_parameters = 0;
  std::vector<std::string> copied_files;  // tokenizer / generation files, by name
  std::vector<std::string> removed_files;  // stale files of an earlier run in out_dir
  std::vector<std::string> installed_policies;  // shipped policy versions copied to out_dir/policy
};

// Widens the Hugging Face Llama checkpoint directory `source_dir` (config.json
// + model.safetensors) into `out_dir` (created): config.json (the source's
// fields with the widened sizes, rms_norm_eps * d/D, torch_dtype float32 and
// a "lede_widen" record of the source shape and factors), model.safetensors
// (float32), and the source's tokenizer and generation files copied byte for
// byte (tokenizer*.json, tokenizer.model, *.model, tok*.bin,
// special_tokens_map.json, added_tokens.json, generation_config.json,
// chat_template.*). Nothing else is copied: a cost model or a policy of the
// source does not fit the new shape; a calibration-cpu.json already in
// out_dir (an earlier run's `lede widen --calibrate`) is kept when its
// model_fingerprint is the widened shape's and removed otherwise.
//
// Refuses (kInvalidArgument, naming the field or tensor) a source it cannot
// embed exactly: "architectures" other than LlamaForCausalLM, "model_type"
// other than llama, "attention_bias" / "mlp_bias" true, a
// "quantization_config", "head_dim" other than hidden_size /
// num_attention_heads, an odd head_dim or heads not in GQA groups (the
// config's own validation), a bias or other tensor the config does not name,
// a tensor of the wrong shape, a sharded (model.safetensors.index.json) or
// llama2.c source. Also kInvalidArgument for a factor < 1, and
// kAlreadyExists when out_dir holds a config.json and !overwrite.
// Policies trained for the widened shape ship with the source: when
// source_dir/widened/<the widened ArchitectureFingerprint>/policy exists,
// its files (policy versions and SERVING) are copied byte for byte into
// out_dir/policy, so the output serves LEDE without training. The
// fingerprint covers every widened size (factor and ffn factor), so a shape
// gets only its own policies.
// kNotFound for a missing source; kInternal on I/O errors.
StatusOr<WidenResult> WidenCheckpoint(const std::string& source_dir, const std::string& out_dir,
                                      const WidenOptions& options);

}  // namespace lede::checkpoint

#endif  // LEDE_SHARED_CHECKPOINT_WIDEN_H_
