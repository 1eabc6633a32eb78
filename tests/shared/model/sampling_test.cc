// Tests of shared/model/sampling.h on hand-computed 4-token distributions.
#include "shared/model/sampling.h"

#include <cmath>

#include <ATen/ATen.h>

#include "gtest/gtest.h"

namespace lede::model {
namespace {

at::Tensor Probs(std::vector<float> p) { return at::tensor(p, at::kFloat); }

// Greedy options give the one-hot of the argmax.
TEST(SamplingTest, GreedyWarpIsOneHot) {
  at::Tensor p = WarpedProbs(Probs({0.1f, 3.0f, -1.0f, 2.9f}), SamplingOptions{});
  EXPECT_TRUE(at::equal(p, Probs({0, 1, 0, 0})));
}

// Top-p keeps the smallest most-likely set reaching the mass, crossing token included.
TEST(SamplingTest, TopPKeepsTheCrossingToken) {
  // softmax(log p) = p = [0.4, 0.3, 0.2, 0.1]; top_p 0.6 keeps {0, 1}: 0.4 < 0.6 <= 0.7.
  at::Tensor logits = at::log(Probs({0.4f, 0.3f, 0.2f, 0.1f}));
  SamplingOptions o{1.0, 0.6, 0};
  at::Tensor p = WarpedProbs(logits, o);
  EXPECT_NEAR(p[0].item<float>(), 0.4 / 0.7, 1e-6);
  EXPECT_NEAR(p[1].item<float>(), 0.3 / 0.7, 1e-6);
  EXPECT_EQ(p[2].item<float>(), 0.0f);
  EXPECT_EQ(p[3].item<float>(), 0.0f);
}

// Temperature 2 takes the square root of the probabilities (renormalized).
TEST(SamplingTest, TemperatureScalesLogits) {
  at::Tensor logits = at::log(Probs({0.64f, 0.16f, 0.16f, 0.04f}));
  at::Tensor p = WarpedProbs(logits, SamplingOptions{2.0, 1.0, 0});
  const double z = 0.8 + 0.4 + 0.4 + 0.2;
  EXPECT_NEAR(p[0].item<float>(), 0.8 / z, 1e-6);
  EXPECT_NEAR(p[3].item<float>(), 0.2 / z, 1e-6);
}

// Greedy acceptance keeps the longest agreeing prefix and returns the verifier's token after it.
TEST(SamplingTest, GreedyAcceptanceLongestPrefix) {
  // Verifier argmaxes per row: 2, 0, 3, 1.
  at::Tensor target = at::zeros({4, 4});
  target[0][2] = 1;
  target[1][0] = 1;
  target[2][3] = 1;
  target[3][1] = 1;
  AcceptResult all = AcceptGreedy({2, 0, 3}, target);
  EXPECT_EQ(all.n_accepted, 3);
  EXPECT_EQ(all.next_token, 1);  // bonus token
  AcceptResult some = AcceptGreedy({2, 1, 3}, target);
  EXPECT_EQ(some.n_accepted, 1);
  EXPECT_EQ(some.next_token, 0);  // correction
  AcceptResult none = AcceptGreedy({0, 0, 3}, target);
  EXPECT_EQ(none.n_accepted, 0);
  EXPECT_EQ(none.next_token, 2);
}

// The same seed draws the same tokens.
TEST(SamplingTest, SamplerIsDeterministicForASeed) {
  Sampler a(42), b(42);
  at::Tensor p = Probs({0.25f, 0.25f, 0.25f, 0.25f});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.Sample(p), b.Sample(p));
}

// Speculative sampling preserves the target distribution: with draft q and
// target p over 4 tokens, the first emitted token (accepted draft or residual
// correction) is distributed as p. N = 20000 draws with seed 7; each
// frequency is within 5 standard errors sqrt(p(1-p)/N) of p.
TEST(SamplingTest, SpeculativeSamplingPreservesTargetDistribution) {
  const std::vector<float> p = {0.1f, 0.2f, 0.3f, 0.4f};
  const std::vector<float> q = {0.4f, 0.3f, 0.2f, 0.1f};
  at::Tensor target = at::stack({Probs(p), Probs({0.25f, 0.25f, 0.25f, 0.25f})});  // [K+1, V]
  at::Tensor draft = Probs(q).unsqueeze(0);                                          // [K, V]
  Sampler sampler(7);
  const int N = 20000;
  std::vector<int> counts(4, 0);
  int accepted = 0;
  for (int i = 0; i < N; ++i) {
    const int32_t x = sampler.Sample(draft[0]);
    AcceptResult r = AcceptSpeculative({x}, draft, target, sampler);
    accepted += static_cast<int>(r.n_accepted);
    counts[r.n_accepted == 1 ? x : r.next_token]++;
  }
  for (int k = 0; k < 4; ++k) {
    const double se = std::sqrt(p[k] * (1 - p[k]) / N);
    EXPECT_NEAR(counts[k] / static_cast<double>(N), p[k], 5 * se) << "token " << k;
  }
  // Acceptance probability is sum_x min(p, q) = 0.1 + 0.2 + 0.2 + 0.1 = 0.6.
  EXPECT_NEAR(accepted / static_cast<double>(N), 0.6, 5 * std::sqrt(0.24 / N));
}

// Top-2 margin is the gap between the two largest logits.
TEST(SamplingTest, Top2Margin) {
  EXPECT_NEAR(Top2Margin(Probs({1.0f, 5.0f, 4.5f, -2.0f})), 0.5, 1e-6);
}

}  // namespace
}  // namespace lede::model
