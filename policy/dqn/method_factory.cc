#include "policy/dqn/method_factory.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "policy/controllers.h"
#include "policy/dqn/dqn_exit_controller.h"

namespace lede::policy::dqn {

using speculation::SpeculationMethod;

StatusOr<MethodPlan> PlanMethod(const speculation::MethodSpec& spec, const MethodContext& context) {
  if (context.n_layers < 2 || context.max_draft_len < 1) {
    return InvalidArgumentError("method: needs a model of >= 2 layers and a draft capacity >= 1");
  }
  MethodPlan plan;
  plan.method = spec.method;
  plan.mode = speculation::LoopMode(spec.method);
  switch (spec.method) {
    case SpeculationMethod::kAutoregressive:
      return plan;
    case SpeculationMethod::kStatic:
      if (spec.exit_layer < 1 || spec.exit_layer > context.n_layers) {
        return InvalidArgumentError("exit_layer: " + std::to_string(spec.exit_layer) + " outside [1, " +
                                    std::to_string(context.n_layers) + "]");
      }
      if (spec.draft_len < 1) {
        return InvalidArgumentError("draft_length: " + std::to_string(spec.draft_len) + " must be >= 1");
      }
      plan.exit_layer = spec.exit_layer;
      plan.draft_len = spec.draft_len;
      return plan;
    case SpeculationMethod::kThreshold: {
      const float t = spec.threshold;
      if (!(t > 0.0f && t <= 1.0f)) return InvalidArgumentError("speculation.threshold: must be in (0, 1]");
      for (int32_t l = 1; l < context.n_layers; ++l) plan.decision_spec.candidate_layers.push_back(l);
      plan.decision_spec.max_draft_len = std::min<int32_t>(8, context.max_draft_len);
      plan.make_controller = [t] { return std::make_unique<ThresholdExitController>(t, t); };
      plan.policy_version = ThresholdExitController(t, t).name();
      return plan;
    }
    case SpeculationMethod::kLede: {
      if (!(spec.epsilon >= 0.0f && spec.epsilon <= 1.0f)) {
        return InvalidArgumentError("speculation.epsilon: must be in [0, 1]");
      }
      if (context.artifact == nullptr) {
        return FailedPreconditionError("method: LEDE needs a policy and none is loaded");
      }
      std::shared_ptr<const Artifact> artifact = context.artifact;
      plan.decision_spec = artifact->metadata.decision;
      plan.decision_spec.max_draft_len = std::min(plan.decision_spec.max_draft_len, context.max_draft_len);
      plan.policy_version = artifact->metadata.version;
      std::shared_ptr<const QNetwork> network(artifact, &artifact->network);
      const std::string version = artifact->metadata.version;
      plan.make_controller = [network, version] { return std::make_unique<DqnExitController>(network, version); };
      return plan;
    }
  }
  return InvalidArgumentError("method: unknown speculation method");
}

StatusOr<MethodPlan> PlanTrainedPolicy(std::shared_ptr<const Artifact> artifact, int32_t n_layers) {
  MethodContext context;
  context.n_layers = n_layers;
  context.max_draft_len = std::numeric_limits<int32_t>::max();  // the artifact's own D_max
  context.artifact = std::move(artifact);
  speculation::MethodSpec spec;
  spec.method = speculation::SpeculationMethod::kLede;
  return PlanMethod(spec, context);
}

}  // namespace lede::policy::dqn
