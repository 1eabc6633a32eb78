// The ceilings of trainer/ceilings.h on synthetic shadow traces: the
// belief-optimal policy with perfect beliefs is the hindsight oracle, it acts
// on its beliefs and pays for what really happens (hand-computed rounds), it
// never costs less than the oracle, and the calibrated table is the
// acceptance model's prediction at every layer and position.
#include "trainer/ceilings.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/calibrated_rule.h"

namespace lede::trainer {
namespace {

// Drafts at layer l cost (l + 1) / (L + 1) of a step (l blocks and a head of
// one block), a verification of any width one step: the accelerator model's
// shape, with numbers easy to follow by hand.
class LinearCost : public model::cost::CostModel {
 public:
  explicit LinearCost(int32_t n_layers) : n_layers_(n_layers) {}
  std::string name() const override { return "linear"; }
  double DraftToken(int64_t l) const override { return (l + 1.0) / (n_layers_ + 1.0); }
  double Verify(int64_t, int64_t) const override { return 1.0; }
  double Probe() const override { return 1.0 / (n_layers_ + 1.0); }

 private:
  int32_t n_layers_;
};

// A trace of N targets over L layers where accepted[l][t] says whether the
// exit at layer l drafts target[t]; the full model (layer L) always does.
ShadowTrace MakeTrace(const std::vector<std::vector<bool>>& accepted, int32_t n_layers) {
  ShadowTrace t;
  t.n_layers = n_layers;
  const size_t N = accepted[1].size();
  t.prompt = {1, 2, 3};
  for (size_t i = 0; i < N; ++i) t.target.push_back(static_cast<int32_t>(10 + i % 7));
  t.max_new_tokens = static_cast<int64_t>(N);
  for (int32_t l = 1; l <= n_layers; ++l) {
    std::vector<speculation::ExitSignals> row(N);
    for (size_t i = 0; i < N; ++i) {
      const bool ok = l == n_layers || accepted[l][i];
      row[i].top1 = ok ? t.target[i] : 999;
      row[i].top1_prob = ok ? 0.8f : 0.3f;
      row[i].margin = ok ? 2.0f : 0.2f;
      row[i].entropy = ok ? 0.5f : 2.0f;
      row[i].top1_nll = 0.2f;
    }
    t.probes.push_back(std::move(row));
  }
  return t;
}

std::vector<std::vector<bool>> RandomAcceptance(std::mt19937& rng, int32_t n_layers, size_t n) {
  std::vector<std::vector<bool>> a(n_layers, std::vector<bool>(n, false));
  for (int32_t l = 1; l < n_layers; ++l) {
    std::bernoulli_distribution accept(0.35 + 0.5 * l / n_layers);
    for (size_t i = 0; i < n; ++i) a[l][i] = accept(rng);
  }
  return a;
}

AcceptanceTable Constant(int32_t n_layers, size_t n, double p) {
  AcceptanceTable table(n_layers, std::vector<double>(n, 0.0));
  for (int32_t l = 1; l < n_layers; ++l) std::fill(table[l].begin() + 1, table[l].end(), p);
  return table;
}

TEST(CeilingsTest, PerfectBeliefsAreTheHindsightOracle) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int32_t L = 6;
    const size_t N = 40 + trial;
    const auto accepted = RandomAcceptance(rng, L, N);
    const ShadowTrace t = MakeTrace(accepted, L);
    AcceptanceTable perfect(L, std::vector<double>(N, 0.0));
    for (int32_t l = 1; l < L; ++l) {
      for (size_t i = 1; i < N; ++i) perfect[l][i] = accepted[l][i] ? 1.0 : 0.0;
    }
    const LinearCost cost(L);
    for (int32_t d_max : {1, 3, 8}) {
      const TraceCost oracle = HindsightOracleCost(t, d_max, cost);
      const TraceCost belief = BeliefOptimalCost(t, perfect, d_max, cost);
      EXPECT_EQ(belief.tokens, static_cast<double>(N - 1));
      EXPECT_EQ(oracle.tokens, static_cast<double>(N - 1));
      EXPECT_NEAR(belief.cost, oracle.cost, 1e-9) << "trial " << trial << " D_max " << d_max;
      EXPECT_LT(oracle.cost, static_cast<double>(N - 1)) << "the oracle drafts where drafts are accepted";
    }
  }
}

TEST(CeilingsTest, NoBeliefsBeatTheOracle) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int trial = 0; trial < 20; ++trial) {
    const int32_t L = 5;
    const size_t N = 50;
    const ShadowTrace t = MakeTrace(RandomAcceptance(rng, L, N), L);
    AcceptanceTable noisy = Constant(L, N, 0.0);
    for (int32_t l = 1; l < L; ++l) {
      for (size_t i = 1; i < N; ++i) noisy[l][i] = unit(rng);
    }
    const LinearCost cost(L);
    EXPECT_GE(BeliefOptimalCost(t, noisy, 6, cost).cost, HindsightOracleCost(t, 6, cost).cost - 1e-9);
  }
}

// One exit layer (L = 2), a draft costs 2/3 and a verification 1; four targets:
// target[1..3] to emit. Worked by hand (v[i]: expected cost from i).
TEST(CeilingsTest, ThePolicyActsOnItsBeliefsAndPaysWhatHappens) {
  const int32_t L = 2;
  const LinearCost cost(L);  // DraftToken(1) = 2/3
  const double c = 2.0 / 3.0;
  // Confident beliefs, p = 0.9: v[3] = 1 (only a step fits);
  // v[2] = min(1 + 1, c + 1 + 0.1 * v[3]) = c + 1.1 (d = 1);
  // at i = 1, d = 2 costs 2c + 1 + 0.1 v[2] + 0.09 v[3], the least: one
  // round of two drafts, then whatever the outcome asks for.
  const AcceptanceTable confident = Constant(L, 4, 0.9);
  {
    const ShadowTrace all = MakeTrace({{}, {true, true, true, true}}, L);
    const TraceCost r = BeliefOptimalCost(all, confident, 8, cost);
    EXPECT_EQ(r.tokens, 3.0);
    EXPECT_NEAR(r.cost, 2 * c + 1, 1e-12);  // both drafts accepted: done in one round
  }
  {
    const ShadowTrace first_rejected = MakeTrace({{}, {true, false, true, true}}, L);
    const TraceCost r = BeliefOptimalCost(first_rejected, confident, 8, cost);
    // Round 1 (2 drafts) emits target[1] only; from i = 2 one draft, accepted.
    EXPECT_NEAR(r.cost, (2 * c + 1) + (c + 1), 1e-12);
  }
  {
    // Doubtful beliefs, p = 0.05: every draft is expected to be wasted, so the
    // policy steps autoregressively even though every draft would have been
    // accepted: it pays by what it believes, not by what it could have known.
    const ShadowTrace all = MakeTrace({{}, {true, true, true, true}}, L);
    const TraceCost r = BeliefOptimalCost(all, Constant(L, 4, 0.05), 8, cost);
    EXPECT_NEAR(r.cost, 3.0, 1e-12);
    EXPECT_NEAR(HindsightOracleCost(all, 8, cost).cost, 2 * c + 1, 1e-12);
  }
}

TEST(CeilingsTest, CalibratedTableIsTheModelsPredictionAtEveryLayerAndPosition) {
  std::mt19937 rng(3);
  const int32_t L = 4;
  std::vector<ShadowTrace> traces;
  for (int i = 0; i < 6; ++i) traces.push_back(MakeTrace(RandomAcceptance(rng, L, 30), L));
  auto models = FitAcceptanceModels(traces, 8);
  ASSERT_TRUE(models.ok()) << models.status().message();
  const AcceptanceTable p = CalibratedAcceptanceTable(traces[0], *models->current, 8);
  const auto x = TraceAcceptanceFeatures(traces[0], 8);
  ASSERT_EQ(p.size(), static_cast<size_t>(L));
  double accepted_mean = 0, rejected_mean = 0;
  int n_accepted = 0, n_rejected = 0;
  for (int32_t l = 1; l < L; ++l) {
    ASSERT_EQ(p[l].size(), traces[0].target.size());
    for (size_t i = 1; i < p[l].size(); ++i) {
      EXPECT_DOUBLE_EQ(p[l][i], models->current->Predict(l, x[l][i]));
      (traces[0].Accepts(l, static_cast<int64_t>(i)) ? accepted_mean : rejected_mean) += p[l][i];
      (traces[0].Accepts(l, static_cast<int64_t>(i)) ? n_accepted : n_rejected) += 1;
    }
  }
  // The synthetic signals separate the outcomes, so the fit must as well.
  ASSERT_GT(n_accepted, 0);
  ASSERT_GT(n_rejected, 0);
  EXPECT_GT(accepted_mean / n_accepted, 0.9);
  EXPECT_LT(rejected_mean / n_rejected, 0.1);
}

}  // namespace
}  // namespace lede::trainer
