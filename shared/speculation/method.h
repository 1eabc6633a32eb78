// File: shared/speculation/method.h
//
// The one vocabulary of speculation methods (docs/design.md §2 baselines and
// LEDE): what a request asks for. Every spelling users see maps onto it:
//   CLI --mode      ar | static | lede       (ParseSpeculationMethod)
//   gRPC/HTTP       lede.v1.SpeculationMethod (converted at the service
//                   boundary only; UNSPECIFIED means LEDE)
// and the loop's SpeculationMode (how RunGeneration drafts) is derived from
// it by LoopMode(). The factory that builds a method's controller lives with
// the controllers (policy/dqn/method_factory.h). Torch-free, Abseil-free.
//
// Example:
//   LEDE_ASSIGN_OR_RETURN(SpeculationMethod m, ParseSpeculationMethod("ar"));
//   // m == SpeculationMethod::kAutoregressive, SpeculationMethodName(m) == "autoregressive"
#ifndef LEDE_SHARED_SPECULATION_METHOD_H_
#define LEDE_SHARED_SPECULATION_METHOD_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "shared/speculation/generation.h"
#include "shared/status/status.h"

namespace lede::speculation {

enum class SpeculationMethod {
  kAutoregressive,  // no speculation: full-depth steps
  kStatic,          // fixed exit layer E and draft length D (LayerSkip)
  kThreshold,       // exit / keep drafting while top-1 probability >= threshold
  kLede,            // the learned exit policy (DQN artifact)
};

// The method named `name`, any case: "autoregressive" (or "ar"), "static",
// "threshold", "lede". Errors: kInvalidArgument naming the value and the
// accepted names, e.g. "unknown speculation method 'fast' (want
// autoregressive (ar), static, threshold or lede)".
StatusOr<SpeculationMethod> ParseSpeculationMethod(std::string_view name);

// The lower-case canonical name: "autoregressive", "static", "threshold",
// "lede" (metric labels, logs, summaries).
std::string SpeculationMethodName(SpeculationMethod method);

// How the loop runs a method: kAutoregressive, kStatic, or kAdaptive (an
// exit controller decides; threshold and LEDE).
SpeculationMode LoopMode(SpeculationMethod method);

// A method and its parameters, as a request or a command line gives them.
// Only the fields of `method` are read.
struct MethodSpec {
  SpeculationMethod method = SpeculationMethod::kLede;
  int32_t exit_layer = 0;   // kStatic: exit layer E in [1, L]
  int32_t draft_len = 0;    // kStatic: draft length D >= 1
  float threshold = 0.0f;   // kThreshold: top-1 probability in (0, 1]
  float epsilon = 0.0f;     // kLede: exploration rate in [0, 1] (behaviour policy)
};

}  // namespace lede::speculation

#endif  // LEDE_SHARED_SPECULATION_METHOD_H_
