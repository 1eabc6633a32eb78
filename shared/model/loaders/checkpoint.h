// File: shared/model/loaders/checkpoint.h
//
// Loading and writing Llama checkpoints in two layouts (docs/design.md §5):
//  - Hugging Face: a directory with config.json and model.safetensors, or
//    shards listed in model.safetensors.index.json; F32/F16/BF16 tensors.
//  - llama2.c "version 0" .bin (the models in testdata/models; layout in
//    testdata/models/README.md).
// Tensors come back under Hugging Face names, in [out, in] orientation:
//   model.embed_tokens.weight                     [V, d]
//   model.layers.{i}.input_layernorm.weight       [d]
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight
//        q [H*hd, d], k/v [Hkv*hd, d], o [d, H*hd]
//   model.layers.{i}.post_attention_layernorm.weight [d]
//   model.layers.{i}.mlp.{gate,up}_proj.weight    [hidden, d]  (w1, w3)
//   model.layers.{i}.mlp.down_proj.weight         [d, hidden]  (w2)
//   model.norm.weight                             [d]
//   lm_head.weight                                [V, d] (absent when tied)
// All tensors are float32 on the CPU (unless CheckpointReadOptions::
// keep_half_precision). F32 safetensors data is mapped, not copied (the
// tensors keep the read-only mapping alive); F16/BF16 are converted. Never
// write into a loaded tensor.
#ifndef LEDE_SHARED_MODEL_LOADERS_CHECKPOINT_H_
#define LEDE_SHARED_MODEL_LOADERS_CHECKPOINT_H_

#include <map>
#include <string>

#include <ATen/core/Tensor.h>

#include "shared/checkpoint/gguf.h"
#include "shared/checkpoint/model_config.h"
#include "shared/model/loaders/weight_format.h"
#include "shared/status/status.h"

namespace lede::model::loaders {

struct Checkpoint {
  checkpoint::ModelConfig config;
  std::map<std::string, at::Tensor> tensors;  // HF names, float32, CPU
  std::string source;                        // path it was read from

  // GGUF checkpoints only (empty otherwise): each weight's bytes as the file
  // stores them, by HF name: type (F32, F16, BF16, Q8_0: the raw 34-byte
  // blocks, usable by a Q8_0 kernel as they are), ggml dims and a pointer
  // into `gguf`'s read-only mapping, which lives as long as this
  // Checkpoint's copy of `gguf` does. Rows are in the file's order: q/k
  // rows in llama.cpp's adjacent-pair order (config.rope_style ==
  // kAdjacentPairs), the same order as `tensors`. A GGUF's Q8_0 matrices
  // also fill q8_0_blocks and its matrices' type sets `storage` (below).
  std::shared_ptr<const checkpoint::GgufFile> gguf;
  std::map<std::string, const checkpoint::GgufTensor*> stored;

  // How the file stores the matrices, which ModelOptions::weights = kAuto
  // keeps (weight_format.h): kBf16 when every projection and the LM head
  // (or the tied embedding) are BF16 in the file, kQ8_0 when a reader hands
  // in q8_0_blocks for all of them, else kF32 (F16 too: bf16 would round it).
  WeightFormat storage = WeightFormat::kF32;
  // Matrices stored as Q8_0 in the file (a GGUF reader hands them in as
  // they are): HF name -> uint8 CPU tensor [rows, in / 32 * 34], each row
  // in / 32 llama.cpp blocks (cpu::BlockQ8_0: float16 scale, 32 int8).
  // `tensors` must still hold each one's dequantized float32 values
  // (cpu::DequantizeRowsQ8_0), the eager reference's weights. A model that
  // stores q8_0 packs these blocks as they are (no re-quantization).
  std::map<std::string, at::Tensor> q8_0_blocks;
};

// How LoadCheckpoint hands over the tensors.
struct CheckpointReadOptions {
  // Safetensors F16 / BF16 tensors stay in their file dtype, wrapped in
  // place in the read-only mapping (zero copy, like F32) instead of being
  // converted to float32 at load (a 2-byte tensor at an odd address is
  // copied, still in its dtype). LlamaModel::Load sets it: it converts each
  // matrix straight into its packed storage, so a bf16 checkpoint never
  // exists as float32 in memory. Other formats are unaffected.
  bool keep_half_precision = false;
};

// Reads a checkpoint from `path`:
//  - a .gguf file: LoadGgufCheckpoint;
//  - a directory with config.json: Hugging Face layout;
//  - a .bin file, or a directory holding exactly one llama2.c model .bin
//    (tokenizer files tok*.bin are skipped): llama2.c layout.
// The result is validated: every tensor the config needs is present with the
// expected shape. In the Hugging Face layout, generation_config.json's
// bos_token_id / eos_token_id (an integer or a list) replace config.json's
// when the file exists (tokenizer/hf_config.h).
// Model files are untrusted: every count and dimension is checked before
// anything is sized by it (model_limits.h; a Hugging Face config is checked
// against the safetensors headers' shapes, layer count first, before any
// tensor is converted; its JSON files are refused above 1 MiB, an index
// above 64 MiB).
// Errors (messages name the file and the fault): kNotFound for a missing
// path; kInvalidArgument for a truncated file, a bad generation_config.json
// id, a config.json key out of its bound or a layer count the weight files
// do not hold, a safetensors header length
// past the end, bad JSON, an unknown dtype, data offsets out of range or
// overlapping, a missing tensor (named), or a shape that disagrees with the
// config.
StatusOr<Checkpoint> LoadCheckpoint(const std::string& path,
                                    const CheckpointReadOptions& read = CheckpointReadOptions());
StatusOr<Checkpoint> LoadHfCheckpoint(const std::string& dir,
                                      const CheckpointReadOptions& read = CheckpointReadOptions());
StatusOr<Checkpoint> LoadLlama2cCheckpoint(const std::string& file);

// A llama-architecture GGUF file (shared/checkpoint/gguf.h): config from its
// llama.* metadata (GgufLlamaConfig), tensors under HF names as float32 (F32
// wrapped in place; F16, BF16 and Q8_0 dequantized; Checkpoint::stored
// keeps the stored bytes), q/k rows in llama.cpp's adjacent-pair order
// (config.rope_style = kAdjacentPairs; LlamaModel permutes them at load).
// Errors: those of GgufFile::Open and GgufLlamaConfig (kInvalidArgument
// naming the key or tensor).
StatusOr<Checkpoint> LoadGgufCheckpoint(const std::string& file);

// Writes a llama GGUF v3 file the way llama.cpp's converter lays it out:
// the llama.* keys of `config`, then the tensors under GGUF names with q/k
// rows in adjacent-pair order (permuted here when config.rope_style is
// kRotateHalf), matrices stored as `weights` (F32, F16, BF16 or Q8_0; a
// matrix whose row length is not a multiple of 32 stays F32 under Q8_0),
// norms as F32. `writer` may already hold other metadata (the tokenizer's,
// tokenizer/gguf_tokenizer.h); it is consumed. Atomic (temporary + rename).
// Errors: kInvalidArgument for a config GGUF cannot express (Llama-3 RoPE
// scaling) or tensors that disagree with it; kInternal on I/O.
Status WriteGgufCheckpoint(const std::string& file, const checkpoint::ModelConfig& config,
                           const std::map<std::string, at::Tensor>& tensors, checkpoint::GgmlType weights,
                           checkpoint::GgufWriter* writer);
// The same with llama.cpp's tensor mix of `mix` (kQ4_0 or kQ4_K_M;
// LlamaCppTensorType in weight_format.h picks each matrix's type, norms
// stay F32). Errors: kInvalidArgument for another format; as above.
Status WriteGgufCheckpoint(const std::string& file, const checkpoint::ModelConfig& config,
                           const std::map<std::string, at::Tensor>& tensors, WeightFormat mix,
                           checkpoint::GgufWriter* writer);

// Parses one .safetensors file into name -> tensor (float32 CPU, or the
// file's F16 / BF16 with read.keep_half_precision).
// Errors as for LoadCheckpoint.
StatusOr<std::map<std::string, at::Tensor>> ReadSafetensors(
    const std::string& file, const CheckpointReadOptions& read = CheckpointReadOptions());

// Writes tensors (any float dtype is stored as F32 unless `dtype_name` is
// "F16" or "BF16") as one .safetensors file, atomically (write + rename).
// Errors: kInvalidArgument for an unsupported dtype_name; kInternal on I/O.
Status WriteSafetensors(const std::string& file,
                        const std::map<std::string, at::Tensor>& tensors,
                        const std::string& dtype_name = "F32");

// Writes config.json + model.safetensors under `dir` (created if needed).
// The tensors must use the kRotateHalf convention (config.rope_style is
// written as Hugging Face expects, i.e. rotate-half).
Status WriteHfCheckpoint(const std::string& dir, const checkpoint::ModelConfig& config,
                         const std::map<std::string, at::Tensor>& tensors);

// Writes a llama2.c version-0 .bin. Tensors under HF names in the
// kAdjacentPairs convention (as llama2.c stores wq/wk). Untied heads are
// written as the llama2.c "negative vocab_size" variant, followed by the
// classifier after the legacy RoPE tables.
Status WriteLlama2cCheckpoint(const std::string& file,
                              const checkpoint::ModelConfig& config,
                              const std::map<std::string, at::Tensor>& tensors);

// Converts wq/wk rows of a [n_heads*head_dim, d] projection between the two
// RoPE conventions: to_rotate_half = true maps adjacent-pair rows (2i, 2i+1)
// to rotate-half rows (i, i + head_dim/2) within each head; false inverts it.
at::Tensor PermuteRopeRows(const at::Tensor& w, int64_t n_heads,
                           bool to_rotate_half);

}  // namespace lede::model::loaders

#endif  // LEDE_SHARED_MODEL_LOADERS_CHECKPOINT_H_
