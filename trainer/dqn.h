// File: trainer/dqn.h
//
// Offline DQN training of LEDE's exit policy (docs/design.md §2 "Learning: a DQN
// trained offline from a replay buffer of (s, a, r, s') tuples with n-step TD
// targets and a target network"; Mnih et al. 2015 for DQN and the target
// network, Sutton & Barto §7.1 / Hessel et al. 2018 (Rainbow) for n-step
// targets without importance correction).
//
// Data. The replay buffer is every logged experience::Transition (no eviction:
// training is offline and the buffer fits in memory, ~100 B per transition).
// An episode is one speculation round, keyed by (request_id, round_index),
// its decisions ordered by decision_index; the last decision is terminal.
//
// Targets. For a transition t of an episode, with k = min(n, steps until the
// episode ends):
//   G_t = sum_{i<k} gamma^i r_{t+i} + [t+k not past the end] gamma^k max_a Q_target(s_{t+k}, a)
// where s_{t+k} is next_state of transition t+k-1. A chain also stops at a
// gap in decision_index (a lost record): the target then bootstraps from the
// last transition's next_state, which is exact for k steps.
// Loss: Huber (smooth L1, delta = huber_delta) between Q(s_t, a_t) and G_t
// (G_t carries no gradient); Adam; global gradient-norm clipping.
// Target network: a copy of the online network, either copied every
// target_update_every optimizer steps (hard; default) or moved by Polyak
// averaging, theta' <- tau theta + (1 - tau) theta', after every step.
//
// Split. Whole episodes (and, with >= 10 requests, whole requests, since the
// rounds of one request share a prompt and are correlated) are held out for
// offline metrics: TD loss, agreement with the behaviour actions, and an
// offline reward estimate of the greedy policy where it agrees with the
// behaviour actions (per decision, and per episode over the held-out episodes
// on which it agrees at every decision: rejection-sampling evaluation, an
// unbiased estimate when the behaviour policy explored uniformly).
//
// Determinism. Initial weights come from policy::dqn::QNetwork::Random(seed)
// (a std::mt19937_64, not libtorch's generator), minibatches from another
// mt19937_64 seeded with seed, and libtorch runs with num_threads intra-op
// threads (restored afterwards), so one seed gives byte-identical weights on
// one machine.
//
// Thread-safety: TrainDqn is a single-threaded driver that sets libtorch's
// process-wide intra-op thread count while it runs; run one at a time.
#ifndef LEDE_TRAINER_DQN_H_
#define LEDE_TRAINER_DQN_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "policy/dqn/artifact.h"
#include "policy/dqn/q_network.h"
#include "shared/experience/transition.h"
#include "shared/status/status.h"
#include "trainer/offline_metrics.h"

namespace lede::trainer {

enum class TargetUpdate { kHard, kPolyak };

struct DqnOptions {
  // H of the Q-network: 8 features need little capacity, and H = 64 keeps a
  // decision < 1 us in plain C++ (QNetwork::Forward).
  int32_t hidden = policy::dqn::kDefaultHidden;
  // Discount. A round has at most |candidate_layers| + D_max decisions (~16),
  // so gamma = 0.99 makes the objective almost the undiscounted round return
  // (tokens gained minus drafting cost, which is what speed-up rewards) while
  // keeping the bootstrapped targets a contraction.
  double gamma = 0.99;
  // n of the n-step targets. 3 carries an exit's payoff (the acceptance
  // rewards of the tokens drafted after it) back to the phase-1 decision in
  // one update rather than after n rounds of bootstrapping, while staying
  // short enough that uncorrected off-policy returns (the behaviour policy
  // chose actions t+1..t+n-1) add little bias; Rainbow's value.
  int32_t n_step = 3;
  int64_t epochs = 20;          // passes over the training transitions
  int64_t batch_size = 128;     // transitions per minibatch (sampled without replacement per epoch)
  double lr = 1e-3;             // Adam learning rate (default betas 0.9/0.999)
  // Huber threshold in reward units: rewards are O(1) (accept ~ +1.5, reject
  // ~ -1.5), so errors beyond 1 are outliers whose gradient is capped.
  double huber_delta = 1.0;
  double max_grad_norm = 10.0;  // global L2 clip; guards against bootstrap blow-ups
  // Hard updates are the DQN default and make the bootstrap target piecewise
  // constant, which is easier to reason about on small offline data sets.
  TargetUpdate target_update = TargetUpdate::kHard;
  int64_t target_update_every = 100;  // optimizer steps between hard copies
  double polyak_tau = 0.01;           // per step, when target_update = kPolyak
  // Share of episodes (or requests) held out for offline metrics; 0 trains on
  // everything and leaves the held-out metrics NaN.
  double heldout_fraction = 0.1;
  uint64_t seed = 1;
  // libtorch intra-op threads while training. 1: the network is tiny (a
  // [128, 64] matmul gains nothing from threads) and a fixed count fixes the
  // summation order, hence the bytes of the weights.
  int32_t num_threads = 1;
  // Warm start: when set, training starts from these weights (online and
  // target network) instead of QNetwork::Random(hidden, seed), so a
  // retraining run fine-tunes the serving policy (trainer/retrain.h) rather
  // than forgetting it; its hidden width must equal `hidden`. Null: a fresh
  // network, QNetwork::Random with zero weights on the load feature (the
  // last input): it starts load-blind, and only targets that differ
  // between loads make the load matter. Shared and never modified.
  std::shared_ptr<const policy::dqn::QNetwork> initial_network;
  // Example:
  //   DqnOptions o;  o.epochs = 40;  o.seed = 7;
  //   LEDE_ASSIGN_OR_RETURN(DqnResult r, TrainDqn(transitions, o));
};

// Errors: kInvalidArgument naming the option when one is out of range
// (hidden in [1, kMaxHidden], gamma in [0, 1], n_step >= 1, epochs >= 0,
// batch_size >= 1, lr > 0, huber_delta > 0, max_grad_norm > 0,
// target_update_every >= 1, polyak_tau in (0, 1], heldout_fraction in [0, 1),
// num_threads >= 1, initial_network's hidden width == hidden).
Status ValidateDqnOptions(const DqnOptions& options);

// One transition's n-step target, without the bootstrap value:
//   G_t = reward_sum + bootstrap_discount * max_a Q_target(bootstrap_state, a)
struct NStepTarget {
  double reward_sum = 0;          // sum_{i<k} gamma^i r_{t+i}
  double bootstrap_discount = 0;  // gamma^k, or 0 when the episode ended within k steps
  std::array<float, speculation::kExitFeatureDim> bootstrap_state{};  // s_{t+k}; zeros when terminal
  int32_t steps = 0;              // k in [1, n]
};

// The n-step targets of `transitions` (any order), aligned with it. Episodes
// are (request_id, round_index) groups ordered by decision_index; a chain
// ends at a done transition, at the end of its episode's records, at a gap
// in decision_index, or after n steps. Requires 0 <= gamma <= 1, n >= 1.
std::vector<NStepTarget> ComputeNStepTargets(const std::vector<experience::Transition>& transitions,
                                             double gamma, int32_t n);

// G_t for each target, with `target_network` evaluated in plain C++; the
// reference for the batched libtorch computation inside TrainDqn.
std::vector<double> TdTargets(const std::vector<NStepTarget>& targets,
                              const policy::dqn::QNetwork& target_network);

// One epoch: its minibatch loss, then the greedy policy's offline metrics
// (trainer/offline_metrics.h) on the training and the held-out transitions
// (TD targets from the target network; held-out NaN when none is held out).
struct DqnEpochReport {
  int64_t epoch = 0;            // 1-based
  int64_t steps = 0;            // optimizer steps so far
  double td_loss = 0;           // mean Huber TD loss of this epoch's minibatches
  OfflinePolicyMetrics train;
  OfflinePolicyMetrics heldout;
  double elapsed_s = 0;         // wall-clock since training began
};

struct DqnResult {
  explicit DqnResult(policy::dqn::QNetwork trained) : network(std::move(trained)) {}

  policy::dqn::QNetwork network;        // the trained online network
  std::vector<DqnEpochReport> epochs;   // one per epoch
  int64_t n_transitions = 0;            // used
  int64_t n_dropped = 0;                // dropped for a non-finite state, next_state or reward
  int64_t n_duplicates = 0;             // repeats of a (request_id, round_index, decision_index) seen before
  int64_t n_episodes = 0;
  int64_t n_requests = 0;
  int64_t n_train_transitions = 0;
  int64_t n_heldout_transitions = 0;
  int64_t n_train_episodes = 0;
  int64_t n_heldout_episodes = 0;
  std::vector<std::string> behaviour_versions;  // policy_version values in the data, sorted

  // The last epoch's metrics under stable names ("td_loss",
  // "heldout_matched_return", ...) for policy.json's offline_metrics.
  std::map<std::string, double> OfflineMetrics() const;
};

// Offline metrics (trainer/offline_metrics.h) of one fixed network's greedy
// policy on a set of logged transitions (e.g. held-out experience), with the
// network as its own target network for the TD loss: how well its values
// explain the logged rewards, how often it agrees with the behaviour
// actions, and the rejection-sampling reward estimate (mean return of the
// episodes on which it agrees with every logged action). Used to compare a
// retrained candidate with the serving policy on the same data
// (trainer/retrain.h).
// Errors: those of ValidateDqnOptions (gamma, n_step, huber_delta and
// num_threads are used; initial_network is ignored); kInvalidArgument if no
// usable transition is given; kInternal if libtorch fails.
// Thread-safety: as TrainDqn (sets libtorch's intra-op thread count).
StatusOr<OfflinePolicyMetrics> EvaluateOffline(const policy::dqn::QNetwork& network,
                                               const std::vector<experience::Transition>& transitions,
                                               const DqnOptions& options);

// Trains a Q-network on `transitions` (the whole replay buffer) and calls
// `on_epoch` after each epoch. Transitions with a non-finite state,
// next_state or reward are dropped (counted in n_dropped), and a decision
// logged twice (same request_id, round_index, decision_index, e.g. from a
// re-uploaded shard) counts once (the first; n_duplicates).
// Errors: those of ValidateDqnOptions; kInvalidArgument if no usable
// transition is left; kInternal if libtorch fails.
using DqnEpochCallback = std::function<void(const DqnEpochReport&)>;
StatusOr<DqnResult> TrainDqn(const std::vector<experience::Transition>& transitions, const DqnOptions& options,
                             const DqnEpochCallback& on_epoch = nullptr);

// The artifact of a training run: `metadata` supplies what training does not
// know (version, model_fingerprint, decision spec, reward cost model, shard
// range and counts, the caller's own training options); gamma, n_step,
// seed, the DQN's training options (added to the caller's; the caller's
// win on a shared name), transition and episode counts, behaviour versions
// and offline metrics are filled in here.
policy::dqn::Artifact MakeArtifact(const DqnResult& result, const DqnOptions& options,
                                   policy::dqn::PolicyMetadata metadata);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_DQN_H_
