#include "policy/dqn/dqn_exit_controller.h"

#include <utility>

namespace lede::policy::dqn {

DqnExitController::DqnExitController(std::shared_ptr<const QNetwork> network, std::string version)
    : network_(std::move(network)), version_(std::move(version)) {}

std::string DqnExitController::name() const { return "dqn:" + version_; }

speculation::Action DqnExitController::Decide(const speculation::ExitState& state) {
  float features[speculation::kExitFeatureDim];
  speculation::ExitFeatures(state, features);
  network_->Forward(features, last_q_.data());
  return GreedyAction(last_q_.data());
}

}  // namespace lede::policy::dqn
