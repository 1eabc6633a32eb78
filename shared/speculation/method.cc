#include "shared/speculation/method.h"

#include <cctype>

namespace lede::speculation {

StatusOr<SpeculationMethod> ParseSpeculationMethod(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "autoregressive" || lower == "ar") return SpeculationMethod::kAutoregressive;
  if (lower == "static") return SpeculationMethod::kStatic;
  if (lower == "threshold") return SpeculationMethod::kThreshold;
  if (lower == "lede") return SpeculationMethod::kLede;
  return InvalidArgumentError("unknown speculation method '" + std::string(name) +
                              "' (want autoregressive (ar), static, threshold or lede)");
}

std::string SpeculationMethodName(SpeculationMethod method) {
  switch (method) {
    case SpeculationMethod::kAutoregressive:
      return "autoregressive";
    case SpeculationMethod::kStatic:
      return "static";
    case SpeculationMethod::kThreshold:
      return "threshold";
    case SpeculationMethod::kLede:
      return "lede";
  }
  return "lede";
}

SpeculationMode LoopMode(SpeculationMethod method) {
  switch (method) {
    case SpeculationMethod::kAutoregressive:
      return SpeculationMode::kAutoregressive;
    case SpeculationMethod::kStatic:
      return SpeculationMode::kStatic;
    case SpeculationMethod::kThreshold:
    case SpeculationMethod::kLede:
      return SpeculationMode::kAdaptive;
  }
  return SpeculationMode::kAdaptive;
}

}  // namespace lede::speculation
