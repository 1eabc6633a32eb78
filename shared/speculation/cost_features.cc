// File: shared/speculation/cost_features.cc
#include "shared/speculation/cost_features.h"

#include <cmath>
#include <cstddef>

namespace lede::speculation {
namespace {

bool Known(double x) { return std::isfinite(x) && x > 0; }

// Least-squares slope of ys[i] on i over the known entries in [first, last];
// sets *n to their count (the slope is 0 for fewer than two).
double Slope(const std::vector<double>& ys, size_t first, size_t last, int* n) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  *n = 0;
  for (size_t i = first; i <= last && i < ys.size(); ++i) {
    if (!Known(ys[i])) continue;
    const double x = static_cast<double>(i);
    sx += x, sy += ys[i], sxx += x * x, sxy += x * ys[i];
    ++*n;
  }
  if (*n < 2) return 0.0;
  const double denom = *n * sxx - sx * sx;
  return denom > 0 ? (*n * sxy - sx * sy) / denom : 0.0;
}

}  // namespace

CostFeatures CostFeaturesOfTables(const CostTables& t) {
  CostFeatures f;
  const double probe = Known(t.probe) ? t.probe : 0.0;
  f.probe = static_cast<float>(probe);
  if (t.draft.size() >= 2) {
    const size_t L = t.draft.size() - 1;
    int n = 0;
    double layer = static_cast<double>(L) * Slope(t.draft, 1, L - 1, &n);
    if (n == 1) {
      for (size_t l = 1; l < L; ++l) {
        if (Known(t.draft[l])) layer = static_cast<double>(L) * (t.draft[l] - probe) / static_cast<double>(l);
      }
    }
    f.layer = static_cast<float>(layer > 0 ? layer : 0.0);
  }
  if (!t.verify.empty()) {
    int n = 0;
    const double verify = Slope(t.verify, 0, t.verify.size() - 1, &n);
    f.verify = static_cast<float>(verify > 0 ? verify : 0.0);
  }
  return f;
}

}  // namespace lede::speculation
