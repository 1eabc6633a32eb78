// File: shared/model/cost/internal/median.h
//
// The median the cost models (cost_model.cc) and the calibration
// (calibration.cc) both take of their timings. Not API.
#ifndef LEDE_SHARED_MODEL_COST_INTERNAL_MEDIAN_H_
#define LEDE_SHARED_MODEL_COST_INTERNAL_MEDIAN_H_

#include <algorithm>
#include <vector>

namespace lede::model::cost::internal {

// The median of `v` (the upper one for an even count); 0 when empty.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace lede::model::cost::internal

#endif  // LEDE_SHARED_MODEL_COST_INTERNAL_MEDIAN_H_
