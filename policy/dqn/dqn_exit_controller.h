// File: policy/dqn/dqn_exit_controller.h
//
// The learned exit policy of LEDE (docs/design.md §2): the greedy policy of an
// offline-trained DQN. At each decision point, phase 1 (exit layer) or
// phase 2 (draft length), it computes speculation::ExitFeatures(state), evaluates
// the Q-network and takes argmax_a Q(s, a); a tie goes to kContinue (phase 1:
// probe one layer deeper; phase 2: stop and verify), the choice that can
// never draft a wrong token.
//
// Example:
//   LEDE_ASSIGN_OR_RETURN(Artifact a, LoadArtifact(dir, fingerprint));
//   auto net = std::make_shared<const QNetwork>(std::move(a.network));
//   DqnExitController controller(net, a.metadata.version);  // one per request
//   speculation::Action action = controller.Decide(state);
//
// Ownership and thread-safety: the network is shared and immutable, so one
// QNetwork serves every request's controller; a controller itself keeps the
// Q-values of its last decision and follows ExitController's rule (one per
// request, never called concurrently).
#ifndef LEDE_POLICY_DQN_DQN_EXIT_CONTROLLER_H_
#define LEDE_POLICY_DQN_DQN_EXIT_CONTROLLER_H_

#include <array>
#include <memory>
#include <string>

#include "policy/dqn/q_network.h"
#include "shared/speculation/exit_controller.h"

namespace lede::policy::dqn {

class DqnExitController : public speculation::ExitController {
 public:
  // `network` must not be null. `version` is the artifact's version.
  DqnExitController(std::shared_ptr<const QNetwork> network, std::string version);

  // "dqn:<version>".
  std::string name() const override;

  // argmax_a Q(ExitFeatures(state), a); kContinue on a tie (or a NaN Q).
  // Cost: one QNetwork::Forward (< 1 us at H = 64), no allocation.
  speculation::Action Decide(const speculation::ExitState& state) override;

  // Q-values [kNumActions] of the last Decide() (zeros before the first);
  // for logging and debugging.
  const std::array<float, kNumActions>& last_q() const { return last_q_; }

  const std::string& version() const { return version_; }

 private:
  std::shared_ptr<const QNetwork> network_;
  std::string version_;
  std::array<float, kNumActions> last_q_{};
};

// The greedy action for Q-values q[kNumActions]: kExit only if q[1] > q[0].
inline speculation::Action GreedyAction(const float q[kNumActions]) {
  return q[1] > q[0] ? speculation::Action::kExit : speculation::Action::kContinue;
}

}  // namespace lede::policy::dqn

#endif  // LEDE_POLICY_DQN_DQN_EXIT_CONTROLLER_H_
