// File: shared/model/sampling.h
//
// Token selection: greedy, temperature / top-p sampling, and the acceptance
// rules of a speculation round (docs/design.md §1): greedy longest-agreeing-prefix
// and speculative sampling (Leviathan et al., arXiv 2211.17192, Algorithm 1;
// Chen et al., arXiv 2302.01318), which leaves the output distribution equal
// to the verifier's.
//
// Tensors here are float32 on the CPU (callers move V floats per position).
// Thread-safety: Sampler is not thread-safe (one per request); the free
// functions are pure.
#ifndef LEDE_SHARED_MODEL_SAMPLING_H_
#define LEDE_SHARED_MODEL_SAMPLING_H_

#include <cstdint>
#include <random>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shared/speculation/generation.h"

namespace lede::model {

// temperature, top_p and seed of a request (shared/speculation/generation.h:
// 0 temperature = greedy; top_p in (0, 1]).
using SamplingOptions = speculation::SamplingParams;

// The distribution a request samples from: softmax(logits / temperature),
// restricted to the smallest set of most likely tokens whose mass reaches
// top_p, renormalized. logits [V] float32 -> probs [V] float32, CPU.
// Greedy options give the one-hot of argmax.
at::Tensor WarpedProbs(const at::Tensor& logits, const SamplingOptions& options);

// Seeded sampler; deterministic across devices (uses std::mt19937_64 on the
// CPU copy of the distribution).
class Sampler {
 public:
  explicit Sampler(uint64_t seed) : rng_(seed) {}
  // Draws an index from probs [V] (need not be normalized; must have mass).
  int32_t Sample(const at::Tensor& probs);
  double Uniform();  // in [0, 1)

 private:
  std::mt19937_64 rng_;
};

// Outcome of a speculation round for K draft tokens.
struct AcceptResult {
  int64_t n_accepted = 0;  // accepted draft tokens, in [0, K]
  int32_t next_token = 0;  // correction (on rejection) or bonus token
};

// Greedy acceptance: draft i is kept while it equals argmax of
// target_logits[i]; next_token = argmax of target_logits[n_accepted].
//   draft          [K] token ids
//   target_logits  [K+1, V] float32, any device: the verifier's logits at the
//                  pending position and at each draft position
AcceptResult AcceptGreedy(const std::vector<int32_t>& draft,
                          const at::Tensor& target_logits);

// Speculative sampling: draft i is kept with probability
// min(1, p_i(x_i) / q_i(x_i)); at the first rejection next_token is drawn from
// norm(max(0, p_i - q_i)); if all K are kept it is drawn from p_K.
//   draft_probs   [K, V]   q_i, float32 CPU (the drafter's warped distributions)
//   target_probs  [K+1, V] p_i, float32 CPU (the verifier's, same warping)
AcceptResult AcceptSpeculative(const std::vector<int32_t>& draft,
                               const at::Tensor& draft_probs,
                               const at::Tensor& target_probs, Sampler& sampler);

// top1 - top2 of logits [V] (the greedy decision margin; a divergence between
// two float kernels is a numerical near-tie when this is <= 1e-4).
double Top2Margin(const at::Tensor& logits);

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_SAMPLING_H_
