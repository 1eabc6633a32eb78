#include "bench/lede_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "policy/acceptance_model.h"
#include "policy/controllers.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "policy/dqn/method_factory.h"
#include "shared/experience/transition.h"
#include "shared/flags/flags.h"
#include "shared/flags/model_flags.h"
#include "shared/model/model_load_flags.h"
#include "shared/model/cost_model.h"
#include "shared/model/cost_profiles.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/speculation/method.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "shared/status/status_macros.h"
#include "trainer/corpus.h"
#include "trainer/calibrated_rule.h"
#include "trainer/ceilings.h"
#include "trainer/counterfactual.h"
#include "trainer/exit_eval.h"
#include "shared/experience/experience.h"

namespace lede::bench {
namespace {

using speculation::Action;
using speculation::ExitController;
using speculation::ExitState;
using model::GenerateOptions;
using speculation::Phase;

using flags::SplitList;

using trainer::LoadPromptSet;
using trainer::PromptSet;

using trainer::ControllerFactory;
using trainer::RunPrompts;
using Totals = trainer::PromptTotals;

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

struct Common {
  std::shared_ptr<const model::LlamaModel> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<model::Engine> engine;
  std::unique_ptr<model::CostModel> accelerator, measured;
  std::vector<PromptSet> sets;
  speculation::DecisionSpec spec;
};

// The model-loading group (shared/flags/model_flags.h) gives --model,
// --kernels, --weights and --threads (default 1 here: the recorded tables
// are single-threaded, and one thread's timings are the steadiest).
struct CommonFlags : flags::ModelLoadFlags {
  CommonFlags() { threads = 1; }
  std::string prompts, calibration, candidates = "2,3,4,6";
  int64_t repeats = 3;  // interleaved evaluation passes
  int64_t max_draft = 4, per_set = 48, prompt_tokens = 32, max_prompt_tokens = 192, new_tokens = 64;
  void AddTo(flags::FlagSet& f) {
    flags::AddModelLoadFlags(&f, this, flags::kModelPath | flags::kKernels | flags::kWeights);
    f.Add("prompts", &prompts, "prompt sets: .jsonl or <|doc|> corpus files, comma-separated", true);
    f.Add("calibration", &calibration, "measured cost model JSON (default: calibrate now)");
    f.Add("candidate-layers", &candidates, "phase-1 candidate exit layers");
    f.Add("max-draft-len", &max_draft, "D_max");
    f.Add("prompts-per-set", &per_set, "prompts read per set (half tuning, half evaluation)");
    f.Add("prompt-tokens", &prompt_tokens, "tokens of a corpus document used as its prompt");
    f.Add("max-prompt-tokens", &max_prompt_tokens, "longer prompts are cut");
    f.Add("new-tokens", &new_tokens, "tokens generated per prompt");
    flags::AddModelLoadFlags(&f, this, flags::kThreads);
    f.Add("repeats", &repeats, "interleaved evaluation passes (wall-clock is summed over them)");
  }
};

StatusOr<Common> Setup(const CommonFlags& cf) {
  LEDE_RETURN_IF_ERROR(model::ApplyThreadsFlag(cf.threads).status());
  Common c;
  LEDE_ASSIGN_OR_RETURN(std::string tok_path, tokenizer::FindTokenizerFile(cf.model));
  LEDE_ASSIGN_OR_RETURN(c.tokenizer, tokenizer::LoadTokenizer(tok_path));
  LEDE_ASSIGN_OR_RETURN(model::ModelOptions model_options, model::ModelOptionsFromFlags(cf));
  LEDE_ASSIGN_OR_RETURN(auto loaded, model::LlamaModel::Load(cf.model, model_options));
  c.model = std::move(loaded);
  model::KvCacheOptions ko;
  ko.max_draft_len = std::max<int64_t>(16, cf.max_draft);
  LEDE_ASSIGN_OR_RETURN(c.engine, model::Engine::Create(c.model, ko));
  model::Calibration cal;
  if (!cf.calibration.empty()) {
    LEDE_ASSIGN_OR_RETURN(cal, model::ReadCalibrationFile(cf.calibration));
  } else {
    auto network = std::make_shared<policy::dqn::QNetwork>(policy::dqn::QNetwork::Random(policy::dqn::kDefaultHidden, 1));
    LEDE_ASSIGN_OR_RETURN(cal, model::Calibrate(*c.model, 30, [network] {
      float features[speculation::kExitFeatureDim] = {0.5f};
      float q[policy::dqn::kNumActions];
      network->Forward(features, q);
    }));
  }
  c.accelerator = model::MakeAcceleratorCostModel(c.model->config());
  c.measured = model::MakeMeasuredCostModel(cal);
  LEDE_ASSIGN_OR_RETURN(c.spec.candidate_layers, flags::ParseIntList("candidate-layers", cf.candidates));
  c.spec.max_draft_len = static_cast<int32_t>(cf.max_draft);
  for (const std::string& path : SplitList(cf.prompts)) {
    LEDE_ASSIGN_OR_RETURN(PromptSet set, LoadPromptSet(path, *c.tokenizer, cf.per_set, cf.prompt_tokens,
                                                       cf.max_prompt_tokens));
    c.sets.push_back(std::move(set));
  }
  return c;
}

// The rewards of shared/experience/transition.h under a cost model: "paper" (docs/design.md
// §2; with the measured model its depth term assumes a typical round of 3
// drafts and 4 tokens) or "throughput" (tokens minus cost).
experience::RewardSpec RewardsFor(const std::string& reward, const model::CostModel& cm, const Common& c) {
  const int32_t L = static_cast<int32_t>(c.model->n_layers());
  std::vector<double> draft_cost;
  for (int32_t l = 0; l <= L; ++l) draft_cost.push_back(l == 0 ? 0.0 : cm.ControlledDraftToken(l));
  if (reward == "throughput") {
    std::vector<std::vector<double>> verify(L + 1);
    for (int32_t e = 0; e <= L; ++e) {
      for (int32_t k = 0; k <= c.spec.max_draft_len; ++k) verify[e].push_back(e == 0 ? 0.0 : cm.Verify(e, k));
    }
    return experience::RewardSpec::Throughput(cm.name(), draft_cost, verify, cm.ControlledProbe(), cm.Decision());
  }
  if (cm.name() == "accelerator") return experience::RewardSpec::Paper(L);
  return experience::RewardSpec::FromCosts(cm.name(), draft_cost, cm.Verify(L / 4 + 1, 3), 4.0, cm.Probe());
}

void PrintProgress(std::ostream& err, const std::string& what, size_t done, size_t total) {
  const int width = 20, filled = total ? static_cast<int>(width * done / total) : width;
  err << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << done << "/" << total
      << " " << what << "            " << std::flush;
}

using trainer::AcceptanceModels;
using trainer::FitAcceptanceModels;
using trainer::RoundCostsOf;

// The decoding every method of `lede-bench bench` runs: greedy (temperature
// 0, one run per prompt) or sampled (temperature > 0, top_p, one run per
// prompt and seed, seeds 1..n_seeds, the same seeds for every method).
struct BenchSampling {
  double temperature = 0;
  double top_p = 1;
  int64_t n_seeds = 1;
  bool sampled() const { return temperature > 0; }
};

// The benchmark of one prompt set: every method of the table is a job,
// baselines tuned by exact replay on the tuning split (per cost model), LEDE
// policies with their ablations, all run interleaved on the evaluation
// split; then the ceilings and the table. Errors: kInvalidArgument for bad
// flags (--static-configs), otherwise the failing step's status.
class SetBench {
 public:
  SetBench(Common& c, const CommonFlags& cf, const PromptSet& set, std::vector<std::string> methods,
           const BenchSampling& sampling, std::ostream& out, std::ostream& err)
      : c_(c), cf_(cf), set_(set), methods_(std::move(methods)), sampling_(sampling), out_(out), err_(err) {
    L_ = static_cast<int32_t>(c.model->n_layers());
    D_ = c.spec.max_draft_len;
    // Static and the oracle range over longer drafts than the policies'
    // D_max, so that neither baseline nor ceiling is held back by it.
    static_max_draft_ = std::max<int32_t>(D_, 8);
    for (int32_t l = 1; l < L_; ++l) all_layers_.push_back(l);
    ar_.max_new_tokens = cf.new_tokens;
    adaptive_ = ar_;
    adaptive_.mode = model::SpeculationMode::kAdaptive;
    adaptive_.decision_spec = c.spec;
    cost_models_ = {c.accelerator.get(), c.measured.get()};
  }

  StatusOr<nlohmann::json> Run(const std::vector<policy::dqn::Artifact>& artifacts, const std::string& fixed_static) {
    err_ << "== " << set_.name << ": " << set_.tuning.size() << " tuning / " << set_.eval.size()
         << " evaluation prompts\n";
    LEDE_RETURN_IF_ERROR(TraceBothSplits());
    LEDE_ASSIGN_OR_RETURN(ar_eval_, RunAr());
    if (Has("ar")) jobs_.push_back({"ar", "", ar_, nullptr});
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

 private:
  // A job of the table: a method, its configuration, how to run it.
  struct Job {
    std::string method, config;
    GenerateOptions options;
    ControllerFactory factory;
  };
  // One configuration of a baseline family.
  struct Config {
    std::string label;
    GenerateOptions options;        // mode, static E/D, decision spec
    trainer::ControllerMaker make;  // adaptive only
  };
  using ConfigsFor = std::function<std::vector<Config>(const model::CostModel&)>;

  bool Has(const std::string& m) const { return std::find(methods_.begin(), methods_.end(), m) != methods_.end(); }

  // One generation of a split: a prompt and the seed it is sampled with.
  struct SplitRun {
    size_t prompt = 0;
    uint64_t seed = 0;
  };
  // The runs of a split of n prompts: each prompt once (greedy) or once per
  // seed 1..n_seeds (sampled).
  std::vector<SplitRun> Runs(size_t n) const {
    std::vector<SplitRun> runs;
    for (size_t p = 0; p < n; ++p) {
      if (!sampling_.sampled()) runs.push_back({p, 0});
      for (int64_t s = 1; sampling_.sampled() && s <= sampling_.n_seeds; ++s) runs.push_back({p, static_cast<uint64_t>(s)});
    }
    return runs;
  }
  model::SamplingOptions SamplingOf(uint64_t seed) const {
    model::SamplingOptions o;
    if (!sampling_.sampled()) return o;
    o.temperature = sampling_.temperature;
    o.top_p = sampling_.top_p;
    o.seed = seed;
    return o;
  }

  // Autoregressive decoding of every evaluation run (outputs: the reference).
  StatusOr<Totals> RunAr() {
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

  // Shadow traces of the autoregressive trajectories (greedy: exact; sampled:
  // an autoregressive draw per seed, scored by acceptance probability,
  // trainer/counterfactual.h): the tuning split tunes every baseline by
  // replay; the evaluation split gives the ceilings.
  Status TraceBothSplits() {
    for (auto [prompts, traces] : {std::pair{&set_.tuning, &tune_traces_}, std::pair{&set_.eval, &eval_traces_}}) {
      for (const SplitRun& run : Runs(prompts->size())) {
        const std::vector<int32_t>& prompt = (*prompts)[run.prompt];
        const std::string id = set_.name + ":" + std::to_string(run.prompt) +
                               (sampling_.sampled() ? "#" + std::to_string(run.seed) : "");
        if (!sampling_.sampled()) {
          LEDE_ASSIGN_OR_RETURN(trainer::ShadowTrace t,
                                trainer::TraceGreedyRequest(*c_.engine, prompt, cf_.new_tokens, c_.spec.top_k, id));
          traces->push_back(std::move(t));
          continue;
        }
        GenerateOptions o = ar_;
        o.sampling = SamplingOf(run.seed);
        LEDE_ASSIGN_OR_RETURN(model::GenerationResult r, c_.engine->Generate(prompt, o));
        LEDE_ASSIGN_OR_RETURN(trainer::ShadowTrace t,
                              trainer::ComputeShadowTrace(*c_.model, prompt, r.tokens,
                                                          r.finish == model::FinishReason::kEos, cf_.new_tokens,
                                                          c_.spec.top_k, id, o.sampling));
        traces->push_back(std::move(t));
      }
    }
    return OkStatus();
  }

  GenerateOptions SpecWith(std::vector<int32_t> layers) const {
    GenerateOptions o = adaptive_;
    o.decision_spec.candidate_layers = std::move(layers);
    return o;
  }

  // A baseline family: configs tuned by replay on the tuning split per cost
  // model (the simulated speed-up of all tuning requests pooled), the best
  // one becomes a job.
  Status Tune(const std::string& method, const ConfigsFor& configs_for) {
    for (const model::CostModel* cm : cost_models_) {
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
      jobs_.push_back({method + " (best " + cm->name() + ")", b.label, b.options, factory});
      PrintProgress(err_, method + " tuned (" + std::to_string(configs.size()) + " configs)", 1, 1);
      err_ << "\n";
    }
    return OkStatus();
  }

  // Static: every exit layer 1..L-1 and draft length 1..static_max_draft.
  std::vector<Config> StaticConfigs() const {
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

  std::vector<Config> ThresholdConfigs() const {
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

  std::vector<Config> CalibratedConfigs(const AcceptanceModels& cal, const model::CostModel& cm) const {
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

  std::vector<Config> DelConfigs(const model::CostModel& cm) const {
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

  std::vector<Config> AdaEdlConfigs() const {
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

  // The baseline families the --methods flag asks for, in table order.
  std::vector<std::pair<std::string, ConfigsFor>> Families() const {
    std::vector<std::pair<std::string, ConfigsFor>> families;
    if (Has("static")) families.emplace_back("static", [this](const model::CostModel&) { return StaticConfigs(); });
    if (Has("threshold")) {
      families.emplace_back("threshold", [this](const model::CostModel&) { return ThresholdConfigs(); });
    }
    if (Has("calibrated")) {
      families.emplace_back("calibrated",
                            [this](const model::CostModel& cm) { return CalibratedConfigs(calibration_, cm); });
    }
    if (Has("del")) families.emplace_back("del", [this](const model::CostModel& cm) { return DelConfigs(cm); });
    if (Has("adaedl")) families.emplace_back("adaedl", [this](const model::CostModel&) { return AdaEdlConfigs(); });
    return families;
  }

  // --static-configs: untuned static rows E:D.
  Status AddGivenStatic(const std::string& fixed_static) {
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
      jobs_.push_back({"static (given)", "E=" + std::to_string(e) + " D=" + std::to_string(d), o, nullptr});
    }
    return OkStatus();
  }

  // A LEDE policy and its ablations: no dynamic exit (l* fixed at the
  // policy's most used exit layer) and no adaptive length (D fixed at its
  // mean draft length), both read off an exact replay of the policy on the
  // evaluation split.
  Status AddLede(const policy::dqn::Artifact& a) {
    LEDE_ASSIGN_OR_RETURN(policy::dqn::MethodPlan plan,
                          policy::dqn::PlanTrainedPolicy(std::make_shared<const policy::dqn::Artifact>(a), L_));
    GenerateOptions o = adaptive_;
    o.decision_spec = plan.decision_spec;
    // The policy sees this deployment's costs: the measured model's
    // (a cost-blind policy ignores them).
    o.cost_features = model::CostFeaturesOf(*c_.measured, L_, plan.decision_spec.max_draft_len);
    auto dqn = [plan](int64_t) { return plan.MakeController(); };
    const std::string label = "lede " + a.metadata.version;
    jobs_.push_back({label, a.metadata.version + " (" + a.metadata.reward_cost_model + ")", o, dqn});
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
      jobs_.push_back({label + " fixed exit", "l*=" + std::to_string(top_exit), o, fixed_exit});
      jobs_.push_back({label + " fixed length", "D=" + std::to_string(mean_d), o, fixed_len});
    }
    return OkStatus();
  }

  // The interleaved evaluation runs: prompt by prompt, every job in a
  // rotating order, `repeats` times, so that the machine's drift over the
  // run affects every method alike and the wall-clock ratios survive it.
  StatusOr<std::vector<Totals>> Evaluate() {
    std::vector<Totals> totals(jobs_.size());
    const std::vector<SplitRun> runs = Runs(set_.eval.size());
    for (int64_t rep = 0; rep < cf_.repeats; ++rep) {
      for (size_t p = 0; p < runs.size(); ++p) {
        PrintProgress(err_, "evaluation, pass " + std::to_string(rep + 1), p, runs.size());
        for (size_t k = 0; k < jobs_.size(); ++k) {
          const size_t j = (k + p + static_cast<size_t>(rep)) % jobs_.size();  // rotating order
          GenerateOptions o = jobs_[j].options;
          o.sampling = SamplingOf(runs[p].seed);
          std::unique_ptr<ExitController> ctl;
          if (jobs_[j].factory) ctl = jobs_[j].factory(static_cast<int64_t>(p)), o.controller = ctl.get();
          auto r = c_.engine->Generate(set_.eval[runs[p].prompt], o);
          if (!r.ok()) return Status(r.status().code(), jobs_[j].method + ": " + std::string(r.status().message()));
          Totals& t = totals[j];
          t.tokens += r->stats.n_generated - 1;
          t.decode_s += r->stats.decode_s;
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
  //  - the hindsight oracle.
  nlohmann::json Ceilings() const {
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
    auto belief = [&](const std::vector<trainer::AcceptanceTable>& tables, const model::CostModel& cm) {
      if (tables.empty()) return 1.0;
      return pooled([&](size_t i) {
        return trainer::BeliefOptimalCost(eval_traces_[i], tables[i], static_max_draft_, cm);
      });
    };
    for (const model::CostModel* cm : cost_models_) {
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

  // The rows, the ceilings, the printed table and the set's JSON report.
  nlohmann::json Report(const std::vector<Totals>& totals) const {
    double ar_tps = 0;
    for (size_t j = 0; j < jobs_.size(); ++j) {
      if (jobs_[j].method == "ar") ar_tps = totals[j].tokens_per_s();
    }
    if (ar_tps <= 0) ar_tps = ar_eval_.tokens_per_s();
    nlohmann::json rows = nlohmann::json::array();
    for (size_t j = 0; j < jobs_.size(); ++j) {
      const Totals& t = totals[j];
      rows.push_back({{"method", jobs_[j].method},
                      {"config", jobs_[j].config},
                      {"tokens_per_s", t.tokens_per_s()},
                      {"measured_speedup", t.tokens_per_s() / ar_tps},
                      {"predicted_speedup_accelerator", c_.accelerator->PredictedSpeedup(t.rounds)},
                      {"predicted_speedup_measured", c_.measured->PredictedSpeedup(t.rounds)},
                      {"acceptance_rate", t.acceptance()},
                      {"tokens_per_round", t.tokens_per_round()},
                      {"mean_exit_layer", t.mean_exit()},
                      {"mean_draft_len", t.mean_draft()},
                      {"exact_match_rate", t.prompts ? static_cast<double>(t.exact) / t.prompts : 0.0}});
    }
    const nlohmann::json ceilings = Ceilings();
    PrintTable(rows, ceilings, ar_tps);
    return {{"rows", rows},
            {"hindsight_oracle", ceilings["hindsight_oracle"]},
            {"calibrated_ceiling", ceilings["calibrated"]},
            {"belief_ceiling_in_sample", ceilings["belief_in_sample"]},
            {"belief_ceiling_tuning_fit", ceilings["belief_tuning_fit"]},
            {"ar_tokens_per_s", ar_tps},
            {"temperature", sampling_.temperature},
            {"top_p", sampling_.top_p},
            {"seeds", sampling_.sampled() ? sampling_.n_seeds : 0},
            {"eval_runs", Runs(set_.eval.size()).size()},  // evaluation prompts x seeds (greedy: x 1)
            {"interleaved_passes", cf_.repeats},
            {"tuning_prompts", set_.tuning.size()},
            {"eval_prompts", set_.eval.size()}};
  }

  void PrintTable(const nlohmann::json& rows, const nlohmann::json& ceilings, double ar_tps) const {
    char line[512];
    out_ << "\n== " << set_.name << " (evaluation split: " << set_.eval.size() << " prompts x " << cf_.new_tokens
         << " tokens, " << cf_.repeats << " interleaved passes; AR " << static_cast<int64_t>(ar_tps)
         << " tokens/s; baselines tuned by replay on the " << set_.tuning.size() << " tuning prompts)\n";
    if (sampling_.sampled()) {
      out_ << "sampled: temperature " << sampling_.temperature << ", top_p " << sampling_.top_p << ", seeds 1.."
           << sampling_.n_seeds << " per prompt (exact: share equal to the autoregressive draw of the same seed;"
           << " speculative sampling is lossless in distribution, not draw for draw)\n";
    }
    std::snprintf(line, sizeof(line), "%-34s %-26s %7s %8s %10s %11s %7s %7s %6s %6s %6s\n", "method", "config",
                  "tok/s", "measured", "pred.accel", "pred.measrd", "accept", "tok/rnd", "mean E", "mean D", "exact");
    out_ << line;
    for (const auto& r : rows) {
      std::snprintf(line, sizeof(line), "%-34s %-26s %7.0f %7.2fx %9.2fx %10.2fx %7.3f %7.2f %6.2f %6.2f %6.2f\n",
                    r["method"].get<std::string>().c_str(), r["config"].get<std::string>().c_str(),
                    r["tokens_per_s"].get<double>(), r["measured_speedup"].get<double>(),
                    r["predicted_speedup_accelerator"].get<double>(), r["predicted_speedup_measured"].get<double>(),
                    r["acceptance_rate"].get<double>(), r["tokens_per_round"].get<double>(),
                    r["mean_exit_layer"].get<double>(), r["mean_draft_len"].get<double>(),
                    r["exact_match_rate"].get<double>());
      out_ << line;
    }
    for (const auto& [key, label] : {std::pair{"calibrated", "ceiling: calibrated (in-sample)"},
                                     std::pair{"belief_tuning_fit", "ceiling: belief (tuning fit)"},
                                     std::pair{"belief_in_sample", "ceiling: belief (in-sample)"},
                                     std::pair{"hindsight_oracle", "ceiling: hindsight oracle"}}) {
      std::snprintf(line, sizeof(line), "%-34s %-26s %7s %8s %9.2fx %10.2fx\n", label, "", "-", "-",
                    ceilings[key]["accelerator"].get<double>(), ceilings[key]["measured"].get<double>());
      out_ << line;
    }
    out_ << std::flush;
  }

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
  std::vector<const model::CostModel*> cost_models_;
  std::vector<trainer::ShadowTrace> tune_traces_, eval_traces_;
  Totals ar_eval_;  // autoregressive on the evaluation split (outputs: the reference)
  AcceptanceModels calibration_;
  std::vector<Job> jobs_;
};

}  // namespace

namespace {

// Where and how a result was measured, for the JSON reports: the command
// line, the commit (and whether the work tree had changes), the UTC date and
// the machine (host name, CPUs, CPU model, load average when the report is
// written: other processes' load makes wall-clock noisy, libtorch threads).
// RunBench sets "date" to the start of the run.
std::string CommandOutput(const char* command) {
  std::string text;
  if (FILE* p = ::popen(command, "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof(buf), p) != nullptr) text += buf;
    ::pclose(p);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

nlohmann::json Provenance(const std::string& subcommand, const std::vector<std::string>& args) {
  std::string command = "lede-bench " + subcommand;
  for (const std::string& a : args) command += " " + a;
  std::string cpu_model;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; cpu_model.empty() && std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      cpu_model = line.substr(line.find(':') + 2);
    }
  }
  return {{"command", command},
          {"commit", CommandOutput("git rev-parse HEAD 2>/dev/null")},
          {"work_tree_changed", !CommandOutput("git status --porcelain --untracked-files=no 2>/dev/null").empty()},
          {"date", CommandOutput("date -u +%Y-%m-%dT%H:%M:%SZ")},
          {"machine",
           {{"host", CommandOutput("hostname 2>/dev/null")},
            {"cpus", CommandOutput("nproc 2>/dev/null")},
            {"cpu_model", cpu_model},
            {"load_average_at_end", CommandOutput("cut -d' ' -f1-3 /proc/loadavg 2>/dev/null")},
            {"torch_threads", at::get_num_threads()}}}};
}

}  // namespace

namespace {

// --temperature, --top-p, --seeds: kInvalidArgument naming the flag.
Status CheckSampling(const BenchSampling& s) {
  if (!std::isfinite(s.temperature) || s.temperature < 0) return InvalidArgumentError("--temperature: must be >= 0");
  if (!(s.top_p > 0 && s.top_p <= 1)) return InvalidArgumentError("--top-p: must be in (0, 1]");
  if (s.n_seeds < 1) return InvalidArgumentError("--seeds: must be >= 1");
  return OkStatus();
}

}  // namespace

int RunBench(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CommonFlags cf;
  std::string methods_flag = "ar,static,threshold,calibrated,del,adaedl,lede", policies, json_path;
  flags::FlagSet f;
  cf.AddTo(f);
  f.Add("methods", &methods_flag, "comma-separated: ar, static, threshold, calibrated, del, adaedl, lede");
  f.Add("policy", &policies, "LEDE policy artifact directories, comma-separated");
  f.Add("json", &json_path, "write all results as JSON here");
  std::string fixed_static;
  f.Add("static-configs", &fixed_static,
        "extra static rows E:D[,E:D...], not tuned (e.g. the settings tuned on another prompt set)");
  BenchSampling sampling;
  f.Add("temperature", &sampling.temperature, "sampling temperature, >= 0 (0 = greedy)");
  f.Add("top-p", &sampling.top_p, "nucleus mass in (0, 1] when sampling");
  f.Add("seeds", &sampling.n_seeds, "sampled runs per prompt, seeds 1..N (every method the same seeds)");
  if (flags::WantsHelp(args)) {
    out << "usage: lede-bench bench --model DIR --prompts FILE[,FILE...] [flags]\nflags:\n" << f.Usage();
    return 0;
  }
  if (Status s = f.Parse(args); !s.ok()) {
    err << "lede-bench bench: " << s.message() << " (see lede-bench bench --help)\n";
    return 2;
  }
  if (Status s = CheckSampling(sampling); !s.ok()) {
    err << "lede-bench bench: " << s.message() << "\n";
    return 2;
  }
  auto common = Setup(cf);
  if (!common.ok()) {
    err << "lede-bench bench: " << common.status().message() << "\n";
    return common.status().code() == StatusCode::kInternal ? 1 : 2;
  }
  Common& c = *common;
  const std::vector<std::string> methods = SplitList(methods_flag);
  std::vector<policy::dqn::Artifact> artifacts;
  for (const std::string& dir : SplitList(policies)) {
    auto a = policy::dqn::LoadArtifact(dir, c.model->config().ArchitectureFingerprint());
    if (!a.ok()) {
      err << "lede-bench bench: --policy " << dir << ": " << a.status().message() << "\n";
      return 2;
    }
    artifacts.push_back(std::move(*a));
  }
  if (std::find(methods.begin(), methods.end(), "lede") != methods.end() && artifacts.empty()) {
    err << "lede-bench bench: method lede needs --policy\n";
    return 2;
  }
  nlohmann::json report;
  report["model"] = cf.model;
  report["candidate_layers"] = c.spec.candidate_layers;
  report["max_draft_len"] = c.spec.max_draft_len;
  report["new_tokens"] = cf.new_tokens;
  const std::string started = CommandOutput("date -u +%Y-%m-%dT%H:%M:%SZ");
  for (const PromptSet& set : c.sets) {
    SetBench bench(c, cf, set, methods, sampling, out, err);
    StatusOr<nlohmann::json> set_report = bench.Run(artifacts, fixed_static);
    if (!set_report.ok()) {
      err << "lede-bench bench: " << set_report.status().message() << "\n";
      return set_report.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
    report["sets"][set.name] = *set_report;
  }
  report["provenance"] = Provenance("bench", args);
  report["provenance"]["date"] = started;
  if (!json_path.empty()) {
    std::ofstream(json_path) << report.dump(2) << "\n";
    err << "wrote " << json_path << "\n";
  }
  return 0;
}

int RunCollect(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CommonFlags cf;
  std::string out_dir, cost_model = "accelerator", reward = "paper", version = "explore";
  double epsilon = 0.2;
  int64_t seeds = 4;
  flags::FlagSet f;
  cf.AddTo(f);
  f.Add("out", &out_dir, "experience shard directory", true);
  f.Add("cost-model", &cost_model, "reward cost model: accelerator or measured");
  f.Add("reward", &reward, "paper (docs/design.md §2) or throughput (tokens minus cost)");
  f.Add("epsilon", &epsilon, "probability of a random action");
  f.Add("seeds", &seeds, "runs per tuning prompt (each with another behaviour policy and seed)");
  f.Add("version", &version, "behaviour policy version recorded in the transitions");
  if (flags::WantsHelp(args)) {
    out << "usage: lede-bench collect --model DIR --prompts FILE[,FILE...] --out DIR [flags]\nflags:\n" << f.Usage();
    return 0;
  }
  if (Status s = f.Parse(args); !s.ok()) {
    err << "lede-bench collect: " << s.message() << " (see lede-bench collect --help)\n";
    return 2;
  }
  if (cost_model != "accelerator" && cost_model != "measured") {
    err << "lede-bench collect: --cost-model: want accelerator or measured\n";
    return 2;
  }
  if (reward != "paper" && reward != "throughput") {
    err << "lede-bench collect: --reward: want paper or throughput\n";
    return 2;
  }
  auto common = Setup(cf);
  if (!common.ok()) {
    err << "lede-bench collect: " << common.status().message() << "\n";
    return 2;
  }
  Common& c = *common;
  const experience::RewardSpec rewards =
      RewardsFor(reward, cost_model == "accelerator" ? *c.accelerator : *c.measured, c);
  std::filesystem::create_directories(out_dir);
  // Behaviour policies: thresholds from eager to cautious, with exploration.
  const std::vector<std::pair<float, float>> behaviours = {{0.5f, 0.5f}, {0.8f, 0.7f}, {0.3f, 0.3f}, {0.9f, 0.9f}};
  const std::string fingerprint = c.model->config().ArchitectureFingerprint();
  int64_t total = 0;
  for (const PromptSet& set : c.sets) {
    for (int64_t seed = 0; seed < seeds; ++seed) {
      const std::string shard = out_dir + "/" + set.name + "-" + cost_model + "-" + std::to_string(seed) + ".lexp";
      auto writer = experience::ShardWriter::Create(shard);
      if (!writer.ok()) {
        err << "lede-bench collect: " << writer.status().message() << "\n";
        return 1;
      }
      auto [lambda, tau] = behaviours[seed % behaviours.size()];
      for (size_t i = 0; i < set.tuning.size(); ++i) {
        policy::ThresholdExitController behaviour(lambda, tau);
        policy::EpsilonGreedyController explore(behaviour, epsilon, static_cast<uint64_t>(seed * 100003 + i));
        GenerateOptions o;
        o.max_new_tokens = cf.new_tokens;
        o.mode = model::SpeculationMode::kAdaptive;
        o.controller = &explore;
        o.decision_spec = c.spec;
        o.record_traces = true;
        auto r = c.engine->Generate(set.tuning[i], o);
        if (!r.ok()) {
          err << "lede-bench collect: " << r.status().message() << "\n";
          return 1;
        }
        const std::string request_id = set.name + ":" + std::to_string(i) + ":" + std::to_string(seed);
        for (const speculation::RoundTrace& trace : r->traces) {
          for (const experience::Transition& t : experience::ToTransitions(trace, rewards, request_id, version, fingerprint)) {
            if (Status s = (*writer)->Append(t); !s.ok()) {
              err << "lede-bench collect: " << s.message() << "\n";
              return 1;
            }
          }
        }
        PrintProgress(err, set.name + " seed " + std::to_string(seed), i + 1, set.tuning.size());
      }
      total += (*writer)->records();
      if (Status s = (*writer)->Finish(); !s.ok()) {
        err << "lede-bench collect: " << s.message() << "\n";
        return 1;
      }
    }
    err << "\n";
  }
  out << "wrote " << total << " transitions (" << reward << " rewards, " << cost_model << " costs) to " << out_dir
      << "\n";
  return 0;
}

}  // namespace lede::bench
