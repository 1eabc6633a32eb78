// File: shared/speculation/cost_features.cc
#include "shared/speculation/cost_features.h"

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
