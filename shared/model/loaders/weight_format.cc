#include "shared/model/loaders/weight_format.h"

namespace lede::model::loaders {

StatusOr<WeightFormat> ParseWeightFormat(const std::string& name) {
  if (name == "auto") return WeightFormat::kAuto;
  if (name == "f32") return WeightFormat::kF32;
  if (name == "bf16") return WeightFormat::kBf16;
  if (name == "q8_0") return WeightFormat::kQ8_0;
  if (name == "q4_0") return WeightFormat::kQ4_0;
  if (name == "q4_k_m") return WeightFormat::kQ4_K_M;
  if (name == "gguf") return WeightFormat::kGguf;
  return InvalidArgumentError("weights: unknown weight format '" + name +
                              "' (auto, f32, bf16, q8_0, q4_0, q4_k_m or gguf)");
}

const char* WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kAuto: return "auto";
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kBf16: return "bf16";
    case WeightFormat::kQ8_0: return "q8_0";
    case WeightFormat::kQ4_0: return "q4_0";
    case WeightFormat::kQ4_K_M: return "q4_k_m";
    case WeightFormat::kGguf: return "gguf";
  }
  return "?";
}

double WeightFormatBytes(WeightFormat format) {
  switch (format) {
    case WeightFormat::kAuto: return 0.0;
    case WeightFormat::kF32: return 4.0;
    case WeightFormat::kBf16: return 2.0;
    case WeightFormat::kQ8_0: return 34.0 / 32.0;
    case WeightFormat::kQ4_0: return 18.0 / 32.0;
    case WeightFormat::kQ4_K_M: case WeightFormat::kGguf: return 144.0 / 256.0;
  }
  return 0.0;
}

bool IsGgmlWeightFormat(WeightFormat format) {
  return format == WeightFormat::kQ4_0 || format == WeightFormat::kQ4_K_M || format == WeightFormat::kGguf;
}

checkpoint::GgmlType LlamaCppTensorType(WeightFormat format, TensorRole role, int64_t layer, int64_t n_layers,
                                        int64_t row_len) {
  using checkpoint::GgmlType;
  if (!IsGgmlWeightFormat(format) || row_len % 32 != 0) return GgmlType::kF32;
  const bool whole_k = row_len % 256 == 0;
  if (role == TensorRole::kOutput) return whole_k ? GgmlType::kQ6_K : GgmlType::kQ8_0;
  if (format == WeightFormat::kQ4_0) return GgmlType::kQ4_0;
  // llama.cpp's use_more_bits: the first and last eighth of the layers and
  // every third one between.
  const bool more_bits =
      layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
  const bool six = (role == TensorRole::kAttnV || role == TensorRole::kFfnDown) && more_bits;
  if (six) return whole_k ? GgmlType::kQ6_K : GgmlType::kQ8_0;
  return whole_k ? GgmlType::kQ4_K : GgmlType::kQ5_0;
}

}  // namespace lede::model::loaders
