#include "services/coordinator/method_names.h"

namespace lede::coordinator {

std::optional<speculation::SpeculationMethod> MethodFromProto(lede::v1::SpeculationMethod method) {
  switch (method) {
    case lede::v1::SPECULATION_METHOD_UNSPECIFIED:
    case lede::v1::SPECULATION_METHOD_LEDE:
      return speculation::SpeculationMethod::kLede;
    case lede::v1::SPECULATION_METHOD_STATIC:
      return speculation::SpeculationMethod::kStatic;
    case lede::v1::SPECULATION_METHOD_THRESHOLD:
      return speculation::SpeculationMethod::kThreshold;
    case lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE:
      return speculation::SpeculationMethod::kAutoregressive;
    default:
      return std::nullopt;
  }
}

lede::v1::SpeculationMethod MethodToProto(speculation::SpeculationMethod method) {
  switch (method) {
    case speculation::SpeculationMethod::kAutoregressive:
      return lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE;
    case speculation::SpeculationMethod::kStatic:
      return lede::v1::SPECULATION_METHOD_STATIC;
    case speculation::SpeculationMethod::kThreshold:
      return lede::v1::SPECULATION_METHOD_THRESHOLD;
    case speculation::SpeculationMethod::kLede:
      return lede::v1::SPECULATION_METHOD_LEDE;
  }
  return lede::v1::SPECULATION_METHOD_LEDE;
}

std::string SpeculationMethodName(lede::v1::SpeculationMethod method) {
  // Invalid values fail validation; they are named as what UNSPECIFIED runs.
  return speculation::SpeculationMethodName(MethodFromProto(method).value_or(speculation::SpeculationMethod::kLede));
}

bool ParseSpeculationMethodName(const std::string& name, lede::v1::SpeculationMethod* method) {
  StatusOr<speculation::SpeculationMethod> parsed = speculation::ParseSpeculationMethod(name);
  if (!parsed.ok()) return false;
  *method = MethodToProto(*parsed);
  return true;
}

}  // namespace lede::coordinator
