// File: shared/model/cost/cost_profiles.cc
#include "shared/model/cost/cost_profiles.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "shared/speculation/cost_features.h"

namespace lede::model::cost {
namespace {

class ProfileCostModel : public CostModel {
 public:
  ProfileCostModel(const speculation::CostFeatures& f, int64_t n_layers) : f_(f), n_layers_(n_layers) {}
  std::string name() const override { return "profile"; }
  double DraftToken(int64_t exit_layer) const override {
    return f_.probe + f_.layer * static_cast<double>(exit_layer) / static_cast<double>(n_layers_);
  }
  double Verify(int64_t, int64_t n_drafts) const override { return 1.0 + f_.verify * static_cast<double>(n_drafts); }
  double Probe() const override { return f_.probe; }

 private:
  speculation::CostFeatures f_;
  int64_t n_layers_;
};

}  // namespace

speculation::CostFeatures CostFeaturesOf(const CostModel& cost, int64_t n_layers, int64_t max_draft_len) {
  speculation::CostTables t;
  t.probe = cost.ControlledProbe();
  if (n_layers >= 2) {
    t.draft.assign(static_cast<size_t>(n_layers) + 1, 0.0);
    for (int64_t l = 1; l < n_layers; ++l) t.draft[static_cast<size_t>(l)] = cost.ControlledDraftToken(l);
  }
  if (max_draft_len >= 1 && n_layers >= 2) {
    t.verify.assign(static_cast<size_t>(max_draft_len) + 1, 0.0);
    t.verify[0] = cost.Step();
    const int64_t middle = speculation::MiddleExitLayer(n_layers);
    for (int64_t k = 1; k <= max_draft_len; ++k) t.verify[static_cast<size_t>(k)] = cost.Verify(middle, k);
  }
  return speculation::CostFeaturesOfTables(t);
}

speculation::CostFeatures CostFeaturesOfCalibration(const Calibration& calibration, int64_t n_layers,
                                                    int64_t max_draft_len) {
  Calibration steps = calibration;
  steps.round_us.clear();
  steps.ar_step_us = 0;
  const speculation::CostFeatures apart = CostFeaturesOf(*MakeMeasuredCostModel(steps), n_layers, max_draft_len);
  const ServedStepCosts& in_context = calibration.context_steps;
  return speculation::MeasuredStepFeatures(in_context.draft_step_s, in_context.verify_s,
                                           in_context.verify_intercept_s, in_context.verify_slope_s, apart);
}

StatusOr<std::unique_ptr<CostModel>> MakeProfileCostModel(const speculation::CostFeatures& f, int64_t n_layers) {
  if (n_layers < 2) return InvalidArgumentError("n_layers: " + std::to_string(n_layers) + " (want >= 2)");
  if (Status s = speculation::CheckCostFeatures(f, "cost profile "); !s.ok()) return s;
  return std::unique_ptr<CostModel>(std::make_unique<ProfileCostModel>(f, n_layers));
}

StatusOr<speculation::CostFeatures> ParseCostFeatures(const std::string& text) {
  std::vector<float> v;
  size_t start = 0;
  while (start <= text.size() && v.size() < 4) {
    const size_t end = std::min(text.find(':', start), text.size());
    const std::string part = text.substr(start, end - start);
    char* stop = nullptr;
    const double x = part.empty() ? -1.0 : std::strtod(part.c_str(), &stop);
    if (part.empty() || stop != part.c_str() + part.size() || !std::isfinite(x) || x < 0) {
      return InvalidArgumentError("cost profile \"" + text + "\": want probe:layer:verify, three numbers >= 0");
    }
    v.push_back(static_cast<float>(x));
    start = end + 1;
  }
  if (v.size() != 3) {
    return InvalidArgumentError("cost profile \"" + text + "\": want probe:layer:verify, three numbers >= 0");
  }
  return speculation::CostFeatures{v[0], v[1], v[2]};
}

}  // namespace lede::model::cost
