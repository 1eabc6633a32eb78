// File: trainer/offline_metrics.h
//
// OfflinePolicyMetrics: the one set of offline metrics of a greedy exit
// policy argmax_a Q(s, a) (ties -> kContinue) on logged transitions, and the
// one list of their names. Filled by the DQN trainer for the training and
// held-out sets after every epoch (trainer/dqn.h DqnEpochReport) and by
// EvaluateOffline for any fixed network (the retrainer's candidate against
// the serving policy, trainer/retrain.h); written under these names to
// policy.json's offline_metrics ("heldout_" + name) and to the retrain
// report ("offline": {"serving": {...}, "candidate": {...}}).
//
// Units: rates in [0, 1]; rewards, returns, Q-values and losses in reward
// units (shared/experience reward definitions); counts are whole numbers.
// A set with no transitions leaves every rate and mean NaN.
//
// Thread-safety: plain data and pure functions. Torch-free.
#ifndef LEDE_TRAINER_OFFLINE_METRICS_H_
#define LEDE_TRAINER_OFFLINE_METRICS_H_

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace lede::trainer {

struct OfflinePolicyMetrics {
  static constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();

  int64_t n_transitions = 0;  // usable (finite, not duplicated)
  int64_t n_episodes = 0;     // (request_id, round_index) groups
  // Huber TD loss of the n-step targets (bootstrapped from the target
  // network while training, from the network itself in EvaluateOffline).
  double td_loss = kNotMeasured;
  double mean_max_q = kNotMeasured;            // mean max_a Q(s, a)
  double action_agreement = kNotMeasured;      // greedy == logged action
  double exit_fraction_phase1 = kNotMeasured;  // greedy kExit share on phase-1 states
  double exit_fraction_phase2 = kNotMeasured;  // greedy kExit share on phase-2 states
  double behaviour_reward = kNotMeasured;      // mean logged reward per decision
  double matched_reward = kNotMeasured;        // ... over the decisions where greedy == logged
  double behaviour_return = kNotMeasured;      // mean undiscounted return per episode
  double matched_return = kNotMeasured;        // ... over the episodes the greedy policy reproduces
  int64_t matched_episodes = 0;                // episodes on which greedy agrees with every logged action
};

// Every field as (name, value), names as the fields are spelled above and
// in this order (counts as doubles).
std::vector<std::pair<std::string, double>> OfflineMetricFields(const OfflinePolicyMetrics& m);

// Adds every field to `out` as prefix + name (e.g. "heldout_td_loss"),
// replacing values already there.
void AddOfflineMetrics(const OfflinePolicyMetrics& m, const std::string& prefix, std::map<std::string, double>* out);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_OFFLINE_METRICS_H_
