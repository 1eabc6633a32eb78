// File: bench/internal/set_bench.h
//
// The benchmark of one prompt set of `lede-bench bench` (lede_bench.h), in
// three files by concern: set_bench.cc (the shadow traces, the
// autoregressive reference, the LEDE jobs with their ablations and the
// interleaved evaluation), set_bench_baselines.cc (the baseline families and
// their tuning by replay) and set_bench_report.cc (the ceilings, the printed
// table and the JSON report). Not API: only bench/ includes it.
#ifndef LEDE_BENCH_INTERNAL_SET_BENCH_H_
#define LEDE_BENCH_INTERNAL_SET_BENCH_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/internal/lede_bench_setup.h"
#include "policy/dqn/artifact.h"
#include "shared/experience/served_costs.h"
#include "shared/flags/sampling_flags.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/decoding.h"
#include "shared/status/status.h"
#include "trainer/calibrated_rule.h"
#include "trainer/counterfactual.h"
#include "trainer/exit_eval.h"

namespace lede::bench::internal {

using model::GenerateOptions;
using trainer::AcceptanceModels;
using trainer::ControllerFactory;
using Totals = trainer::PromptTotals;

// The decoding every method of `lede-bench bench` runs: greedy (temperature
// 0, one run per prompt) or sampled (temperature > 0, top_p, one run per
// prompt and seed, seeds 1..seeds, the same seeds for every method;
// shared/flags/sampling_flags.h).
using BenchSampling = flags::SamplingFlags;

// The benchmark of one prompt set: every method of the table is a job,
// baselines tuned by exact replay on the tuning split (per cost model), LEDE
// policies with their ablations, all run interleaved on the evaluation
// split; then the ceilings and the table. Errors: kInvalidArgument for bad
// flags (--static-configs), otherwise the failing step's status.
class SetBench {
 public:
  // policy_costs: what the LEDE policies are shown of the hardware, one or
  // more of kPolicyCosts: "served", the features of the steps the policy's
  // own rounds took, metered as a model service serving it alone would
  // (a ServedCostMeter per policy row, shared/experience/served_costs.h),
  // the calibration's until it can price; "calibration", the calibration's
  // throughout. The first gives each policy's row and its ablations, every
  // other one more row per policy ("lede V (calibration costs)").
  SetBench(Common& c, const CommonFlags& cf, const PromptSet& set, std::vector<std::string> methods,
           const BenchSampling& sampling, std::vector<std::string> policy_costs, std::ostream& out,
           std::ostream& err);
  static constexpr const char* kPolicyCosts[] = {"served", "calibration"};

  // Writes every timed round of the evaluation to `rounds` (not owned; null:
  // none), a JSON object per line: set, method, pass, run, and the round's
  // RoundRecord fields (exit_layer, n_drafted, n_accepted, n_emitted,
  // n_probes, n_decisions, latency_s, draft_s, verify_s; seconds), for fits
  // of cost models to the rounds a run timed (docs/training.md).
  void WriteRoundsTo(std::ostream* rounds) { rounds_out_ = rounds; }

  // Runs the set's benchmark (progress on `err`, the table on `out`) and
  // returns its JSON report. Call once.
  StatusOr<nlohmann::json> Run(const std::vector<policy::dqn::Artifact>& artifacts, const std::string& fixed_static);

 private:
  // A job of the table: a method, its configuration, how to run it.
  struct Job {
    std::string method, config;
    GenerateOptions options;
    ControllerFactory factory;
    // A LEDE policy's costs (kPolicyCosts): "served", shown the run's own
    // step costs (its options' cost_features are the prior), or
    // "calibration"; empty for the other methods.
    std::string costs;
  };
  // One configuration of a baseline family.
  struct Config {
    std::string label;
    GenerateOptions options;        // mode, static E/D, decision spec
    trainer::ControllerMaker make;  // adaptive only
  };
  using ConfigsFor = std::function<std::vector<Config>(const model::cost::CostModel&)>;

  bool Has(const std::string& m) const { return std::find(methods_.begin(), methods_.end(), m) != methods_.end(); }

  // One generation of a split: a prompt and the seed it is sampled with.
  struct SplitRun {
    size_t prompt = 0;
    uint64_t seed = 0;
  };
  // The runs of a split of n prompts: each prompt once (greedy) or once per
  // seed 1..seeds (sampled).
  std::vector<SplitRun> Runs(size_t n) const;
  // The sampling of a run with `seed` (greedy: the defaults).
  model::SamplingOptions SamplingOf(uint64_t seed) const;

  // set_bench.cc: the traces, the runs and the LEDE jobs.

  // Autoregressive decoding of every evaluation run (outputs: the reference).
  StatusOr<Totals> RunAr();
  // Shadow traces of the autoregressive trajectories (greedy: exact; sampled:
  // an autoregressive draw per seed, scored by acceptance probability,
  // trainer/counterfactual.h): the tuning split tunes every baseline by
  // replay; the evaluation split gives the ceilings.
  Status TraceBothSplits();
  // A LEDE policy and its ablations: no dynamic exit (l* fixed at the
  // policy's most used exit layer) and no adaptive length (D fixed at its
  // mean draft length), both read off an exact replay of the policy on the
  // evaluation split.
  Status AddLede(const policy::dqn::Artifact& a);
  // The interleaved evaluation runs: prompt by prompt, every job in a
  // rotating order, `repeats` times, so that the machine's drift over the
  // run affects every method alike and the wall-clock ratios survive it.
  StatusOr<std::vector<Totals>> Evaluate();
  // Adds a timed round of job `j` to the run's step costs, the job's meter
  // and its step seconds.
  void Meter(size_t j, const model::RoundRecord& round);
  // Writes the rounds of one evaluation run to rounds_out_ (WriteRoundsTo).
  void WriteRounds(const std::string& method, int64_t pass, size_t run,
                   const std::vector<model::RoundRecord>& rounds) const;
  // The cost features of job j's meter (experience::ServedCostFeatures),
  // `prior` until it can price.
  speculation::CostFeatures JobCostFeatures(size_t j, const speculation::CostFeatures& prior) const;

  // set_bench_baselines.cc: the baseline families, tuned by replay.

  // The adaptive options with these phase-1 candidate layers.
  GenerateOptions SpecWith(std::vector<int32_t> layers) const;
  // A baseline family: configs tuned by replay on the tuning split per cost
  // model (the simulated speed-up of all tuning requests pooled), the best
  // one becomes a job.
  Status Tune(const std::string& method, const ConfigsFor& configs_for);
  // Static: every exit layer 1..L-1 and draft length 1..static_max_draft.
  std::vector<Config> StaticConfigs() const;
  // Threshold: lambda x tau grid.
  std::vector<Config> ThresholdConfigs() const;
  // Calibrated stopping rule: exit layer x rho, with and without lookahead.
  std::vector<Config> CalibratedConfigs(const AcceptanceModels& cal, const model::cost::CostModel& cm) const;
  // DEL: tau grid over every exit layer.
  std::vector<Config> DelConfigs(const model::cost::CostModel& cm) const;
  // AdaEDL: exit layer x gamma x lambda.
  std::vector<Config> AdaEdlConfigs() const;
  // The baseline families the --methods flag asks for, in table order.
  std::vector<std::pair<std::string, ConfigsFor>> Families() const;
  // --static-configs: untuned static rows E:D.
  Status AddGivenStatic(const std::string& fixed_static);

  // set_bench_report.cc: the ceilings, the rows, the table and the JSON.

  // Ceilings on the evaluation split per cost model (trainer/ceilings.h):
  //  - calibrated: the calibrated stopping rule with acceptance
  //    probabilities fitted on the evaluation traces themselves and its exit
  //    layer and rho chosen there;
  //  - belief (in-sample / tuning fit): the Bayes-optimal policy that is told
  //    the calibrated P(accept) of every layer at every position for free,
  //    future ones included, but not the outcomes, with the acceptance model
  //    fitted on the evaluation traces (in-sample) or on the tuning traces
  //    (what a policy could know when it runs): the most any policy can buy
  //    with these probe signals;
  //  - the hindsight oracle;
  // each priced by the accelerator model, the calibration and, when given,
  // `served` (the run's own steps).
  nlohmann::json Ceilings(const model::cost::CostModel* served) const;
  // The rows, the ceilings, the printed table and the set's JSON report.
  nlohmann::json Report(const std::vector<Totals>& totals) const;
  // Prints the set's table of rows and ceilings on `out_`.
  void PrintTable(const nlohmann::json& rows, const nlohmann::json& ceilings, double ar_tps) const;

  Common& c_;
  const CommonFlags& cf_;
  const PromptSet& set_;
  const std::vector<std::string> methods_;
  const BenchSampling sampling_;
  std::ostream& out_;
  std::ostream& err_;
  int32_t L_ = 0, D_ = 0, static_max_draft_ = 0;
  std::vector<int32_t> all_layers_;
  GenerateOptions ar_, adaptive_;
  std::vector<const model::cost::CostModel*> cost_models_;
  std::vector<trainer::ShadowTrace> tune_traces_, eval_traces_;
  Totals ar_eval_;  // autoregressive on the evaluation split (outputs: the reference)
  // Every timed round of the evaluation runs, every method and pass: the
  // step costs this run measured of itself, as a model service meters its
  // served steps; Report predicts each method with them ("served").
  model::cost::RoundStepTimings run_steps_{1};
  // Per job, its own rounds in a model service's meter (its window), whose
  // features a "served" policy job sees.
  experience::ServedCostMeterOptions meter_options_;
  std::vector<std::unique_ptr<experience::ServedCostMeter>> meters_;
  // Per job, where its timed rounds' wall time went, summed over every pass
  // (seconds): the rounds (RoundRecord::latency_s), their drafts (draft_s)
  // and verifications (verify_s); the rest of a round is the loop's own
  // work (acceptance, sampling, the KV cache's bookkeeping).
  struct StepSeconds {
    int64_t rounds = 0;
    double round_s = 0, draft_s = 0, verify_s = 0;
  };
  std::vector<StepSeconds> step_seconds_;
  std::ostream* rounds_out_ = nullptr;
  const std::vector<std::string> policy_costs_;  // at least one of kPolicyCosts
  AcceptanceModels calibration_;
  std::vector<Job> jobs_;
};

}  // namespace lede::bench::internal

#endif  // LEDE_BENCH_INTERNAL_SET_BENCH_H_
