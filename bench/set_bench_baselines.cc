// SetBench (internal/set_bench.h): the baseline families (static,
// threshold, calibrated, DEL, AdaEDL) and their tuning by exact replay on the
// tuning split, per cost model; --static-configs' untuned rows.
#include "bench/internal/set_bench.h"

#include <cstdio>
#include <memory>

#include "policy/controllers.h"
#include "shared/flags/flags.h"
#include "shared/status/status_macros.h"

namespace lede::bench::internal {

using flags::SplitList;
using trainer::RoundCostsOf;

GenerateOptions SetBench::SpecWith(std::vector<int32_t> layers) const {
  GenerateOptions o = adaptive_;
  o.decision_spec.candidate_layers = std::move(layers);
  return o;
}

Status SetBench::Tune(const std::string& method, const ConfigsFor& configs_for) {
  for (const model::cost::CostModel* cm : cost_models_) {
    std::vector<Config> configs = configs_for(*cm);
    size_t best = 0;
    double best_speedup = -1;
    for (size_t i = 0; i < configs.size(); ++i) {
      trainer::SimulatedMethod m;
      m.mode = configs[i].options.mode;
      m.exit_layer = static_cast<int32_t>(configs[i].options.exit_layer);
      m.draft_len = static_cast<int32_t>(configs[i].options.draft_len);
      m.spec = configs[i].options.decision_spec;
      LEDE_ASSIGN_OR_RETURN(std::vector<model::RoundRecord> rounds,
                            trainer::SimulatedRounds(tune_traces_, m, configs[i].make));
      const double s = cm->PredictedSpeedup(rounds);
      if (s > best_speedup) best_speedup = s, best = i;
    }
    const Config& b = configs[best];
    ControllerFactory factory;
    if (b.make) factory = [make = b.make](int64_t i) { return make(i); };
    jobs_.push_back({method + " (best " + cm->name() + ")", b.label, b.options, factory, ""});
    PrintProgress(err_, method + " tuned (" + std::to_string(configs.size()) + " configs)", 1, 1);
    err_ << "\n";
  }
  return OkStatus();
}

std::vector<SetBench::Config> SetBench::StaticConfigs() const {
  std::vector<Config> v;
  for (int32_t e = 1; e < L_; ++e) {
    for (int32_t d = 1; d <= static_max_draft_; ++d) {
      GenerateOptions o = ar_;
      o.mode = model::SpeculationMode::kStatic;
      o.exit_layer = e;
      o.draft_len = d;
      o.decision_spec.max_draft_len = static_max_draft_;
      v.push_back({"E=" + std::to_string(e) + " D=" + std::to_string(d), o, nullptr});
    }
  }
  return v;
}

std::vector<SetBench::Config> SetBench::ThresholdConfigs() const {
  std::vector<Config> v;
  for (float lambda : {0.3f, 0.5f, 0.7f, 0.8f, 0.9f, 0.95f}) {
    for (float tau : {0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f}) {
      char buf[48];
      std::snprintf(buf, sizeof(buf), "lambda=%.2f tau=%.2f", lambda, tau);
      v.push_back({buf, adaptive_, [lambda, tau](int64_t) {
                     return std::make_unique<policy::ThresholdExitController>(lambda, tau);
                   }});
    }
  }
  return v;
}

std::vector<SetBench::Config> SetBench::CalibratedConfigs(const AcceptanceModels& cal, const model::cost::CostModel& cm) const {
  std::vector<Config> v;
  auto costs = RoundCostsOf(cm, L_, D_);
  for (bool lookahead : {true, false}) {
    for (int32_t e = 1; e < L_; ++e) {
      for (double rho : trainer::kCalibratedRhos) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "E=%d rho=%.1f%s", e, rho, lookahead ? " lookahead" : "");
        GenerateOptions o = SpecWith({e});
        o.decision_spec.lookahead_probe = lookahead;
        v.push_back({buf, o, [cal, e, rho, costs, lookahead](int64_t) {
                       return std::make_unique<policy::CalibratedStopController>(cal.current, e, rho, costs,
                                                                                 lookahead, cal.next);
                     }});
      }
    }
  }
  return v;
}

std::vector<SetBench::Config> SetBench::DelConfigs(const model::cost::CostModel& cm) const {
  std::vector<Config> v;
  auto costs = RoundCostsOf(cm, L_, D_);
  std::vector<double> rates(L_ + 1, 0.0);
  for (int32_t l = 1; l < L_; ++l) rates[l] = calibration_.current->BaseRate(l);
  const std::vector<int32_t> all_layers = all_layers_;
  const int32_t D = D_;
  for (float tau : {0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "tau=%.1f", tau);
    v.push_back({buf, SpecWith(all_layers_), [rates, all_layers, D, tau, costs](int64_t) {
                   return std::make_unique<policy::DelController>(rates, all_layers, D, tau, costs);
                 }});
  }
  return v;
}

std::vector<SetBench::Config> SetBench::AdaEdlConfigs() const {
  std::vector<Config> v;
  for (int32_t e = 1; e < L_; ++e) {
    for (float gamma : {0.1f, 0.25f, 0.5f}) {
      for (float lambda : {0.2f, 0.35f, 0.5f, 0.65f}) {
        char buf[48];
        std::snprintf(buf, sizeof(buf), "E=%d gamma=%.2f lambda=%.2f", e, gamma, lambda);
        v.push_back({buf, SpecWith({e}), [e, gamma, lambda](int64_t) {
                       return std::make_unique<policy::AdaEdlController>(e, gamma, lambda);
                     }});
      }
    }
  }
  return v;
}

std::vector<std::pair<std::string, SetBench::ConfigsFor>> SetBench::Families() const {
  std::vector<std::pair<std::string, ConfigsFor>> families;
  if (Has("static")) families.emplace_back("static", [this](const model::cost::CostModel&) { return StaticConfigs(); });
  if (Has("threshold")) {
    families.emplace_back("threshold", [this](const model::cost::CostModel&) { return ThresholdConfigs(); });
  }
  if (Has("calibrated")) {
    families.emplace_back("calibrated",
                          [this](const model::cost::CostModel& cm) { return CalibratedConfigs(calibration_, cm); });
  }
  if (Has("del")) families.emplace_back("del", [this](const model::cost::CostModel& cm) { return DelConfigs(cm); });
  if (Has("adaedl")) families.emplace_back("adaedl", [this](const model::cost::CostModel&) { return AdaEdlConfigs(); });
  return families;
}

Status SetBench::AddGivenStatic(const std::string& fixed_static) {
  for (const std::string& item : SplitList(fixed_static)) {
    const size_t colon = item.find(':');
    int32_t e = 0, d = 0;
    if (colon == std::string::npos || std::sscanf(item.c_str(), "%d:%d", &e, &d) != 2 || e < 1 || e >= L_ ||
        d < 1 || d > static_max_draft_) {
      return InvalidArgumentError("--static-configs: \"" + item + "\" is not E:D with E in [1, " +
                                  std::to_string(L_ - 1) + "] and D in [1, " + std::to_string(static_max_draft_) +
                                  "]");
    }
    GenerateOptions o = ar_;
    o.mode = model::SpeculationMode::kStatic;
    o.exit_layer = e;
    o.draft_len = d;
    jobs_.push_back({"static (given)", "E=" + std::to_string(e) + " D=" + std::to_string(d), o, nullptr, ""});
  }
  return OkStatus();
}

}  // namespace lede::bench::internal
