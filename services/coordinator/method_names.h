// File: services/coordinator/method_names.h
//
// The wire enum lede.v1.SpeculationMethod <-> the one method vocabulary
// (shared/speculation/method.h), at the coordinator's service boundary
// only: the `method` label of lede_requests_total, the OpenAI API's
// speculation.method and the loop's mode. gRPC-free (the generated
// messages and the speculation library only), so the OpenAI request parser
// and its fuzz target use it without the rest of the coordinator.
// Thread-safety: pure functions.
#ifndef LEDE_SERVICES_COORDINATOR_METHOD_NAMES_H_
#define LEDE_SERVICES_COORDINATOR_METHOD_NAMES_H_

#include <optional>
#include <string>

#include "proto/lede/v1/generation.pb.h"
#include "shared/speculation/method.h"

namespace lede::coordinator {

// The method a wire value runs: UNSPECIFIED is LEDE; nullopt for a value
// outside the enum (validation rejects it as INVALID_ARGUMENT naming
// `method`).
std::optional<speculation::SpeculationMethod> MethodFromProto(lede::v1::SpeculationMethod method);

// The wire value of a method (never UNSPECIFIED).
lede::v1::SpeculationMethod MethodToProto(speculation::SpeculationMethod method);

// The lower-case name of a speculation method: "lede" (also for
// UNSPECIFIED and for values outside the enum, which validation rejects),
// "static", "threshold", "autoregressive" (the generated enum name without
// its prefix).
//   SpeculationMethodName(lede::v1::SPECULATION_METHOD_STATIC) == "static"
std::string SpeculationMethodName(lede::v1::SpeculationMethod method);

// The method named `name` as SpeculationMethodName() spells it ("lede",
// "static", "threshold", "autoregressive", or the CLI's "ar"; any case;
// speculation::ParseSpeculationMethod); false (and `*method` unchanged) for
// anything else.
bool ParseSpeculationMethodName(const std::string& name, lede::v1::SpeculationMethod* method);

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_METHOD_NAMES_H_
