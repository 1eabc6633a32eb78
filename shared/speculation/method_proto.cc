#include "shared/speculation/method_proto.h"

namespace lede::speculation {

std::optional<SpeculationMethod> MethodFromProto(lede::v1::SpeculationMethod method) {
  switch (method) {
    case lede::v1::SPECULATION_METHOD_UNSPECIFIED:
    case lede::v1::SPECULATION_METHOD_LEDE:
      return SpeculationMethod::kLede;
    case lede::v1::SPECULATION_METHOD_STATIC:
      return SpeculationMethod::kStatic;
    case lede::v1::SPECULATION_METHOD_THRESHOLD:
      return SpeculationMethod::kThreshold;
    case lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE:
      return SpeculationMethod::kAutoregressive;
    default:
      return std::nullopt;
  }
}

lede::v1::SpeculationMethod MethodToProto(SpeculationMethod method) {
  switch (method) {
    case SpeculationMethod::kAutoregressive:
      return lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE;
    case SpeculationMethod::kStatic:
      return lede::v1::SPECULATION_METHOD_STATIC;
    case SpeculationMethod::kThreshold:
      return lede::v1::SPECULATION_METHOD_THRESHOLD;
    case SpeculationMethod::kLede:
      return lede::v1::SPECULATION_METHOD_LEDE;
  }
  return lede::v1::SPECULATION_METHOD_LEDE;
}

StatusOr<MethodSpec> MethodSpecFromProto(lede::v1::SpeculationMethod method,
                                         const lede::v1::SpeculationParams& params) {
  const std::optional<SpeculationMethod> m = MethodFromProto(method);
  if (!m.has_value()) {
    return InvalidArgumentError("method: unknown speculation method " + std::to_string(static_cast<int>(method)));
  }
  MethodSpec spec;
  spec.method = *m;
  spec.exit_layer = params.exit_layer();
  spec.draft_len = params.draft_length();
  spec.threshold = params.threshold();
  spec.epsilon = params.epsilon();
  return spec;
}

std::string SpeculationMethodName(lede::v1::SpeculationMethod method) {
  // Invalid values fail validation; they are named as what UNSPECIFIED runs.
  return SpeculationMethodName(MethodFromProto(method).value_or(SpeculationMethod::kLede));
}

bool ParseSpeculationMethodName(const std::string& name, lede::v1::SpeculationMethod* method) {
  StatusOr<SpeculationMethod> parsed = ParseSpeculationMethod(name);
  if (!parsed.ok()) return false;
  *method = MethodToProto(*parsed);
  return true;
}

}  // namespace lede::speculation
