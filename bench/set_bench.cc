// SetBench (internal/set_bench.h): the shadow traces of both splits, the
// autoregressive reference, the LEDE jobs with their ablations and the
// interleaved evaluation runs.
#include "bench/internal/set_bench.h"

#include <cmath>
#include <map>
#include <memory>

#include "policy/dqn/method_factory.h"
#include "shared/model/cost/cost_profiles.h"
#include "shared/speculation/method.h"
#include "shared/status/status_macros.h"

namespace lede::bench::internal {
namespace {

using speculation::Action;
using speculation::ExitController;
using speculation::ExitState;
using speculation::Phase;

// Phase-1 or phase-2 override around another controller (the ablations).
class AblatedController : public ExitController {
 public:
  AblatedController(std::unique_ptr<ExitController> inner, int32_t fixed_exit, int32_t fixed_draft)
      : inner_(std::move(inner)), fixed_exit_(fixed_exit), fixed_draft_(fixed_draft) {}
  std::string name() const override { return "ablated:" + inner_->name(); }
  Action Decide(const ExitState& s) override {
    if (s.phase == Phase::kExitLayer && fixed_exit_ > 0) {
      return s.layer >= fixed_exit_ ? Action::kExit : Action::kContinue;
    }
    if (s.phase == Phase::kDraftLength && fixed_draft_ > 0) {
      return s.draft_pos < fixed_draft_ ? Action::kExit : Action::kContinue;
    }
    return inner_->Decide(s);
  }

 private:
  std::unique_ptr<ExitController> inner_;
  int32_t fixed_exit_, fixed_draft_;
};

}  // namespace

using trainer::FitAcceptanceModels;
using trainer::RunPrompts;

SetBench::SetBench(Common& c, const CommonFlags& cf, const PromptSet& set, std::vector<std::string> methods,
                   const BenchSampling& sampling, std::vector<std::string> policy_costs, std::ostream& out,
                   std::ostream& err)
    : c_(c),
      cf_(cf),
      set_(set),
      methods_(std::move(methods)),
      sampling_(sampling),
      out_(out),
      err_(err),
      policy_costs_(std::move(policy_costs)) {
  L_ = static_cast<int32_t>(c.model->n_layers());
  D_ = c.spec.max_draft_len;
  // Static and the oracle range over longer drafts than the policies'
  // D_max, so that neither baseline nor ceiling is held back by it.
  static_max_draft_ = std::max<int32_t>(D_, 8);
  for (int32_t l = 1; l < L_; ++l) all_layers_.push_back(l);
  run_steps_ = model::cost::RoundStepTimings(L_);
  meter_options_.n_layers = L_;  // as the model service's (services/model/model_host.cc)
  meter_options_.max_draft_len = static_max_draft_;
  meter_options_.threads = static_cast<int32_t>(cf.threads);
  meter_options_.head_layers = model::cost::HeadLayerEquivalents(c.model->config());
  ar_.max_new_tokens = cf.new_tokens;
  adaptive_ = ar_;
  adaptive_.mode = model::SpeculationMode::kAdaptive;
  adaptive_.decision_spec = c.spec;
  cost_models_ = {c.accelerator.get(), c.measured.get()};
}

StatusOr<nlohmann::json> SetBench::Run(const std::vector<policy::dqn::Artifact>& artifacts,
                                       const std::string& fixed_static) {
  err_ << "== " << set_.name << ": " << set_.tuning.size() << " tuning / " << set_.eval.size()
       << " evaluation prompts\n";
  LEDE_RETURN_IF_ERROR(TraceBothSplits());
  LEDE_ASSIGN_OR_RETURN(ar_eval_, RunAr());
  if (Has("ar")) jobs_.push_back({"ar", "", ar_, nullptr, ""});
  if (Has("calibrated") || Has("del")) {
    LEDE_ASSIGN_OR_RETURN(calibration_, FitAcceptanceModels(tune_traces_, c_.spec.trace_window));
  }
  for (const auto& [name, configs_for] : Families()) {
    if (Status s = Tune(name, configs_for); !s.ok()) return Status(s.code(), name + ": " + std::string(s.message()));
  }
  LEDE_RETURN_IF_ERROR(AddGivenStatic(fixed_static));
  if (Has("lede")) {
    for (const policy::dqn::Artifact& a : artifacts) LEDE_RETURN_IF_ERROR(AddLede(a));
  }
  LEDE_ASSIGN_OR_RETURN(std::vector<Totals> totals, Evaluate());
  return Report(totals);
}

std::vector<SetBench::SplitRun> SetBench::Runs(size_t n) const {
  std::vector<SplitRun> runs;
  for (size_t p = 0; p < n; ++p) {
    if (!sampling_.sampled()) runs.push_back({p, 0});
    for (int64_t s = 1; sampling_.sampled() && s <= sampling_.seeds; ++s) runs.push_back({p, static_cast<uint64_t>(s)});
  }
  return runs;
}

model::SamplingOptions SetBench::SamplingOf(uint64_t seed) const {
  model::SamplingOptions o;
  if (!sampling_.sampled()) return o;
  o.temperature = sampling_.temperature;
  o.top_p = sampling_.top_p;
  o.seed = seed;
  return o;
}

StatusOr<Totals> SetBench::RunAr() {
  if (!sampling_.sampled()) return RunPrompts(*c_.engine, set_.eval, ar_, nullptr, nullptr);
  Totals sum;
  for (const SplitRun& run : Runs(set_.eval.size())) {
    GenerateOptions o = ar_;
    o.sampling = SamplingOf(run.seed);
    LEDE_ASSIGN_OR_RETURN(Totals t, RunPrompts(*c_.engine, {set_.eval[run.prompt]}, o, nullptr, nullptr));
    sum.tokens += t.tokens;
    sum.decode_s += t.decode_s;
    sum.outputs.push_back(std::move(t.outputs.front()));
    ++sum.prompts;
  }
  return sum;
}

Status SetBench::TraceBothSplits() {
  for (auto [prompts, traces] : {std::pair{&set_.tuning, &tune_traces_}, std::pair{&set_.eval, &eval_traces_}}) {
    for (const SplitRun& run : Runs(prompts->size())) {
      const std::vector<int32_t>& prompt = (*prompts)[run.prompt];
      const std::string id = set_.name + ":" + std::to_string(run.prompt) +
                             (sampling_.sampled() ? "#" + std::to_string(run.seed) : "");
      LEDE_ASSIGN_OR_RETURN(trainer::ShadowTrace t, trainer::TraceRequest(*c_.engine, prompt, cf_.new_tokens,
                                                                          c_.spec.top_k, id, SamplingOf(run.seed)));
      traces->push_back(std::move(t));
    }
  }
  return OkStatus();
}

Status SetBench::AddLede(const policy::dqn::Artifact& a) {
  LEDE_ASSIGN_OR_RETURN(policy::dqn::MethodPlan plan,
                        policy::dqn::PlanTrainedPolicy(std::make_shared<const policy::dqn::Artifact>(a), L_));
  GenerateOptions o = adaptive_;
  o.decision_spec = plan.decision_spec;
  // The policy sees this deployment's costs as the services would show
  // them: the step costs the run meters of itself (Evaluate), from the
  // measured calibration's until it can price, and in the replays below (a
  // cost-blind policy ignores them).
  o.cost_features = model::cost::CostFeaturesOfCalibration(c_.calibration, L_, plan.decision_spec.max_draft_len);
  auto dqn = [plan](int64_t) { return plan.MakeController(); };
  const std::string label = "lede " + a.metadata.version;
  const std::string config = a.metadata.version + " (" + a.metadata.reward_cost_model + ")";
  jobs_.push_back({label, config, o, dqn, policy_costs_.front()});
  std::map<int32_t, int64_t> exit_counts;
  double drafted = 0, drafting_rounds = 0;
  for (size_t p = 0; p < eval_traces_.size(); ++p) {
    std::unique_ptr<ExitController> ctl = dqn(static_cast<int64_t>(p));
    trainer::SimulatedMethod m;
    m.mode = model::SpeculationMode::kAdaptive;
    m.controller = ctl.get();
    m.spec = o.decision_spec;
    trainer::ShadowTrace t = eval_traces_[p];
    t.cost = o.cost_features;
    LEDE_ASSIGN_OR_RETURN(model::GenerationResult r, trainer::Simulate(t, m));
    for (const auto& round : r.stats.rounds) {
      if (round.n_drafted > 0) ++exit_counts[round.exit_layer], drafted += round.n_drafted, ++drafting_rounds;
    }
  }
  int32_t top_exit = 0;
  int64_t top_count = -1;
  for (auto [l, n] : exit_counts) {
    if (n > top_count) top_exit = l, top_count = n;
  }
  const int32_t mean_d = std::max(1, static_cast<int32_t>(std::lround(drafted / std::max(1.0, drafting_rounds))));
  if (top_exit > 0) {
    auto fixed_exit = [dqn, top_exit](int64_t i) -> std::unique_ptr<ExitController> {
      return std::make_unique<AblatedController>(dqn(i), top_exit, 0);
    };
    auto fixed_len = [dqn, mean_d](int64_t i) -> std::unique_ptr<ExitController> {
      return std::make_unique<AblatedController>(dqn(i), 0, mean_d);
    };
    jobs_.push_back({label + " fixed exit", "l*=" + std::to_string(top_exit), o, fixed_exit, policy_costs_.front()});
    jobs_.push_back({label + " fixed length", "D=" + std::to_string(mean_d), o, fixed_len, policy_costs_.front()});
  }
  for (size_t i = 1; i < policy_costs_.size(); ++i) {
    jobs_.push_back({label + " (" + policy_costs_[i] + " costs)", config, o, dqn, policy_costs_[i]});
  }
  return OkStatus();
}

void SetBench::Meter(size_t j, const model::RoundRecord& round) {
  run_steps_.Add(round);
  StepSeconds& seconds = step_seconds_[j];
  ++seconds.rounds;
  seconds.round_s += round.latency_s;
  seconds.draft_s += round.draft_s;
  seconds.verify_s += round.verify_s;
  experience::ServedCostMeter& meter = *meters_[j];
  if (round.n_drafted > 0) meter.RecordDraft(round.exit_layer, round.n_drafted, round.draft_s);
  if (model::cost::TimesAVerification(round)) meter.RecordVerify(round.exit_layer, round.n_drafted, round.verify_s);
}

void SetBench::WriteRounds(const std::string& method, int64_t pass, size_t run,
                           const std::vector<model::RoundRecord>& rounds) const {
  for (const model::RoundRecord& r : rounds) {
    *rounds_out_ << nlohmann::json{{"set", set_.name},         {"method", method},
                                   {"pass", pass},             {"run", run},
                                   {"exit_layer", r.exit_layer}, {"n_drafted", r.n_drafted},
                                   {"n_accepted", r.n_accepted}, {"n_emitted", r.n_emitted},
                                   {"n_probes", r.n_probes},   {"n_decisions", r.n_decisions},
                                   {"latency_s", r.latency_s}, {"draft_s", r.draft_s},
                                   {"verify_s", r.verify_s}}
                        .dump()
                 << "\n";
  }
}

speculation::CostFeatures SetBench::JobCostFeatures(size_t j, const speculation::CostFeatures& prior) const {
  if (j >= meters_.size()) return prior;
  const lede::v1::CostProfile profile = meters_[j]->Snapshot();
  return experience::CanPrice(profile) ? experience::ServedCostFeatures(profile, prior) : prior;
}

StatusOr<std::vector<Totals>> SetBench::Evaluate() {
  std::vector<Totals> totals(jobs_.size());
  meters_.clear();
  for (size_t j = 0; j < jobs_.size(); ++j) meters_.push_back(std::make_unique<experience::ServedCostMeter>(meter_options_));
  step_seconds_.assign(jobs_.size(), StepSeconds{});
  const std::vector<SplitRun> runs = Runs(set_.eval.size());
  for (int64_t rep = 0; rep < cf_.repeats; ++rep) {
    for (size_t p = 0; p < runs.size(); ++p) {
      PrintProgress(err_, "evaluation, pass " + std::to_string(rep + 1), p, runs.size());
      for (size_t k = 0; k < jobs_.size(); ++k) {
        const size_t j = (k + p + static_cast<size_t>(rep)) % jobs_.size();  // rotating order
        GenerateOptions o = jobs_[j].options;
        o.sampling = SamplingOf(runs[p].seed);
        if (jobs_[j].costs == "served") o.cost_features = JobCostFeatures(j, o.cost_features);
        std::unique_ptr<ExitController> ctl;
        if (jobs_[j].factory) ctl = jobs_[j].factory(static_cast<int64_t>(p)), o.controller = ctl.get();
        auto r = c_.engine->Generate(set_.eval[runs[p].prompt], o);
        if (!r.ok()) return Status(r.status().code(), jobs_[j].method + ": " + std::string(r.status().message()));
        Totals& t = totals[j];
        t.tokens += r->stats.n_generated - 1;
        t.decode_s += r->stats.decode_s;
        for (const auto& round : r->stats.rounds) Meter(j, round);
        if (rounds_out_ != nullptr) WriteRounds(jobs_[j].method, rep, p, r->stats.rounds);
        if (rep == 0) {  // seeded: every pass makes the same rounds
          t.drafted += r->stats.n_drafted;
          t.accepted += r->stats.n_accepted;
          for (const auto& round : r->stats.rounds) {
            if (round.n_drafted > 0) ++t.exit_counts[round.exit_layer];
          }
          t.rounds.insert(t.rounds.end(), r->stats.rounds.begin(), r->stats.rounds.end());
          t.exact += r->tokens == ar_eval_.outputs[p] ? 1 : 0;
          ++t.prompts;
        }
      }
    }
  }
  err_ << "\n";
  return totals;
}

}  // namespace lede::bench::internal
