#include "shared/model/weight_format.h"

namespace lede::model {

StatusOr<WeightFormat> ParseWeightFormat(const std::string& name) {
  if (name == "auto") return WeightFormat::kAuto;
  if (name == "f32") return WeightFormat::kF32;
  if (name == "bf16") return WeightFormat::kBf16;
  if (name == "q8_0") return WeightFormat::kQ8_0;
  return InvalidArgumentError("weights: unknown weight format '" + name + "' (auto, f32, bf16 or q8_0)");
}

const char* WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kAuto: return "auto";
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kBf16: return "bf16";
    case WeightFormat::kQ8_0: return "q8_0";
  }
  return "?";
}

double WeightFormatBytes(WeightFormat format) {
  switch (format) {
    case WeightFormat::kAuto: return 0.0;
    case WeightFormat::kF32: return 4.0;
    case WeightFormat::kBf16: return 2.0;
    case WeightFormat::kQ8_0: return 34.0 / 32.0;
  }
  return 0.0;
}

}  // namespace lede::model
