// File: shared/speculation/method_proto.h
//
// The one mapping between the wire enum lede.v1.SpeculationMethod (with its
// lede.v1.SpeculationParams) and the method vocabulary of method.h, used at
// every service boundary that meets the wire: the coordinator (the `method`
// label of lede_requests_total, the OpenAI API's speculation.method, the
// loop's mode) and the drafter service (the controller it plans). Its own
// library, lede::speculation_proto, so lede::speculation stays free of
// protobuf; gRPC-free (the generated messages only), so the OpenAI request
// parser and its fuzz target use it without a server.
//
// The wire's UNSPECIFIED means LEDE; a value outside the enum (a newer
// client, a corrupt message) is refused where a request is converted
// (MethodSpecFromProto: kInvalidArgument naming `method`) and named as what
// UNSPECIFIED runs where only a label is wanted (SpeculationMethodName).
//
// Example:
//   LEDE_ASSIGN_OR_RETURN(MethodSpec spec, MethodSpecFromProto(req.method(), req.params()));
//   metrics.RecordRequest(SpeculationMethodName(req.method()), ...);   // "lede", "static", ...
//
// Thread-safety: pure functions.
#ifndef LEDE_SHARED_SPECULATION_METHOD_PROTO_H_
#define LEDE_SHARED_SPECULATION_METHOD_PROTO_H_

#include <optional>
#include <string>

#include "proto/lede/v1/generation.pb.h"
#include "shared/speculation/method.h"
#include "shared/status/status.h"

namespace lede::speculation {

// The method a wire value runs: UNSPECIFIED is kLede; nullopt for a value
// outside the enum.
std::optional<SpeculationMethod> MethodFromProto(lede::v1::SpeculationMethod method);

// The wire value of a method (never UNSPECIFIED).
lede::v1::SpeculationMethod MethodToProto(SpeculationMethod method);

// A request's method and parameters (exit_layer, draft_length, threshold,
// epsilon copied as given; PlanMethod checks their ranges). Errors:
// kInvalidArgument "method: unknown speculation method N" for a value
// outside the enum.
StatusOr<MethodSpec> MethodSpecFromProto(lede::v1::SpeculationMethod method,
                                         const lede::v1::SpeculationParams& params);

// The lower-case name of a wire method: "lede" (also for UNSPECIFIED and for
// values outside the enum, which validation rejects), "static",
// "threshold", "autoregressive" (the generated enum name without its
// prefix).
//   SpeculationMethodName(lede::v1::SPECULATION_METHOD_STATIC) == "static"
std::string SpeculationMethodName(lede::v1::SpeculationMethod method);

// The wire method named `name` as SpeculationMethodName() spells it
// ("lede", "static", "threshold", "autoregressive", or the CLI's "ar"; any
// case; ParseSpeculationMethod); false (and `*method` unchanged) for
// anything else.
bool ParseSpeculationMethodName(const std::string& name, lede::v1::SpeculationMethod* method);

}  // namespace lede::speculation

#endif  // LEDE_SHARED_SPECULATION_METHOD_PROTO_H_
