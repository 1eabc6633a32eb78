#include "policy/acceptance_model.h"

#include <algorithm>
#include <cmath>

namespace lede::policy {
namespace {

constexpr int kD = kAcceptanceFeatureDim;

double Sigmoid(double z) { return z >= 0 ? 1.0 / (1.0 + std::exp(-z)) : std::exp(z) / (1.0 + std::exp(z)); }

double Dot(const AcceptanceFeatures& w, const AcceptanceFeatures& x) {
  double s = 0;
  for (int i = 0; i < kD; ++i) s += w[i] * x[i];
  return s;
}

// Solves A w = b (A symmetric positive definite, kD x kD) by Gaussian
// elimination with partial pivoting; returns false if singular.
bool Solve(std::array<std::array<double, kD>, kD> a, AcceptanceFeatures b, AcceptanceFeatures& out) {
  for (int c = 0; c < kD; ++c) {
    int p = c;
    for (int r = c + 1; r < kD; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    }
    if (std::abs(a[p][c]) < 1e-12) return false;
    std::swap(a[p], a[c]);
    std::swap(b[p], b[c]);
    for (int r = c + 1; r < kD; ++r) {
      const double f = a[r][c] / a[c][c];
      for (int k = c; k < kD; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  for (int c = kD - 1; c >= 0; --c) {
    double s = b[c];
    for (int k = c + 1; k < kD; ++k) s -= a[c][k] * out[k];
    out[c] = s / a[c][c];
  }
  return true;
}

}  // namespace

AcceptanceFeatures AcceptanceFeaturesOf(float top1_prob, float margin, float entropy, float trace_nll,
                                        float lookup_match, float trigram_seen) {
  return {top1_prob, std::min(margin, 16.0f) / 8.0, entropy / 4.0, trace_nll / 4.0, lookup_match, trigram_seen, 1.0};
}

StatusOr<AcceptanceModel> AcceptanceModel::Fit(const std::vector<std::vector<AcceptanceSample>>& by_layer,
                                               double l2, int iterations) {
  AcceptanceModel m;
  m.weights_.assign(by_layer.size(), AcceptanceFeatures{});
  m.base_rate_.assign(by_layer.size(), 0.5);
  int64_t total = 0, positives = 0;
  for (const auto& s : by_layer) {
    for (const AcceptanceSample& x : s) total += 1, positives += x.accepted ? 1 : 0;
  }
  if (total == 0) return InvalidArgumentError("acceptance model: no samples");
  const double overall = (positives + 0.5) / (total + 1.0);
  for (size_t l = 0; l < by_layer.size(); ++l) {
    const auto& samples = by_layer[l];
    AcceptanceFeatures& w = m.weights_[l];
    if (samples.empty()) {
      m.base_rate_[l] = overall;
      w[kD - 1] = std::log(overall / (1 - overall));
      continue;
    }
    int64_t pos = 0;
    for (const AcceptanceSample& x : samples) pos += x.accepted ? 1 : 0;
    m.base_rate_[l] = static_cast<double>(pos) / samples.size();
    const double prior = (pos + 0.5) / (samples.size() + 1.0);
    w[kD - 1] = std::log(prior / (1 - prior));
    for (int it = 0; it < iterations; ++it) {
      std::array<std::array<double, kD>, kD> h{};
      AcceptanceFeatures g{};
      for (const AcceptanceSample& x : samples) {
        const double p = Sigmoid(Dot(w, x.x));
        const double r = (x.accepted ? 1.0 : 0.0) - p, v = std::max(p * (1 - p), 1e-9);
        for (int i = 0; i < kD; ++i) {
          g[i] += r * x.x[i];
          for (int j = 0; j < kD; ++j) h[i][j] += v * x.x[i] * x.x[j];
        }
      }
      const double n = static_cast<double>(samples.size());
      for (int i = 0; i < kD; ++i) {
        const double reg = i == kD - 1 ? 0.0 : l2 * n;  // the bias is not penalized
        g[i] -= reg * w[i];
        h[i][i] += reg + 1e-9 * n;
      }
      AcceptanceFeatures step{};
      if (!Solve(h, g, step)) break;
      double change = 0;
      for (int i = 0; i < kD; ++i) w[i] += step[i], change = std::max(change, std::abs(step[i]));
      if (change < 1e-7) break;
    }
  }
  return m;
}

double AcceptanceModel::Predict(int32_t layer, const AcceptanceFeatures& x) const {
  if (layer < 0 || layer >= static_cast<int32_t>(weights_.size())) return 0.5;
  return std::clamp(Sigmoid(Dot(weights_[layer], x)), 1e-6, 1 - 1e-6);
}

double AcceptanceModel::BaseRate(int32_t layer) const {
  if (layer < 0 || layer >= static_cast<int32_t>(base_rate_.size())) return 0.5;
  return base_rate_[layer];
}

}  // namespace lede::policy
