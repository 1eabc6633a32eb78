// File: shared/speculation/cost_features.cc
#include "shared/speculation/cost_features.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

namespace lede::speculation {
namespace {

bool Known(double x) { return std::isfinite(x) && x > 0; }

// Least-squares line ys[i] ~ intercept + slope i over the known entries in
// [first, last]; *n gets their count (slope and intercept 0 for fewer than two).
struct Line {
  double intercept = 0, slope = 0;
  int n = 0;
};
Line Fit(const std::vector<double>& ys, size_t first, size_t last) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  Line line;
  for (size_t i = first; i <= last && i < ys.size(); ++i) {
    if (!Known(ys[i])) continue;
    const double x = static_cast<double>(i);
    sx += x, sy += ys[i], sxx += x * x, sxy += x * ys[i];
    ++line.n;
  }
  const double denom = line.n * sxx - sx * sx;
  if (line.n < 2 || denom <= 0) return line;
  line.slope = (line.n * sxy - sx * sy) / denom;
  line.intercept = (sy - line.slope * sx) / line.n;
  return line;
}

}  // namespace

CostFeatures CostFeaturesOfTables(const CostTables& t) {
  CostFeatures f;
  const double probe = Known(t.probe) ? t.probe : 0.0;
  f.probe = static_cast<float>(probe);
  double unexplained = 0;  // per-draft cost a draft's blocks and head do not explain
  if (t.draft.size() >= 2) {
    const size_t L = t.draft.size() - 1;
    const Line draft = Fit(t.draft, 1, L - 1);
    double layer = static_cast<double>(L) * draft.slope;
    if (draft.n == 1) {
      for (size_t l = 1; l < L; ++l) {
        if (Known(t.draft[l])) layer = static_cast<double>(L) * (t.draft[l] - probe) / static_cast<double>(l);
      }
    } else if (draft.n >= 2) {
      unexplained = draft.intercept - probe;
    }
    f.layer = static_cast<float>(layer > 0 ? layer : 0.0);
  }
  double verify = 0;
  if (!t.verify.empty()) verify = Fit(t.verify, 0, t.verify.size() - 1).slope;
  verify = (verify > 0 ? verify : 0.0) + (unexplained > 0 ? unexplained : 0.0);
  f.verify = static_cast<float>(verify);
  return f;
}

double Median(std::vector<double> xs) {
  if (xs.empty()) return 0.0;
  const size_t mid = xs.size() / 2;
  std::nth_element(xs.begin(), xs.begin() + mid, xs.end());
  const double hi = xs[mid];
  if (xs.size() % 2 == 1) return hi;
  const double lo = *std::max_element(xs.begin(), xs.begin() + mid);
  return 0.5 * (lo + hi);
}

std::pair<double, double> TheilSenLine(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = std::min(x.size(), y.size());
  std::vector<double> slopes;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      if (x[i] != x[j]) slopes.push_back((y[j] - y[i]) / (x[j] - x[i]));
    }
  }
  if (slopes.empty()) return {0.0, 0.0};
  const double slope = Median(std::move(slopes));
  std::vector<double> intercepts(n);
  for (size_t i = 0; i < n; ++i) intercepts[i] = y[i] - slope * x[i];
  return {Median(std::move(intercepts)), slope};
}

CostFeatures MeasuredStepFeatures(const std::vector<double>& draft_step_s, const std::vector<double>& verify_s,
                                  double verify_intercept_s, double verify_slope_s, const CostFeatures& prior) {
  double unit = 0;
  if (!verify_s.empty() && Known(verify_s[0])) {
    unit = verify_s[0];
  } else if (Known(verify_intercept_s)) {
    unit = verify_intercept_s;
  }
  if (unit <= 0) return prior;
  CostTables t;
  t.probe = prior.probe;
  int n_draft = 0, n_verify = 0;
  // Exit layers [1, M] only: the draft line of the shallow half, where a
  // self-speculative policy drafts (deeper entries, timed by a calibration
  // but rarely served, would tilt the line: past the layers whose weights
  // stay in cache, a draft step costs a step's share again).
  const size_t middle = draft_step_s.size() >= 2 ? static_cast<size_t>(MiddleExitLayer(
                                                       static_cast<int64_t>(draft_step_s.size()) - 1))
                                                 : 0;
  for (size_t l = 0; l < draft_step_s.size(); ++l) {
    const double x = l >= 1 && l <= middle ? draft_step_s[l] : 0.0;
    t.draft.push_back(Known(x) ? x / unit : 0.0);
    if (Known(x)) ++n_draft;
  }
  for (double x : verify_s) {
    t.verify.push_back(Known(x) ? x / unit : 0.0);
    if (Known(x)) ++n_verify;
  }
  CostFeatures f = CostFeaturesOfTables(t);
  if (n_draft == 0) f.layer = prior.layer;
  const bool fitted = verify_slope_s != 0 && std::isfinite(verify_slope_s);
  if (fitted) {
    f.verify = static_cast<float>(std::max(0.0, verify_slope_s / unit));
  } else if (n_verify < 2) {
    f.verify = prior.verify;
  }
  return f;
}

Status CheckCostFeatures(const CostFeatures& f, const std::string& field_prefix) {
  const float values[] = {f.probe, f.layer, f.verify};
  const char* names[] = {"probe", "layer", "verify"};
  for (int i = 0; i < 3; ++i) {
    if (!std::isfinite(values[i]) || values[i] < 0) {
      return InvalidArgumentError(field_prefix + names[i] + ": " + std::to_string(values[i]) +
                                  " is not a finite cost >= 0");
    }
  }
  return OkStatus();
}

}  // namespace lede::speculation
