// Link seam of the fuzz build: SpeculationMethodName() and
// ParseSpeculationMethodName() (services/coordinator/coordinator.h) live in
// coordinator.cc, which needs gRPC and the speculation loop and is not
// compiled into the fuzz targets. These define them the same way, over the
// same method vocabulary (shared/speculation/method.h), for openai_api.cc.
#include <optional>
#include <string>

#include "proto/lede/v1/generation.pb.h"
#include "services/coordinator/coordinator.h"
#include "shared/speculation/method.h"

namespace lede::coordinator {
namespace {

speculation::SpeculationMethod FromWire(lede::v1::SpeculationMethod method) {
  switch (method) {
    case lede::v1::SPECULATION_METHOD_STATIC: return speculation::SpeculationMethod::kStatic;
    case lede::v1::SPECULATION_METHOD_THRESHOLD: return speculation::SpeculationMethod::kThreshold;
    case lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE: return speculation::SpeculationMethod::kAutoregressive;
    default: return speculation::SpeculationMethod::kLede;
  }
}

lede::v1::SpeculationMethod ToWire(speculation::SpeculationMethod method) {
  switch (method) {
    case speculation::SpeculationMethod::kAutoregressive: return lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE;
    case speculation::SpeculationMethod::kStatic: return lede::v1::SPECULATION_METHOD_STATIC;
    case speculation::SpeculationMethod::kThreshold: return lede::v1::SPECULATION_METHOD_THRESHOLD;
    case speculation::SpeculationMethod::kLede: return lede::v1::SPECULATION_METHOD_LEDE;
  }
  return lede::v1::SPECULATION_METHOD_LEDE;
}

}  // namespace

std::string SpeculationMethodName(lede::v1::SpeculationMethod method) {
  return speculation::SpeculationMethodName(FromWire(method));
}

bool ParseSpeculationMethodName(const std::string& name, lede::v1::SpeculationMethod* method) {
  StatusOr<speculation::SpeculationMethod> parsed = speculation::ParseSpeculationMethod(name);
  if (!parsed.ok()) return false;
  *method = ToWire(*parsed);
  return true;
}

}  // namespace lede::coordinator
