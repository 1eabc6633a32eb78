// File: shared/model/weight_format.h
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
//
// Every matrix takes the format: the QKV, O, gate/up and down projections
// and the LM head (hence every exit probe). Norm weights stay float32, and
// so does an untied token embedding (a row lookup, not a product).
#ifndef LEDE_SHARED_MODEL_WEIGHT_FORMAT_H_
#define LEDE_SHARED_MODEL_WEIGHT_FORMAT_H_

#include <string>

#include "shared/status/status.h"

namespace lede::model {

enum class WeightFormat { kAuto, kF32, kBf16, kQ8_0 };

// "auto" / "f32" / "bf16" / "q8_0" <-> WeightFormat. Errors:
// kInvalidArgument naming the value.
StatusOr<WeightFormat> ParseWeightFormat(const std::string& name);
const char* WeightFormatName(WeightFormat format);

// Bytes per weight of a stored matrix (4, 2, 34 / 32; 0 for kAuto).
double WeightFormatBytes(WeightFormat format);

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_WEIGHT_FORMAT_H_
