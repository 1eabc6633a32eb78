// ProbeSignals (the fused probe pass) against libtorch's log-softmax
// reference on random and adversarial logits.
#include "shared/model/exit_signals.h"

#include <cmath>
#include <random>
#include <vector>

#include <ATen/ATen.h>

#include "gtest/gtest.h"
#include "shared/model/cpu/cpu_kernels.h"

namespace lede::model {
namespace {

struct Reference {
  float top1_prob, top_k_nll, entropy, top1_nll, margin;
  int32_t top1;
};

Reference TorchReference(const std::vector<float>& x, int64_t k) {
  at::Tensor t = at::tensor(x);
  at::Tensor lp = at::log_softmax(t, 0);
  auto [top, idx] = at::topk(lp, std::max<int64_t>(k, 2));
  Reference r;
  r.top1 = static_cast<int32_t>(t.argmax().item<int64_t>());
  r.top1_nll = -top[0].item<float>();
  r.top1_prob = std::exp(top[0].item<float>());
  r.top_k_nll = -top.narrow(0, 0, k).mean().item<float>();
  r.entropy = -(lp.exp() * lp).sum().item<float>();
  r.margin = (top[0] - top[1]).item<float>();
  return r;
}

void ExpectMatches(const std::vector<float>& x, int64_t k) {
  const speculation::ExitSignals s = ProbeSignals(x.data(), static_cast<int64_t>(x.size()), k);
  const Reference r = TorchReference(x, k);
  EXPECT_EQ(s.top1, r.top1);
  EXPECT_NEAR(s.top1_prob, r.top1_prob, 1e-5);
  EXPECT_NEAR(s.top1_nll, r.top1_nll, 1e-4);
  EXPECT_NEAR(s.top_k_nll, r.top_k_nll, 1e-4);
  EXPECT_NEAR(s.entropy, r.entropy, 1e-4);
  EXPECT_NEAR(s.margin, r.margin, 1e-5);
  // The tensor entry point is the same computation.
  const speculation::ExitSignals t = ComputeExitSignals(at::tensor(x), k);
  EXPECT_EQ(t.top1, s.top1);
  EXPECT_FLOAT_EQ(t.entropy, s.entropy);
}

// The vectorized softmax sums against a double-precision loop, over the
// whole clamped range, every tail length and a shift above the maximum.
TEST(ExpSumsTest, MatchesDoublePrecision) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-100.0f, 0.0f);
  for (int64_t n : {1, 7, 15, 16, 17, 2048, 2051, 32000}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = u(rng);
    x[0] = 0.0f;
    for (float shift : {0.0f, 2.5f}) {
      double z = 0, zx = 0;
      for (float v : x) {
        const double d = static_cast<double>(v) - shift;
        const double e = d < -87.0 ? 0.0 : std::exp(d);
        z += e;
        zx += e * d;
      }
      double got_z = 0, got_zx = 0;
      cpu::ExpSums(x.data(), n, shift, &got_z, &got_zx);
      SCOPED_TRACE(testing::Message() << "n=" << n << " shift=" << shift);
      EXPECT_NEAR(got_z, z, 2e-6 * z);
      EXPECT_NEAR(got_zx, zx, 2e-6 * std::abs(zx) + 1e-30);
    }
  }
}

TEST(ProbeSignalsTest, MatchesLogSoftmaxOnRandomLogits) {
  std::mt19937_64 rng(5);
  for (int64_t V : {2, 7, 2048, 32000}) {
    for (float scale : {0.1f, 3.0f, 30.0f}) {
      std::normal_distribution<float> n(0.0f, scale);
      std::vector<float> x(static_cast<size_t>(V));
      for (float& v : x) v = n(rng);
      for (int64_t k : {1, 4, 8}) {
        if (k > V) continue;
        SCOPED_TRACE(testing::Message() << "V=" << V << " scale=" << scale << " k=" << k);
        ExpectMatches(x, k);
      }
    }
  }
}

TEST(ProbeSignalsTest, TiesAndExtremes) {
  // Ties: the lowest id wins, the margin is 0.
  ExpectMatches({1.0f, 3.0f, 3.0f, -2.0f}, 2);
  // One dominant logit: probability ~1, entropy ~0.
  std::vector<float> peaked(100, -50.0f);
  peaked[42] = 50.0f;
  const speculation::ExitSignals s = ProbeSignals(peaked.data(), 100, 4);
  EXPECT_EQ(s.top1, 42);
  EXPECT_NEAR(s.top1_prob, 1.0f, 1e-6);
  EXPECT_NEAR(s.entropy, 0.0f, 1e-5);
  // Uniform: entropy log V, every top-k NLL log V.
  std::vector<float> flat(64, 0.25f);
  const speculation::ExitSignals u = ProbeSignals(flat.data(), 64, 4);
  EXPECT_NEAR(u.entropy, std::log(64.0f), 1e-5);
  EXPECT_NEAR(u.top_k_nll, std::log(64.0f), 1e-5);
  EXPECT_EQ(u.top1, 0);
}

}  // namespace
}  // namespace lede::model
