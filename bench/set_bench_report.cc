// SetBench (internal/set_bench.h): the ceilings on the evaluation split,
// the rows of the table, the printed table and the set's JSON report.
#include "bench/internal/set_bench.h"

#include <cstdio>

#include "shared/model/cost/cost_profiles.h"
#include "trainer/ceilings.h"

namespace lede::bench::internal {

using trainer::FitAcceptanceModels;

nlohmann::json SetBench::Ceilings(const model::cost::CostModel* served) const {
  nlohmann::json out;
  auto in_sample = FitAcceptanceModels(eval_traces_, c_.spec.trace_window);
  auto tuning = FitAcceptanceModels(tune_traces_, c_.spec.trace_window);
  std::vector<trainer::AcceptanceTable> in_tables, tuning_tables;
  for (const trainer::ShadowTrace& t : eval_traces_) {
    if (in_sample.ok()) in_tables.push_back(CalibratedAcceptanceTable(t, *in_sample->current, c_.spec.trace_window));
    if (tuning.ok()) tuning_tables.push_back(CalibratedAcceptanceTable(t, *tuning->current, c_.spec.trace_window));
  }
  // A per-trace cost pooled over the evaluation traces: tokens / cost.
  auto pooled = [&](const std::function<trainer::TraceCost(size_t)>& cost_of) {
    trainer::TraceCost sum;
    for (size_t i = 0; i < eval_traces_.size(); ++i) {
      const trainer::TraceCost c = cost_of(i);
      sum.tokens += c.tokens;
      sum.cost += c.cost;
    }
    return sum.cost > 0 ? sum.tokens / sum.cost : 1.0;
  };
  // The belief-optimal policy under one table per trace (none: no fit, 1.0).
  auto belief = [&](const std::vector<trainer::AcceptanceTable>& tables, const model::cost::CostModel& cm) {
    if (tables.empty()) return 1.0;
    return pooled([&](size_t i) {
      return trainer::BeliefOptimalCost(eval_traces_[i], tables[i], static_max_draft_, cm);
    });
  };
  std::vector<const model::cost::CostModel*> pricings = cost_models_;
  if (served != nullptr) pricings.push_back(served);
  for (const model::cost::CostModel* cm : pricings) {
    out["hindsight_oracle"][cm->name()] =
        pooled([&](size_t i) { return trainer::HindsightOracleCost(eval_traces_[i], static_max_draft_, *cm); });
    out["belief_in_sample"][cm->name()] = belief(in_tables, *cm);
    out["belief_tuning_fit"][cm->name()] = belief(tuning_tables, *cm);
    double best = 0;
    if (in_sample.ok()) {
      for (const Config& cfg : CalibratedConfigs(*in_sample, *cm)) {
        auto s = trainer::SimulatedSpeedup(eval_traces_, cfg.options.decision_spec, cfg.make, *cm);
        if (s.ok()) best = std::max(best, *s);
      }
    }
    out["calibrated"][cm->name()] = best;
  }
  return out;
}

nlohmann::json SetBench::Report(const std::vector<Totals>& totals) const {
  double ar_tps = 0;
  for (size_t j = 0; j < jobs_.size(); ++j) {
    if (jobs_[j].method == "ar") ar_tps = totals[j].tokens_per_s();
  }
  if (ar_tps <= 0) ar_tps = ar_eval_.tokens_per_s();
  // The cost model of the steps this run timed of itself (what a model
  // service serving these requests would meter), beside the calibration's.
  const model::cost::ServedStepCosts run_costs =
      run_steps_.Costs(model::cost::HeadLayerEquivalents(c_.model->config()));
  const StatusOr<std::unique_ptr<model::cost::CostModel>> served =
      model::cost::MakeServedCostModel(c_.model->config(), run_costs);
  nlohmann::json rows = nlohmann::json::array();
  for (size_t j = 0; j < jobs_.size(); ++j) {
    const Totals& t = totals[j];
    rows.push_back({{"method", jobs_[j].method},
                    {"config", jobs_[j].config},
                    {"tokens_per_s", t.tokens_per_s()},
                    {"measured_speedup", t.tokens_per_s() / ar_tps},
                    {"predicted_speedup_accelerator", c_.accelerator->PredictedSpeedup(t.rounds)},
                    {"predicted_speedup_measured", c_.measured->PredictedSpeedup(t.rounds)},
                    {"predicted_speedup_served", served.ok() ? (*served)->PredictedSpeedup(t.rounds) : 0.0},
                    {"acceptance_rate", t.acceptance()},
                    {"tokens_per_round", t.tokens_per_round()},
                    {"mean_exit_layer", t.mean_exit()},
                    {"mean_draft_len", t.mean_draft()},
                    {"exact_match_rate", t.prompts ? static_cast<double>(t.exact) / t.prompts : 0.0},
                    {"step_seconds",
                     {{"decode", t.decode_s},
                      {"rounds", step_seconds_[j].rounds},
                      {"round", step_seconds_[j].round_s},
                      {"draft", step_seconds_[j].draft_s},
                      {"verify", step_seconds_[j].verify_s}}}});
  }
  const nlohmann::json ceilings = Ceilings(served.ok() ? served->get() : nullptr);
  PrintTable(rows, ceilings, ar_tps);
  return {{"rows", rows},
          {"hindsight_oracle", ceilings["hindsight_oracle"]},
          {"calibrated_ceiling", ceilings["calibrated"]},
          {"belief_ceiling_in_sample", ceilings["belief_in_sample"]},
          {"belief_ceiling_tuning_fit", ceilings["belief_tuning_fit"]},
          {"ar_tokens_per_s", ar_tps},
          {"policy_cost_features",  // what each policy row was shown at the end of the run
           [&] {
             auto json_of = [](const speculation::CostFeatures& f) {
               return nlohmann::json{{"probe", f.probe}, {"layer", f.layer}, {"verify", f.verify}};
             };
             nlohmann::json j = {{"calibration", json_of(model::cost::CostFeaturesOfCalibration(
                                                     c_.calibration, L_, c_.spec.max_draft_len))}};
             for (size_t k = 0; k < jobs_.size(); ++k) {
               if (jobs_[k].costs == "served") {
                 j["served"][jobs_[k].method] = json_of(JobCostFeatures(k, jobs_[k].options.cost_features));
               }
             }
             return j;
           }()},
          {"run_step_costs",
           {{"draft_step_s", run_costs.draft_step_s},
            {"verify_s", run_costs.verify_s},
            {"verify_intercept_s", run_costs.verify_intercept_s},
            {"verify_slope_s", run_costs.verify_slope_s}}},
          {"temperature", sampling_.temperature},
          {"top_p", sampling_.top_p},
          {"seeds", sampling_.sampled() ? sampling_.seeds : 0},
          {"eval_runs", Runs(set_.eval.size()).size()},  // evaluation prompts x seeds (greedy: x 1)
          {"interleaved_passes", cf_.repeats},
          {"tuning_prompts", set_.tuning.size()},
          {"eval_prompts", set_.eval.size()}};
}

void SetBench::PrintTable(const nlohmann::json& rows, const nlohmann::json& ceilings, double ar_tps) const {
  char line[512];
  out_ << "\n== " << set_.name << " (evaluation split: " << set_.eval.size() << " prompts x " << cf_.new_tokens
       << " tokens, " << cf_.repeats << " interleaved passes; AR " << static_cast<int64_t>(ar_tps)
       << " tokens/s; baselines tuned by replay on the " << set_.tuning.size() << " tuning prompts)\n";
  if (sampling_.sampled()) {
    out_ << "sampled: temperature " << sampling_.temperature << ", top_p " << sampling_.top_p << ", seeds 1.."
         << sampling_.seeds << " per prompt (exact: share equal to the autoregressive draw of the same seed;"
         << " speculative sampling is lossless in distribution, not draw for draw)\n";
  }
  std::snprintf(line, sizeof(line), "%-34s %-26s %7s %8s %10s %11s %11s %7s %7s %6s %6s %6s\n", "method", "config",
                "tok/s", "measured", "pred.accel", "pred.measrd", "pred.served", "accept", "tok/rnd", "mean E",
                "mean D", "exact");
  out_ << line;
  for (const auto& r : rows) {
    std::snprintf(line, sizeof(line), "%-34s %-26s %7.0f %7.2fx %9.2fx %10.2fx %10.2fx %7.3f %7.2f %6.2f %6.2f %6.2f\n",
                  r["method"].get<std::string>().c_str(), r["config"].get<std::string>().c_str(),
                  r["tokens_per_s"].get<double>(), r["measured_speedup"].get<double>(),
                  r["predicted_speedup_accelerator"].get<double>(), r["predicted_speedup_measured"].get<double>(),
                  r["predicted_speedup_served"].get<double>(),
                  r["acceptance_rate"].get<double>(), r["tokens_per_round"].get<double>(),
                  r["mean_exit_layer"].get<double>(), r["mean_draft_len"].get<double>(),
                  r["exact_match_rate"].get<double>());
    out_ << line;
  }
  for (const auto& [key, label] : {std::pair{"calibrated", "ceiling: calibrated (in-sample)"},
                                   std::pair{"belief_tuning_fit", "ceiling: belief (tuning fit)"},
                                   std::pair{"belief_in_sample", "ceiling: belief (in-sample)"},
                                   std::pair{"hindsight_oracle", "ceiling: hindsight oracle"}}) {
    const nlohmann::json& c = ceilings[key];
    std::snprintf(line, sizeof(line), "%-34s %-26s %7s %8s %9.2fx %10.2fx %10.2fx\n", label, "", "-", "-",
                  c["accelerator"].get<double>(), c["measured"].get<double>(), c.value("served", 0.0));
    out_ << line;
  }
  out_ << std::flush;
}

}  // namespace lede::bench::internal
