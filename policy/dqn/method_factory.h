// File: policy/dqn/method_factory.h
//
// The one factory from a speculation method (shared/speculation/method.h) to
// what the loop needs to run it: the loop mode, the static (E, D), the
// decision spec and a maker of exit controllers. The model service, the CLI,
// the benchmark and the retrainer all build their methods here. It lives in
// policy/dqn because the LEDE method needs the DQN artifact; torch-free.
//
//   method          mode            controller                       decision_spec
//   autoregressive  kAutoregressive none                             -
//   static          kStatic         none (E, D in exit_layer/draft_len) -
//   threshold       kAdaptive       ThresholdExitController(t, t)    candidates 1..L-1, D_max min(8, max)
//   lede            kAdaptive       DqnExitController(artifact)      the artifact's, D_max clamped to max
//
// Example:
//   MethodContext ctx{.n_layers = L, .max_draft_len = 16, .artifact = artifact};
//   LEDE_ASSIGN_OR_RETURN(MethodPlan plan, PlanMethod(spec, ctx));
//   options.mode = plan.mode; options.decision_spec = plan.decision_spec;
//   std::unique_ptr<speculation::ExitController> c = plan.MakeController();  // per request
#ifndef LEDE_POLICY_DQN_METHOD_FACTORY_H_
#define LEDE_POLICY_DQN_METHOD_FACTORY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "policy/dqn/artifact.h"
#include "shared/speculation/exit_controller.h"
#include "shared/speculation/generation.h"
#include "shared/speculation/method.h"
#include "shared/status/status.h"

namespace lede::policy::dqn {

// What PlanMethod needs to know about the model and the serving policy.
struct MethodContext {
  int32_t n_layers = 0;       // L of the model (>= 2)
  int32_t max_draft_len = 0;  // the KV pool's D_max (>= 1): caps every draft
  // The policy for kLede (null otherwise); shared with the controllers made.
  std::shared_ptr<const Artifact> artifact;
};

// How to run one method.
struct MethodPlan {
  speculation::SpeculationMethod method = speculation::SpeculationMethod::kLede;
  speculation::SpeculationMode mode = speculation::SpeculationMode::kAutoregressive;
  int32_t exit_layer = 0;           // kStatic: E
  int32_t draft_len = 0;            // kStatic: D
  speculation::DecisionSpec decision_spec;  // kAdaptive: where and how the controller is asked
  // The policy version a round reports: the artifact's version (lede), the
  // controller's name (threshold), "" otherwise.
  std::string policy_version;
  // A fresh controller per call (controllers hold per-request state); null
  // for methods without one.
  std::function<std::unique_ptr<speculation::ExitController>()> make_controller;

  std::unique_ptr<speculation::ExitController> MakeController() const {
    return make_controller ? make_controller() : nullptr;
  }
};

// The plan for `spec` on a model of `context.n_layers` layers.
// Errors: kInvalidArgument naming the field for a parameter out of range
// (static: E outside [1, L] or D < 1; threshold outside (0, 1]; epsilon
// outside [0, 1]) or a bad context; kFailedPrecondition for kLede without
// an artifact.
StatusOr<MethodPlan> PlanMethod(const speculation::MethodSpec& spec, const MethodContext& context);

// The LEDE plan of `artifact` as it was trained, its own D_max uncapped by
// any KV pool: what replays, benchmarks and offline evaluations run on a
// model of `n_layers` layers. Errors: those of PlanMethod.
StatusOr<MethodPlan> PlanTrainedPolicy(std::shared_ptr<const Artifact> artifact, int32_t n_layers);

}  // namespace lede::policy::dqn

#endif  // LEDE_POLICY_DQN_METHOD_FACTORY_H_
