// File: policy/dqn/q_network.h
//
// The Q-network of LEDE's learned exit policy (docs/design.md §2: "a small
// Q-network ... decides at which layer to exit and how many tokens to
// draft"), evaluated in plain C++ on the decision path.
//
//   features [kExitFeatureDim = 8]  (speculation::ExitFeatures, float32)
//     -> fc1: Linear(8, H) -> ReLU
//     -> fc2: Linear(H, H) -> ReLU
//     -> fc3: Linear(H, 2)          q[a] for a = 0 (kContinue), 1 (kExit)
//
// Weights use torch::nn::Linear's layout and names (weight [out, in]
// row-major, bias [out]), so the trainer exports them and the artifact
// (policy.safetensors, artifact.h) stores them without any reshaping.
//
// Why plain loops and no libtorch: the drafter consults the policy once per
// candidate layer and once per drafted token, in the middle of a forward
// pass; a libtorch call costs tens of microseconds of dispatch for about 5k
// multiply-adds. Forward() allocates nothing and costs well under the 5 us
// budget per decision. bench/policy_bench.cc (ns per Decide, x86-64 baseline
// ISA, -O3, one core of the 2-core dev machine): H = 32: ~140 ns, H = 64:
// ~400 ns, H = 128: ~1.6 us, H = 256: ~5.6 us. The cost grows as H^2, so
// keep H <= 128 to stay inside the budget.
//
// Thread-safety: a QNetwork is immutable after Create(); Forward() is const,
// allocation-free and safe to call concurrently.
#ifndef LEDE_POLICY_DQN_Q_NETWORK_H_
#define LEDE_POLICY_DQN_Q_NETWORK_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "shared/speculation/exit_controller.h"
#include "shared/status/status.h"

namespace lede::policy::dqn {

inline constexpr int kNumActions = 2;        // speculation::Action::kContinue, kExit
inline constexpr int kDefaultHidden = 64;    // H: 5k MACs, < 1 us, ample for 8 features
inline constexpr int kMaxHidden = 512;       // Forward() keeps activations on the stack

// The parameters, in torch::nn::Linear layout (row-major [out, in]).
struct QNetworkWeights {
  int32_t hidden = kDefaultHidden;  // H
  std::vector<float> fc1_weight;    // [H, kExitFeatureDim]
  std::vector<float> fc1_bias;      // [H]
  std::vector<float> fc2_weight;    // [H, H]
  std::vector<float> fc2_bias;      // [H]
  std::vector<float> fc3_weight;    // [kNumActions, H]
  std::vector<float> fc3_bias;      // [kNumActions]
};

class QNetwork {
 public:
  // Validates and adopts `weights`.
  // Errors: kInvalidArgument (naming the tensor) if hidden is outside
  // [1, kMaxHidden], a vector's size disagrees with its shape above, or a
  // value is not finite.
  static StatusOr<QNetwork> Create(QNetworkWeights weights);

  // A network with torch::nn::Linear's default initialisation law
  // (U(-1/sqrt(in), 1/sqrt(in)) for weights and biases) drawn from a
  // std::mt19937_64 seeded with `seed` (not libtorch's generator). For tests
  // and benchmarks. Requires 1 <= hidden <= kMaxHidden.
  static QNetwork Random(int32_t hidden, uint64_t seed);

  // q[a] for a in {0 = kContinue, 1 = kExit}. `features` points at
  // kExitFeatureDim floats (speculation::ExitFeatures). Matches libtorch's
  // fc3(relu(fc2(relu(fc1(x))))) to float rounding (summation order differs).
  void Forward(const float* features, float q[kNumActions]) const;

  int32_t hidden() const { return weights_.hidden; }
  const QNetworkWeights& weights() const { return weights_; }

 private:
  explicit QNetwork(QNetworkWeights weights);

  QNetworkWeights weights_;
  // Transposed copies ([in, out]) so that the inner loop runs over outputs
  // without a reduction: it vectorizes without -ffast-math.
  std::vector<float> fc1_t_;  // [kExitFeatureDim, H]
  std::vector<float> fc2_t_;  // [H, H]
};

// What a calibration times as one exit decision (model::cost::Calibrate's
// `decide`, shared/model/cost/cost_model.h): a forward pass of `network` on a
// fixed feature vector, its result kept from being optimized away. Used by
// `lede calibrate` and the retrainer's one-time calibration.
// Thread-safety: the function may be called from any thread (Forward() is const).
std::function<void()> TimedDecision(QNetwork network);

}  // namespace lede::policy::dqn

#endif  // LEDE_POLICY_DQN_Q_NETWORK_H_
