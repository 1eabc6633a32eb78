// File: shared/model/loaders/weight_format.h
//
// How the fused CPU path stores the weight matrices (the --weights
// flag of every command and service that loads a model). Torch-free.
//
//   kAuto  the checkpoint's own storage (Checkpoint::storage): a BF16
//          safetensors checkpoint stays bf16, a Q8_0 GGUF stays q8_0, F32
//          (and F16, which bf16 would round) stays f32
//   kF32   float32 (the packed layout of cpu::PackRows)
//   kBf16  bfloat16, rounded to nearest even at load (cpu::PackRowsBf16)
//   kQ8_0  llama.cpp's Q8_0: blocks of 32 int8 values along the input
//          dimension with one float16 scale each (cpu::QuantizeRowsQ8_0)
//   kQ4_0  llama.cpp's Q4_0 mix (LlamaCppTensorType): Q4_0 blocks, the LM
//          head Q6_K; quantized at load (a GGUF's own blocks kept as they are)
//   kQ4_K_M  llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for the LM head and
//          for attn_v / ffn_down of the layers llama.cpp gives more bits
//          (Q5_0 / Q8_0 for rows not a multiple of 256); quantized at load
//          (a GGUF's own blocks kept as they are)
//   kGguf  a GGUF file's own ggml block types as they are (Q4_0, Q5_0,
//          Q8_0, Q4_K, Q5_K, Q6_K, mixed per tensor): what --weights auto
//          keeps for a file whose matrices are not all F32 / BF16 / Q8_0;
//          a matrix the file stores unquantized takes the Q4_K_M mix
//          (cpu_ggml_kernels.h multiplies all three)
//
// Every matrix takes the format: the QKV, O, gate/up and down projections
// and the LM head (hence every exit probe). Norm weights stay float32, and
// so does an untied token embedding (a row lookup, not a product).
#ifndef LEDE_SHARED_MODEL_LOADERS_WEIGHT_FORMAT_H_
#define LEDE_SHARED_MODEL_LOADERS_WEIGHT_FORMAT_H_

#include <cstdint>
#include <string>

#include "shared/checkpoint/ggml_quants.h"
#include "shared/status/status.h"

namespace lede::model::loaders {

enum class WeightFormat { kAuto, kF32, kBf16, kQ8_0, kQ4_0, kQ4_K_M, kGguf };

// "auto" / "f32" / "bf16" / "q8_0" / "q4_0" / "q4_k_m" / "gguf" <->
// WeightFormat. Errors: kInvalidArgument naming the value.
StatusOr<WeightFormat> ParseWeightFormat(const std::string& name);
const char* WeightFormatName(WeightFormat format);

// Bytes per weight of a stored matrix (4, 2, 34 / 32, 18 / 32, 144 / 256
// (Q4_K; the mix's Q6_K tensors add a little), 144 / 256 for kGguf as an
// estimate; 0 for kAuto).
double WeightFormatBytes(WeightFormat format);

// Whether matrices in `format` are kept in ggml blocks (cpu::GgmlMatrix):
// kQ4_0, kQ4_K_M, kGguf.
bool IsGgmlWeightFormat(WeightFormat format);

// Which matrix of a Llama model a tensor is (the roles llama.cpp's
// quantizer tells apart).
enum class TensorRole { kAttnQ, kAttnK, kAttnV, kAttnO, kFfnGate, kFfnUp, kFfnDown, kOutput, kTokenEmbd };

// The ggml type llama.cpp's quantizer (llama_tensor_get_type) gives a
// tensor of `role` in layer `layer` of `n_layers` with rows of `row_len`
// values, under `format` (kQ4_0; kQ4_K_M, also for kGguf):
//  - the LM head (kOutput, or a tied embedding): Q6_K (Q8_0 when row_len
//    is not a multiple of 256);
//  - kQ4_0: Q4_0 for the rest;
//  - kQ4_K_M: Q6_K for attn_v and ffn_down of the layers where
//    i < n/8, i >= 7n/8 or (i - n/8) % 3 == 2, Q4_K for the rest; a K type
//    whose rows are not a multiple of 256 falls back as llama.cpp's does
//    (Q4_K -> Q5_0, Q6_K -> Q8_0).
// kF32 when row_len is not a multiple of 32 or `format` is not a ggml one.
checkpoint::GgmlType LlamaCppTensorType(WeightFormat format, TensorRole role, int64_t layer, int64_t n_layers,
                                        int64_t row_len);

}  // namespace lede::model::loaders

#endif  // LEDE_SHARED_MODEL_LOADERS_WEIGHT_FORMAT_H_
