#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <utility>

#include "policy/dqn/method_factory.h"
#include "shared/status/status_macros.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "trainer/exit_eval.h"
#include "trainer/internal/retrain_run.h"
#include "trainer/request_retrain.h"
#include "trainer/retrain_pricing.h"

namespace lede::trainer::internal {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double Number(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
}

// Held-out prompts of a .jsonl file ("prompt", "text" or "input" fields).
StatusOr<std::vector<std::vector<int32_t>>> LoadPrompts(const std::string& path, const tokenizer::Tokenizer& tok,
                                                        int64_t skip, int64_t count) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot read prompt file " + path);
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  int64_t index = 0;
  while (std::getline(in, line) && static_cast<int64_t>(prompts.size()) < count) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return InvalidArgumentError(path + ": a line is not a JSON object");
    if (index++ < skip) continue;
    std::string text;
    for (const char* key : {"prompt", "text", "input"}) {
      if (j.contains(key) && j[key].is_string()) {
        text = j[key].get<std::string>();
        break;
      }
    }
    if (text.empty()) continue;
    LEDE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(text, true, false));
    prompts.push_back(std::move(ids));
  }
  if (prompts.empty()) {
    return InvalidArgumentError(path + ": no prompt from line " + std::to_string(skip) + " on");
  }
  return prompts;
}

// Restores libtorch's intra-op thread count on scope exit.
class ThreadCountGuard {
 public:
  explicit ThreadCountGuard(int n) : previous_(at::get_num_threads()) {
    if (n > 0) at::set_num_threads(n);
  }
  ~ThreadCountGuard() { at::set_num_threads(previous_); }

 private:
  int previous_;
};

}  // namespace

Status ReplayEvaluator::LoadModel(const RetrainOptions& o) {
  if (model_ != nullptr) return OkStatus();
  model::ModelOptions f32;
  f32.weights = model::loaders::WeightFormat::kF32;  // trained in float32, whatever the file stores
  LEDE_ASSIGN_OR_RETURN(auto loaded, model::LlamaModel::Load(o.model_dir, f32));
  std::shared_ptr<const model::LlamaModel> m = std::move(loaded);
  cost_models_["accelerator"] = model::cost::MakeAcceleratorCostModel(m->config());
  std::string calibration = o.calibration;
  if (calibration.empty() && fs::exists(fs::path(o.model_dir) / "calibration-cpu.json")) {
    calibration = (fs::path(o.model_dir) / "calibration-cpu.json").string();
  }
  if (!calibration.empty()) {
    LEDE_ASSIGN_OR_RETURN(model::cost::Calibration cal, model::cost::ReadCalibrationFile(calibration));
    cost_models_["measured"] = model::cost::MakeMeasuredCostModel(cal);
  }
  model_ = std::move(m);
  return OkStatus();
}

Status ReplayEvaluator::LoadReplay(const RetrainOptions& o, const speculation::DecisionSpec& spec) {
  if (engine_ != nullptr) return OkStatus();
  LEDE_RETURN_IF_ERROR(LoadModel(o));
  LEDE_ASSIGN_OR_RETURN(std::string tok_path, tokenizer::FindTokenizerFile(o.model_dir));
  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok, tokenizer::LoadTokenizer(tok_path));
  LEDE_ASSIGN_OR_RETURN(prompts_, LoadPrompts(o.eval_prompts, *tok, o.eval_prompt_skip, o.eval_prompt_count));
  model::KvCacheOptions ko;
  ko.max_draft_len = std::max<int64_t>(16, spec.max_draft_len);
  LEDE_ASSIGN_OR_RETURN(engine_, model::Engine::Create(model_, ko));
  {  // Warm-up, so the first measured tokens/s is not a cold start.
    model::GenerateOptions warm;
    warm.max_new_tokens = 8;
    LEDE_RETURN_IF_ERROR(engine_->Generate(prompts_.front(), warm).status());
  }
  return OkStatus();
}

Status ReplayEvaluator::LoadServedCosts(const RetrainOptions& o, storage::ObjectStore& store,
                                        const policy::dqn::PolicyMetadata& smeta, RetrainRun* run) {
  const std::string priced = "serving version " + smeta.version + " is priced by the deployment's " +
                             kServedCostModel + " costs (reward_cost_model " + kServedCostModel + "); ";
  if (o.model_dir.empty()) return FailedPreconditionError(priced + "the td trainer needs model_dir (--model)");
  LEDE_RETURN_IF_ERROR(LoadModel(o));
  if (model_->config().ArchitectureFingerprint() != smeta.model_fingerprint) {
    return FailedPreconditionError(priced + "model " + o.model_dir + " is not the policy's model " +
                                   smeta.model_fingerprint);
  }
  StatusOr<std::unique_ptr<model::cost::CostModel>> served = ReadServedCostModel(store, o.requests_prefix, *model_);
  if (!served.ok()) {
    if (served.status().code() != StatusCode::kNotFound) return served.status();
    return FailedPreconditionError(priced + "the request log under '" + o.requests_prefix +
                                   "' holds none: " + std::string(served.status().message()));
  }
  cost_models_[kServedCostModel] = *std::move(served);
  run->repriceable.clear();
  for (const auto& [name, cm] : cost_models_) {
    if (name != kServedCostModel) run->repriceable.insert(name);
  }
  return OkStatus();
}

Status ReplayEvaluator::RepriceWindow(const policy::dqn::PolicyMetadata& smeta, RetrainRun* run) const {
  const model::cost::CostModel& to = *cost_models_.at(smeta.reward_cost_model);
  for (const std::string& name : run->repriceable) {
    std::vector<size_t> at;
    std::vector<experience::Transition> ts;
    for (size_t i = 0; i < run->window.size(); ++i) {
      if (run->window[i].reward_cost_model != name) continue;
      at.push_back(i);
      ts.push_back(run->window[i]);
    }
    if (ts.empty()) continue;
    LEDE_RETURN_IF_ERROR(RepriceExperience(*cost_models_.at(name), to, static_cast<int32_t>(model_->n_layers()),
                                           smeta.decision, &ts));
    for (size_t j = 0; j < at.size(); ++j) run->window[at[j]] = std::move(ts[j]);
    run->repriced[name] = static_cast<int64_t>(at.size());
  }
  return OkStatus();
}

// Greedy generation of every held-out prompt with `controller` (null:
// autoregressive), summarized.
StatusOr<json> ReplayEvaluator::Replay(const RetrainOptions& o, const std::shared_ptr<const policy::dqn::QNetwork>& network,
                      const policy::dqn::PolicyMetadata* meta) {
  model::GenerateOptions g;
  g.max_new_tokens = o.eval_new_tokens;
  ControllerFactory factory;
  if (network != nullptr) {
    LEDE_ASSIGN_OR_RETURN(
        policy::dqn::MethodPlan plan,
        policy::dqn::PlanTrainedPolicy(std::make_shared<const policy::dqn::Artifact>(policy::dqn::Artifact{*meta, *network}),
                                       static_cast<int32_t>(model_->n_layers())));
    g.mode = plan.mode;
    g.decision_spec = plan.decision_spec;
    factory = [plan](int64_t) { return plan.MakeController(); };
  }
  ThreadCountGuard threads(o.eval_threads);
  LEDE_ASSIGN_OR_RETURN(PromptTotals t, RunPrompts(*engine_, prompts_, g, factory, nullptr));
  json j = {{"tokens", t.tokens},
            {"rounds", static_cast<int64_t>(t.rounds.size())},
            {"drafted", t.drafted},
            {"accepted", t.accepted},
            {"acceptance_rate", t.acceptance()},
            {"tokens_per_round", t.tokens_per_round()},
            {"mean_exit_layer", t.mean_exit()},
            {"mean_draft_length", t.mean_draft()},
            {"tokens_per_s", t.tokens_per_s()}};
  for (const auto& [name, cm] : cost_models_) {
    j["predicted_speedup_" + name] = network != nullptr ? cm->PredictedSpeedup(t.rounds) : 1.0;
  }
  return j;
}

Status ReplayEvaluator::ReplayCandidate(const RetrainOptions& o, const policy::dqn::PolicyMetadata& smeta,
                                       policy::dqn::Artifact* candidate, RetrainRun* run_ptr) {
  RetrainRun& run = *run_ptr;
  LEDE_RETURN_IF_ERROR(LoadReplay(o, smeta.decision));
  if (cost_models_.count(smeta.reward_cost_model) == 0) {
    return FailedPreconditionError("replay: no '" + smeta.reward_cost_model +
                                   "' cost model (the reward's); give its calibration");
  }
  if (model_->config().ArchitectureFingerprint() != smeta.model_fingerprint) {
    return FailedPreconditionError("replay: model " + o.model_dir + " is not the policy's model " +
                                   smeta.model_fingerprint);
  }
  auto cand_net = std::make_shared<const policy::dqn::QNetwork>(candidate->network);
  LEDE_ASSIGN_OR_RETURN(json ar, Replay(o, nullptr, nullptr));
  LEDE_ASSIGN_OR_RETURN(json rs, Replay(o, run.dqn.initial_network, &smeta));
  LEDE_ASSIGN_OR_RETURN(json rc, Replay(o, cand_net, &candidate->metadata));
  const double ar_tps = Number(ar, "tokens_per_s");
  for (json* j : {&rs, &rc}) {
    (*j)["predicted_speedup"] = (*j)["predicted_speedup_" + smeta.reward_cost_model];
    (*j)["measured_speedup"] = Number(*j, "tokens_per_s") / std::max(1e-9, ar_tps);
  }
  run.replay = {{"prompts", static_cast<int64_t>(prompts_.size())},
                {"prompt_file", o.eval_prompts},
                {"prompt_skip", o.eval_prompt_skip},
                {"new_tokens", o.eval_new_tokens},
                {"cost_model", smeta.reward_cost_model},
                {"autoregressive", {{"tokens_per_s", ar_tps}}},
                {"serving", rs},
                {"candidate", rc}};
  run.metric_name = "replay_predicted_speedup";
  run.cand_metric = Number(rc, "predicted_speedup");
  run.serv_metric = Number(rs, "predicted_speedup");
  std::map<std::string, double>& om = candidate->metadata.offline_metrics;
  om["replay_predicted_speedup"] = run.cand_metric;
  om["replay_acceptance_rate"] = Number(rc, "acceptance_rate");
  om["replay_tokens_per_round"] = Number(rc, "tokens_per_round");
  om["replay_tokens_per_s"] = Number(rc, "tokens_per_s");
  if (o.log) {
    o.log("replay (" + std::to_string(prompts_.size()) + " prompts x " + std::to_string(o.eval_new_tokens) +
          " tokens): predicted speed-up serving " + std::to_string(run.serv_metric) + " candidate " +
          std::to_string(run.cand_metric));
  }
  return OkStatus();
}

}  // namespace lede::trainer::internal
