#include "trainer/retrain.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <utility>

#include "policy/dqn/artifact.h"
#include "policy/dqn/artifact_store.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "policy/dqn/method_factory.h"
#include "policy/dqn/q_network.h"
#include "shared/file/file.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/speculation/method.h"
#include "shared/status/status_macros.h"
#include "shared/storage/object_store.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "trainer/exit_eval.h"
#include "trainer/policy_root_lock.h"
#include "trainer/heldout_split.h"
#include "shared/experience/experience.h"
#include "shared/experience/request_log.h"
#include "trainer/request_retrain.h"

namespace lede::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using experience::Transition;

constexpr char kStateFormat[] = "lede-retrain-state-v1";
constexpr char kReportFormat[] = "lede-retrain-report-v1";
constexpr char kExploreMarker[] = "+eps=";

std::string UtcNow(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[48];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

bool IsExploration(const std::string& version) { return version.find(kExploreMarker) != std::string::npos; }

// The folder form of a key prefix ("" stays "", "a" becomes "a/").
std::string FolderPrefix(const std::string& prefix) {
  if (prefix.empty() || prefix.back() == '/') return prefix;
  return prefix + "/";
}

json OfflineJson(const OfflinePolicyMetrics& m) {
  json j = json::object();
  for (const auto& [name, value] : OfflineMetricFields(m)) j[name] = value;
  return j;
}

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

const char* RetrainDecisionName(RetrainDecision decision) {
  switch (decision) {
    case RetrainDecision::kNoNewData:
      return "no_new_data";
    case RetrainDecision::kPublished:
      return "published";
    case RetrainDecision::kRejected:
      return "rejected";
  }
  return "unknown";
}

StatusOr<RetrainState> ReadRetrainState(const std::string& path) {
  RetrainState state;
  std::error_code ec;
  if (!fs::exists(path, ec)) return state;
  StatusOr<std::string> text = file::ReadFile(path);
  if (!text.ok()) return InternalError("retrain state " + path + ": " + std::string(text.status().message()));
  const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgumentError("retrain state " + path + ": not a JSON object");
  if (j.value("format", std::string()) != kStateFormat) {
    return InvalidArgumentError("retrain state " + path + ": format is not " + std::string(kStateFormat));
  }
  try {
    for (const json& k : j.value("processed_shards", json::array())) state.processed_shards.insert(k.get<std::string>());
    state.last_version = j.value("last_version", std::string());
    state.last_decision = j.value("last_decision", std::string());
    state.last_run_utc = j.value("last_run_utc", std::string());
    state.runs = j.value("runs", int64_t{0});
    state.published = j.value("published", int64_t{0});
  } catch (const json::exception& e) {
    return InvalidArgumentError("retrain state " + path + ": " + e.what());
  }
  return state;
}

Status WriteRetrainState(const std::string& path, const RetrainState& state) {
  json j = {{"format", kStateFormat},
            {"processed_shards", state.processed_shards},
            {"last_version", state.last_version},
            {"last_decision", state.last_decision},
            {"last_run_utc", state.last_run_utc},
            {"runs", state.runs},
            {"published", state.published}};
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  return file::WriteFileAtomically(path, j.dump(2) + "\n");
}

// --- the replay evaluation's engine ---------------------------------------------

namespace {

// What one RunOnce() gathers, step by step (the numbered steps below).
struct RetrainRun {
  // 1. shards under the prefix (List's order), split by the state checkpoint
  std::string prefix;
  std::vector<std::string> keys, new_keys, old_keys;
  // 3. the replay window and what reading it found
  std::vector<Transition> window;
  std::vector<std::string> used_keys, window_sorted;
  int64_t n_read = 0, n_bad_shards = 0, n_new_bad_shards = 0, other_model = 0, other_cost = 0, n_new = 0;
  int64_t n_new_other_model_shards = 0;  // new shards with records of another model
  json bad_shards = json::array();
  // 4. the held-out split
  std::vector<Transition> train, held;
  std::string split_unit = "request";
  // 5-6. training and evaluation
  DqnOptions dqn;
  json epochs = json::array();
  std::optional<DqnResult> trained;  // DqnResult has no empty state
  OfflinePolicyMetrics off_serving, off_candidate;
  json replay;
  // 7. the decision
  std::string metric_name = "heldout_matched_return";
  double cand_metric = 0, serv_metric = 0;
  bool publish = false;
};

}  // namespace

struct Retrainer::Impl {
  std::unique_ptr<storage::ObjectStore> store;
  std::unique_ptr<storage::ObjectStore> policy_store;  // null: policy_root alone
  // Replay (lazily loaded on the first run that needs it).
  std::shared_ptr<const model::LlamaModel> model;
  std::unique_ptr<model::Engine> engine;
  std::vector<std::vector<int32_t>> prompts;
  std::map<std::string, std::unique_ptr<model::cost::CostModel>> cost_models;  // by name

  // 6b of RunOnce(): replays held-out prompts through the in-process engine
  // (autoregressive, the serving policy, the candidate); the decision metric
  // becomes the predicted speed-up under the reward's cost model.
  Status ReplayCandidate(const RetrainOptions& o, const policy::dqn::PolicyMetadata& smeta,
                         policy::dqn::Artifact* candidate, RetrainRun* run);

  Status LoadReplay(const RetrainOptions& o, const speculation::DecisionSpec& spec) {
    if (engine != nullptr) return OkStatus();
    LEDE_ASSIGN_OR_RETURN(std::string tok_path, tokenizer::FindTokenizerFile(o.model_dir));
    LEDE_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok, tokenizer::LoadTokenizer(tok_path));
    LEDE_ASSIGN_OR_RETURN(prompts, LoadPrompts(o.eval_prompts, *tok, o.eval_prompt_skip, o.eval_prompt_count));
    model::ModelOptions f32;
    f32.weights = model::loaders::WeightFormat::kF32;  // trained in float32, whatever the file stores
    LEDE_ASSIGN_OR_RETURN(auto loaded, model::LlamaModel::Load(o.model_dir, f32));
    std::shared_ptr<const model::LlamaModel> m = std::move(loaded);
    model::KvCacheOptions ko;
    ko.max_draft_len = std::max<int64_t>(16, spec.max_draft_len);
    LEDE_ASSIGN_OR_RETURN(engine, model::Engine::Create(m, ko));
    model = m;
    {  // Warm-up, so the first measured tokens/s is not a cold start.
      model::GenerateOptions warm;
      warm.max_new_tokens = 8;
      LEDE_RETURN_IF_ERROR(engine->Generate(prompts.front(), warm).status());
    }
    cost_models["accelerator"] = model::cost::MakeAcceleratorCostModel(model->config());
    std::string calibration = o.calibration;
    if (calibration.empty() && fs::exists(fs::path(o.model_dir) / "calibration-cpu.json")) {
      calibration = (fs::path(o.model_dir) / "calibration-cpu.json").string();
    }
    if (!calibration.empty()) {
      LEDE_ASSIGN_OR_RETURN(model::cost::Calibration cal, model::cost::ReadCalibrationFile(calibration));
      cost_models["measured"] = model::cost::MakeMeasuredCostModel(cal);
    }
    return OkStatus();
  }

  // Greedy generation of every held-out prompt with `controller` (null:
  // autoregressive), summarized.
  StatusOr<json> Replay(const RetrainOptions& o, const std::shared_ptr<const policy::dqn::QNetwork>& network,
                        const policy::dqn::PolicyMetadata* meta) {
    model::GenerateOptions g;
    g.max_new_tokens = o.eval_new_tokens;
    ControllerFactory factory;
    if (network != nullptr) {
      LEDE_ASSIGN_OR_RETURN(
          policy::dqn::MethodPlan plan,
          policy::dqn::PlanTrainedPolicy(std::make_shared<const policy::dqn::Artifact>(policy::dqn::Artifact{*meta, *network}),
                                         static_cast<int32_t>(model->n_layers())));
      g.mode = plan.mode;
      g.decision_spec = plan.decision_spec;
      factory = [plan](int64_t) { return plan.MakeController(); };
    }
    ThreadCountGuard threads(o.eval_threads);
    LEDE_ASSIGN_OR_RETURN(PromptTotals t, RunPrompts(*engine, prompts, g, factory, nullptr));
    json j = {{"tokens", t.tokens},
              {"rounds", static_cast<int64_t>(t.rounds.size())},
              {"drafted", t.drafted},
              {"accepted", t.accepted},
              {"acceptance_rate", t.acceptance()},
              {"tokens_per_round", t.tokens_per_round()},
              {"mean_exit_layer", t.mean_exit()},
              {"mean_draft_length", t.mean_draft()},
              {"tokens_per_s", t.tokens_per_s()}};
    for (const auto& [name, cm] : cost_models) {
      j["predicted_speedup_" + name] = network != nullptr ? cm->PredictedSpeedup(t.rounds) : 1.0;
    }
    return j;
  }
};

Retrainer::Retrainer(RetrainOptions options) : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}
Retrainer::~Retrainer() = default;

StatusOr<std::unique_ptr<Retrainer>> Retrainer::Create(RetrainOptions options) {
  auto bad = [](const std::string& what) { return InvalidArgumentError("RetrainOptions." + what); };
  if (options.experience_url.empty()) return bad("experience_url: empty");
  if (options.policy_root.empty()) return bad("policy_root: empty");
  if (!(options.heldout_fraction > 0 && options.heldout_fraction < 1)) return bad("heldout_fraction must be in (0, 1)");
  if (options.window_shards < 1) return bad("window_shards must be >= 1");
  if (options.window_transitions < 1) return bad("window_transitions must be >= 1");
  if (options.min_new_transitions < 1) return bad("min_new_transitions must be >= 1");
  if (std::isnan(options.publish_margin)) return bad("publish_margin: NaN");
  if (options.trainer != "auto" && options.trainer != "counterfactual" && options.trainer != "td") {
    return bad("trainer: want auto, counterfactual or td, got \"" + options.trainer + "\"");
  }
  if (options.trainer == "counterfactual" && options.model_dir.empty()) return bad("model_dir: needed by counterfactual");
  if (!options.model_dir.empty()) {
    if (options.eval_prompts.empty() && options.trainer == "td") return bad("eval_prompts: needed with model_dir");
    if (options.eval_prompt_count < 1 || options.eval_prompt_skip < 0 || options.eval_new_tokens < 1) {
      return bad("eval_prompt_count and eval_new_tokens must be >= 1, eval_prompt_skip >= 0");
    }
  }
  if (!options.version_prefix.empty()) {
    LEDE_RETURN_IF_ERROR(policy::dqn::ValidateVersionName(options.version_prefix + "-1"));
  }
  if (!options.experience_prefix.empty()) {
    LEDE_RETURN_IF_ERROR(storage::ValidatePrefix(FolderPrefix(options.experience_prefix)));
  }
  DqnOptions dqn = options.dqn;
  dqn.initial_network = nullptr;
  LEDE_RETURN_IF_ERROR(ValidateDqnOptions(dqn));
  std::unique_ptr<Retrainer> r(new Retrainer(std::move(options)));
  LEDE_ASSIGN_OR_RETURN(r->impl_->store, storage::OpenObjectStore(r->options_.experience_url));
  if (!r->options_.policy_store_url.empty()) {
    StatusOr<std::unique_ptr<storage::ObjectStore>> ps = storage::OpenObjectStore(r->options_.policy_store_url);
    if (!ps.ok()) return InvalidArgumentError("RetrainOptions.policy_store_url: " + std::string(ps.status().message()));
    r->impl_->policy_store = std::move(*ps);
  }
  return r;
}

Status Retrainer::PullFromPolicyStore() {
  storage::ObjectStore* ps = impl_->policy_store.get();
  if (ps == nullptr) return OkStatus();
  const RetrainOptions& o = options_;
  std::error_code ec;
  fs::create_directories(o.policy_root, ec);
  StatusOr<std::string> mirrored = policy::dqn::MirrorServingVersion(*ps, o.policy_root);
  if (mirrored.status().code() == StatusCode::kNotFound && !ps->Get(policy::dqn::kServingFile).ok()) {
    // A new store: seed it with the local serving version.
    StatusOr<std::string> local = policy::dqn::ResolveServingVersion(o.policy_root);
    if (!local.ok()) {
      return FailedPreconditionError("policy store " + ps->url() + " has no SERVING and policy root " +
                                     o.policy_root + " none to seed it with: " + local.status().ToString());
    }
    LEDE_RETURN_IF_ERROR(policy::dqn::UploadVersion(*ps, o.policy_root, *local, /*set_serving=*/true));
    if (o.log) o.log("seeded policy store " + ps->url() + " with " + *local);
  } else if (!mirrored.ok()) {
    return mirrored.status();
  }
  StatusOr<std::string> state = ps->Get(kRetrainStateFile);
  if (state.ok()) return file::WriteFileAtomically(state_path(), *state);
  return state.status().code() == StatusCode::kNotFound ? OkStatus() : state.status();
}

Status Retrainer::PushToPolicyStore(const RetrainOutcome& out) {
  storage::ObjectStore* ps = impl_->policy_store.get();
  if (ps == nullptr) return OkStatus();
  if (out.decision == RetrainDecision::kPublished) {
    LEDE_RETURN_IF_ERROR(policy::dqn::UploadVersion(*ps, options_.policy_root, out.candidate_version,
                                                    /*set_serving=*/true));
  }
  return OkStatus();
}

Status Retrainer::PushStateToPolicyStore() {
  storage::ObjectStore* ps = impl_->policy_store.get();
  if (ps == nullptr) return OkStatus();
  LEDE_ASSIGN_OR_RETURN(std::string bytes, file::ReadFile(state_path()));
  return ps->Put(kRetrainStateFile, bytes);
}

std::string Retrainer::state_path() const {
  if (!options_.state_path.empty()) return options_.state_path;
  return (fs::path(options_.policy_root) / kRetrainStateFile).string();
}

namespace {

// 1. The experience shards under `prefix`, new (not in `state`) and old.
Status ListShards(storage::ObjectStore& store, const RetrainState& state, RetrainRun* run) {
  LEDE_ASSIGN_OR_RETURN(std::vector<storage::ObjectInfo> listed, store.List(run->prefix));
  const size_t suffix = std::strlen(experience::kShardSuffix);
  for (const storage::ObjectInfo& info : listed) {
    const std::string& k = info.key;
    if (k.size() >= suffix && k.compare(k.size() - suffix, std::string::npos, experience::kShardSuffix) == 0) {
      run->keys.push_back(k);
    }
  }
  for (const std::string& k : run->keys) {
    (state.processed_shards.count(k) ? run->old_keys : run->new_keys).push_back(k);
  }
  return OkStatus();
}

// 2-3. The replay window, most recent first (new shards, then old ones), read
// and filtered to the serving policy's model and reward cost model.
void ReadWindow(storage::ObjectStore& store, const RetrainOptions& o, const policy::dqn::PolicyMetadata& smeta,
                RetrainRun* run) {
  std::vector<std::string> order(run->new_keys.rbegin(), run->new_keys.rend());
  order.insert(order.end(), run->old_keys.rbegin(), run->old_keys.rend());
  if (static_cast<int64_t>(order.size()) > o.window_shards) order.resize(static_cast<size_t>(o.window_shards));
  const std::set<std::string> new_set(run->new_keys.begin(), run->new_keys.end());
  for (const std::string& key : order) {
    if (static_cast<int64_t>(run->window.size()) >= o.window_transitions) break;
    std::vector<Transition> ts;
    const bool is_new = new_set.count(key) > 0;
    StatusOr<std::string> bytes = store.Get(key);
    if (!bytes.ok()) {
      ++run->n_bad_shards;
      run->n_new_bad_shards += is_new ? 1 : 0;
      run->bad_shards.push_back({{"key", key}, {"error", bytes.status().ToString()}});
      continue;
    }
    const experience::ShardReport report = experience::DecodeShard(*bytes, key, &ts);
    if (!report.error.empty()) {
      ++run->n_bad_shards;
      run->n_new_bad_shards += is_new ? 1 : 0;
      run->bad_shards.push_back({{"key", key}, {"records", report.records}, {"error", report.error}});
    }
    run->used_keys.push_back(key);
    run->n_read += static_cast<int64_t>(ts.size());
    const auto other = std::find_if(ts.begin(), ts.end(), [&](const Transition& t) {
      return t.model_fingerprint != smeta.model_fingerprint;
    });
    if (other != ts.end() && is_new) {
      ++run->n_new_other_model_shards;
      if (o.log) {
        o.log("msg=\"experience shard of another model: its records are filtered\" shard=" + key +
              " model_fingerprint=\"" + other->model_fingerprint + "\" serving_model_fingerprint=\"" +
              smeta.model_fingerprint + "\"");
      }
    }
    for (Transition& t : ts) {
      if (t.model_fingerprint != smeta.model_fingerprint) {
        ++run->other_model;
      } else if (t.reward_cost_model != smeta.reward_cost_model) {
        ++run->other_cost;
      } else {
        run->n_new += is_new ? 1 : 0;
        run->window.push_back(std::move(t));
        if (static_cast<int64_t>(run->window.size()) >= o.window_transitions) break;
      }
    }
  }
  run->window_sorted = run->used_keys;
  std::sort(run->window_sorted.begin(), run->window_sorted.end());
}

// Per behaviour policy version: transitions, requests, whether it explored.
json BehaviourVersions(const std::vector<Transition>& window, const std::string& serving_version) {
  json behaviour = json::object();
  std::map<std::string, std::set<std::string>> requests;
  std::map<std::string, int64_t> counts;
  for (const Transition& t : window) {
    ++counts[t.policy_version];
    requests[t.policy_version].insert(t.request_id);
  }
  for (const auto& [v, n] : counts) {
    behaviour[v] = {{"transitions", n},
                    {"requests", static_cast<int64_t>(requests[v].size())},
                    {"exploration", IsExploration(v)},
                    {"serving", v == serving_version}};
  }
  return behaviour;
}

// 4. Split by request (by episode when that leaves a side empty).
Status SplitHeldOut(double fraction, RetrainRun* run) {
  auto split = [&](bool by_request) {
    run->train.clear();
    run->held.clear();
    for (const Transition& t : run->window) {
      const std::string unit = by_request ? t.request_id : t.request_id + "/" + std::to_string(t.round_index);
      (IsHeldOut(unit, fraction) ? run->held : run->train).push_back(t);
    }
  };
  split(true);
  if (run->train.empty() || run->held.empty()) {
    split(false);
    run->split_unit = "episode";
  }
  if (run->train.empty() || run->held.empty()) {
    return FailedPreconditionError("too little experience to hold some out: " + std::to_string(run->window.size()) +
                                   " transitions");
  }
  return OkStatus();
}

// The candidate's name, reserved (policy_root_lock.h) so that no other
// writer of the root takes it: "<prefix>-<n+1>" after the highest one in
// the policy root, its candidates or the reservations, or "r<UTC time>"
// ("-2", "-3", ... when taken) without a prefix.
StatusOr<VersionReservation> ReserveCandidateVersion(const RetrainOptions& o) {
  auto taken = [&](const std::string& v) {
    std::error_code ec;
    return fs::exists(fs::path(o.policy_root) / v, ec) || fs::exists(fs::path(o.policy_root) / kCandidatesDir / v, ec);
  };
  if (o.version_prefix.empty()) {
    const std::string base = "r" + UtcNow("%Y%m%d-%H%M%S");
    return ReserveVersionName(
        o.policy_root, [&](int attempt) { return attempt == 0 ? base : base + "-" + std::to_string(attempt + 1); },
        taken);
  }
  int64_t n = 0;
  const std::string head = o.version_prefix + "-";
  std::error_code ec;
  for (const fs::path& dir : {fs::path(o.policy_root), fs::path(o.policy_root) / kCandidatesDir,
                              fs::path(o.policy_root) / kReservedVersionsDir}) {
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.compare(0, head.size(), head) != 0) continue;
      const std::string tail = name.substr(head.size());
      if (!tail.empty() && tail.size() < 18 && std::all_of(tail.begin(), tail.end(), ::isdigit)) {
        n = std::max<int64_t>(n, std::stoll(tail));
      }
    }
  }
  return ReserveVersionName(
      o.policy_root, [&](int attempt) { return o.version_prefix + "-" + std::to_string(n + 1 + attempt); }, taken);
}

// The candidate artifact: the fine-tuned network, the serving policy's
// model, decision spec and cost model, its data and offline metrics.
policy::dqn::Artifact MakeCandidate(const RetrainRun& run, const policy::dqn::PolicyMetadata& smeta,
                                    const std::string& version) {
  policy::dqn::PolicyMetadata meta;
  meta.version = version;
  meta.model_fingerprint = smeta.model_fingerprint;
  meta.decision = smeta.decision;
  meta.reward_cost_model = smeta.reward_cost_model;
  meta.training_data.first_shard = run.window_sorted.front();
  meta.training_data.last_shard = run.window_sorted.back();
  meta.training_data.n_shards = static_cast<int64_t>(run.window_sorted.size());
  meta.training_data.n_bad_shards = run.n_bad_shards;
  policy::dqn::Artifact candidate = MakeArtifact(*run.trained, run.dqn, meta);
  const OfflinePolicyMetrics& off = run.off_candidate;
  candidate.metadata.training_data.n_heldout_transitions = off.n_transitions;
  candidate.metadata.training_data.n_heldout_episodes = off.n_episodes;
  AddOfflineMetrics(off, "heldout_", &candidate.metadata.offline_metrics);
  return candidate;
}

// The retrain report (retrain_report.json, kReportFormat) of a decided run.
json RetrainReport(const RetrainRun& run, const RetrainOptions& o, const RetrainOutcome& out,
                   const policy::dqn::PolicyMetadata& smeta, const std::string& store_url) {
  std::set<std::string> train_requests, held_requests;
  for (const Transition& t : run.train) train_requests.insert(t.request_id);
  for (const Transition& t : run.held) held_requests.insert(t.request_id);
  int64_t n_explore = 0;
  for (const Transition& t : run.window) n_explore += IsExploration(t.policy_version) ? 1 : 0;
  const DqnOptions& dqn = run.dqn;
  const json data = {
      {"experience_url", store_url},
      {"prefix", run.prefix},
      {"n_shards_listed", static_cast<int64_t>(run.keys.size())},
      {"n_new_shards", static_cast<int64_t>(run.new_keys.size())},
      {"first_new_shard", run.new_keys.front()},
      {"last_new_shard", run.new_keys.back()},
      {"window", {{"n_shards", static_cast<int64_t>(run.used_keys.size())},
                  {"first_shard", run.window_sorted.front()},
                  {"last_shard", run.window_sorted.back()},
                  {"max_shards", o.window_shards},
                  {"max_transitions", o.window_transitions}}},
      {"bad_shards", run.bad_shards},
      {"n_transitions_read", run.n_read},
      {"filtered_other_model", run.other_model},
      {"new_other_model_shards", run.n_new_other_model_shards},
      {"filtered_other_cost_model", run.other_cost},
      {"n_transitions", static_cast<int64_t>(run.window.size())},
      {"n_new_transitions", run.n_new},
      {"model_fingerprint", smeta.model_fingerprint},
      {"reward_cost_model", smeta.reward_cost_model},
      {"split", {{"unit", run.split_unit},
                 {"heldout_fraction", o.heldout_fraction},
                 {"train_transitions", static_cast<int64_t>(run.train.size())},
                 {"train_requests", static_cast<int64_t>(train_requests.size())},
                 {"heldout_transitions", static_cast<int64_t>(run.held.size())},
                 {"heldout_requests", static_cast<int64_t>(held_requests.size())}}},
      {"behaviour_versions", BehaviourVersions(run.window, smeta.version)},
      {"exploration_transitions", n_explore},
      {"greedy_transitions", static_cast<int64_t>(run.window.size()) - n_explore}};
  const json training = {{"warm_start", smeta.version},
                         {"epochs", dqn.epochs},
                         {"lr", dqn.lr},
                         {"batch_size", dqn.batch_size},
                         {"gamma", dqn.gamma},
                         {"n_step", dqn.n_step},
                         {"seed", dqn.seed},
                         {"n_train_transitions", run.trained->n_train_transitions},
                         {"n_dropped", run.trained->n_dropped},
                         {"n_duplicates", run.trained->n_duplicates},
                         {"per_epoch", run.epochs}};
  return {{"format", kReportFormat},
          {"created_utc", UtcNow("%Y-%m-%dT%H:%M:%SZ")},
          {"decision", RetrainDecisionName(out.decision)},
          {"reason", out.reason},
          {"serving_version", smeta.version},
          {"candidate_version", out.candidate_version},
          {"artifact_dir", out.artifact_dir},
          {"decision_metric", run.metric_name},
          {"publish_margin", std::isfinite(o.publish_margin) ? json(o.publish_margin)
                                                             : json(o.publish_margin > 0 ? "inf" : "-inf")},
          {"candidate_metric", run.cand_metric},
          {"serving_metric", run.serv_metric},
          {"improvement", run.cand_metric - run.serv_metric},
          {"data", data},
          {"off_policy",
           "Q-learning targets use max_a Q_target(s', a), so transitions of any behaviour policy (the serving "
           "version's greedy and epsilon-exploration records, older versions) are valid samples and all are "
           "kept; records of other models or reward cost models are filtered; n-step returns (n = " +
               std::to_string(dqn.n_step) +
               ") follow the behaviour actions uncorrected; recency is bounded by the replay window"},
          {"training", training},
          {"offline", {{"serving", OfflineJson(run.off_serving)}, {"candidate", OfflineJson(run.off_candidate)}}},
          {"replay", run.replay}};
}

// 8. The state checkpoint: every new shard has been trained on now; keys no
// longer in the store are forgotten.
RetrainState NextState(const RetrainState& state, const RetrainRun& run, const RetrainOutcome& out) {
  RetrainState next;
  const std::set<std::string> listed_set(run.keys.begin(), run.keys.end());
  for (const std::string& k : state.processed_shards) {
    if (listed_set.count(k)) next.processed_shards.insert(k);
  }
  next.processed_shards.insert(run.new_keys.begin(), run.new_keys.end());
  next.last_version = out.candidate_version;
  next.last_decision = RetrainDecisionName(out.decision);
  next.last_run_utc = UtcNow("%Y-%m-%dT%H:%M:%SZ");
  next.runs = state.runs + 1;
  next.published = state.published + (run.publish ? 1 : 0);
  return next;
}

}  // namespace

Status Retrainer::Impl::ReplayCandidate(const RetrainOptions& o, const policy::dqn::PolicyMetadata& smeta,
                                        policy::dqn::Artifact* candidate, RetrainRun* run_ptr) {
  RetrainRun& run = *run_ptr;
  LEDE_RETURN_IF_ERROR(LoadReplay(o, smeta.decision));
  if (cost_models.count(smeta.reward_cost_model) == 0) {
    return FailedPreconditionError("replay: no '" + smeta.reward_cost_model +
                                   "' cost model (the reward's); give its calibration");
  }
  if (model->config().ArchitectureFingerprint() != smeta.model_fingerprint) {
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
  run.replay = {{"prompts", static_cast<int64_t>(prompts.size())},
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
    o.log("replay (" + std::to_string(prompts.size()) + " prompts x " + std::to_string(o.eval_new_tokens) +
          " tokens): predicted speed-up serving " + std::to_string(run.serv_metric) + " candidate " +
          std::to_string(run.cand_metric));
  }
  return OkStatus();
}

namespace {

// The measured cost model's calibration for the request trainer, in this
// order: --calibration (it must be readable), <model_dir>/calibration-cpu.json,
// the one an earlier run took (<policy_root>/calibration-cpu.json), or one
// taken now (model::cost::Calibrate: 3 round passes, draft lengths up to the
// decision spec's, the serving network's forward pass timed as the
// decision) and kept there, so that the model is calibrated once. Every one
// must be of `m` (the fingerprints).
// Errors: kFailedPrecondition naming an unreadable --calibration or a
// calibration of another model (both fingerprints); those of Calibrate and
// of the write.
StatusOr<model::cost::Calibration> RequestTrainerCalibration(const RetrainOptions& o, const model::LlamaModel& m,
                                                      const policy::dqn::Artifact& serving) {
  const std::string fingerprint = m.config().ArchitectureFingerprint();
  auto of_this_model = [&](StatusOr<model::cost::Calibration> cal,
                           const std::string& path) -> StatusOr<model::cost::Calibration> {
    if (cal.ok() && cal->model_fingerprint != fingerprint) {
      return FailedPreconditionError("calibration " + path + " is of model " + cal->model_fingerprint +
                                     ", the model is " + fingerprint);
    }
    return cal;
  };
  if (!o.calibration.empty()) {
    StatusOr<model::cost::Calibration> cal = model::cost::ReadCalibrationFile(o.calibration);
    if (!cal.ok()) {
      return FailedPreconditionError("--calibration " + o.calibration + ": " + std::string(cal.status().message()));
    }
    return of_this_model(std::move(cal), o.calibration);
  }
  const std::string own = o.policy_root + "/" + kOwnCalibrationFile;
  for (const std::string& path : {o.model_dir + "/calibration-cpu.json", own}) {
    if (fs::exists(path)) return of_this_model(model::cost::ReadCalibrationFile(path), path);
  }
  if (o.log) o.log("msg=\"no calibration of the model; calibrating it once\" path=" + own);
  const auto start = std::chrono::steady_clock::now();
  const std::function<void()> decide = policy::dqn::TimedDecision(serving.network);
  const int64_t max_draft_len = std::clamp<int64_t>(serving.metadata.decision.max_draft_len, 1, 16);
  LEDE_ASSIGN_OR_RETURN(model::cost::Calibration cal, model::cost::Calibrate(m, 20, decide, 3, max_draft_len));
  LEDE_RETURN_IF_ERROR(file::WriteFileAtomically(own, model::cost::CalibrationToJson(cal)));
  if (o.log) {
    o.log("msg=\"calibrated\" path=" + own + " seconds=" +
          std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()));
  }
  return cal;
}

}  // namespace

// RunOnce with the counterfactual trainer on the request log.
StatusOr<RetrainOutcome> Retrainer::RunOnceOnRequests(const policy::dqn::Artifact& serving, RetrainState state) {
  const RetrainOptions& o = options_;
  RetrainOutcome out;
  out.serving_version = serving.metadata.version;
  if (impl_->model == nullptr) {
    LEDE_ASSIGN_OR_RETURN(auto loaded, model::LlamaModel::Load(o.model_dir, model::ModelOptions{}));
    impl_->model = std::shared_ptr<const model::LlamaModel>(std::move(loaded));
  }
  const model::LlamaModel& m = *impl_->model;
  // The cost model of the serving policy's rewards (the candidate is
  // trained and both are compared under it, as the verifier prices the
  // served experience): the accelerator model, or this machine's measured
  // one, calibrated once when the model has none.
  std::unique_ptr<model::cost::CostModel> cost;
  if (serving.metadata.reward_cost_model == "measured") {
    LEDE_ASSIGN_OR_RETURN(model::cost::Calibration cal, RequestTrainerCalibration(o, m, serving));
    cost = model::cost::MakeMeasuredCostModel(cal);
  } else {
    cost = model::cost::MakeAcceleratorCostModel(m.config());
  }
  RequestRetrainOptions ro;
  ro.requests_prefix = o.requests_prefix;
  ro.policy_root = o.policy_root;
  LEDE_ASSIGN_OR_RETURN(VersionReservation reserved, ReserveCandidateVersion(o));
  ro.version = reserved.name();
  ro.heldout_fraction = o.heldout_fraction;
  ro.publish_margin = o.publish_margin;
  ro.dinkelbach.max_iterations = o.counterfactual_iterations;
  ro.dinkelbach.dqn.epochs = o.counterfactual_epochs;
  ro.dinkelbach.dqn.num_threads = std::max(1, o.eval_threads);
  ro.dinkelbach.dqn.seed = o.dqn.seed;
  const int32_t L = static_cast<int32_t>(m.n_layers());
  ro.dinkelbach.spec.candidate_layers.clear();
  for (int32_t l = 1; l < L && l <= 6; ++l) ro.dinkelbach.spec.candidate_layers.push_back(l);
  ro.log = o.log;
  LEDE_ASSIGN_OR_RETURN(RequestRetrainOutcome r,
                        RetrainOnRequests(*impl_->store, m, *cost, state.processed_shards, ro));
  out.reason = r.reason;
  out.n_new_shards = static_cast<int64_t>(r.new_shards.size());
  out.n_bad_shards = r.n_new_bad_shards;
  out.n_other_model_shards = r.n_new_other_model_shards;
  out.n_new_requests = r.n_new_records;
  out.n_requests = r.n_requests;
  out.train_seconds = r.train_seconds;
  if (r.decision != RequestRetrainDecision::kNoNewData) {
    out.metric_name = "heldout_replay_speedup";
    out.candidate_metric = r.candidate_speedup;
    out.serving_metric = r.serving_speedup;
  }
  out.report = {{"trainer", "counterfactual"},
                {"requests", r.n_requests},
                {"train_requests", r.n_train},
                {"heldout_requests", r.n_heldout},
                {"bad_shards", r.n_bad_shards},
                {"other_model_shards", r.n_other_model_shards},
                {"cost_model", r.cost_model},
                {"serving", {{"version", r.serving_version}, {"heldout_replay_speedup", r.serving_speedup}}},
                {"candidate", {{"version", r.candidate_version}, {"heldout_replay_speedup", r.candidate_speedup}}},
                {"reason", r.reason}};
  if (o.log) o.log("msg=\"request retrain\" reason=\"" + r.reason + "\"");
  if (r.decision == RequestRetrainDecision::kNoNewData) {
    // New shards with nothing usable (another model's, or bad with no good
    // record) are recorded as read, so they are skipped and logged once.
    if (!r.new_shards.empty()) {
      state.processed_shards.insert(r.new_shards.begin(), r.new_shards.end());
      LEDE_RETURN_IF_ERROR(WriteRetrainState(state_path(), state));
      LEDE_RETURN_IF_ERROR(PushStateToPolicyStore());
    }
    return out;
  }
  out.decision = r.decision == RequestRetrainDecision::kPublished ? RetrainDecision::kPublished
                                                                  : RetrainDecision::kRejected;
  out.candidate_version = r.candidate_version;
  out.artifact_dir = r.artifact_dir;
  out.report_path = (fs::path(out.artifact_dir) / kRetrainReportFile).string();
  LEDE_RETURN_IF_ERROR(file::WriteFileAtomically(out.report_path, out.report.dump(2) + "\n"));
  LEDE_RETURN_IF_ERROR(PushToPolicyStore(out));
  state.processed_shards.insert(r.new_shards.begin(), r.new_shards.end());
  state.last_version = out.candidate_version;
  state.last_decision = RetrainDecisionName(out.decision);
  state.last_run_utc = UtcNow("%Y-%m-%dT%H:%M:%SZ");
  ++state.runs;
  if (out.decision == RetrainDecision::kPublished) ++state.published;
  LEDE_RETURN_IF_ERROR(WriteRetrainState(state_path(), state));
  LEDE_RETURN_IF_ERROR(PushStateToPolicyStore());
  return out;
}

namespace {

// Whether RunOnce trains on the request log. auto: the request log when
// there is one and no prompt file asks for the td trainer's replay evaluation.
StatusOr<bool> UsesRequestLog(storage::ObjectStore& store, const RetrainOptions& o) {
  if (!(o.trainer == "counterfactual" || (o.trainer == "auto" && !o.model_dir.empty() && o.eval_prompts.empty()))) {
    return false;
  }
  bool use_requests = o.trainer == "counterfactual";
  if (!use_requests) {
    LEDE_ASSIGN_OR_RETURN(std::vector<storage::ObjectInfo> objects,
                          store.List(FolderPrefix(o.requests_prefix)));
    for (const storage::ObjectInfo& obj : objects) {
      const std::string suffix = experience::kRequestLogSuffix;
      use_requests = use_requests || (obj.key.size() > suffix.size() &&
                                      obj.key.compare(obj.key.size() - suffix.size(), suffix.size(), suffix) == 0);
    }
  }
  return use_requests;
}

}  // namespace

StatusOr<RetrainOutcome> Retrainer::RunOnce() {
  // One retraining per policy root at a time: the lock is held from the
  // policy store's mirror to the state checkpoint, so no two runs take one
  // version or lose each other's state update.
  std::error_code ec;
  if (impl_->policy_store == nullptr && !fs::is_directory(options_.policy_root, ec)) {
    return FailedPreconditionError("policy root " + options_.policy_root +
                                   " has no loadable SERVING version: not a directory");
  }
  LEDE_ASSIGN_OR_RETURN(PolicyRootLock lock, PolicyRootLock::TryAcquire(options_.policy_root));
  return RunOnceLocked();
}

StatusOr<RetrainOutcome> Retrainer::RunOnceLocked() {
  const RetrainOptions& o = options_;
  auto log = [&o](const std::string& line) {
    if (o.log) o.log(line);
  };
  RetrainOutcome out;

  LEDE_RETURN_IF_ERROR(PullFromPolicyStore());
  // The serving policy: the warm start, the baseline, and what the data must match.
  StatusOr<policy::dqn::Artifact> serving = policy::dqn::LoadServingArtifact(o.policy_root);
  if (!serving.ok()) {
    return FailedPreconditionError("policy root " + o.policy_root + " has no loadable SERVING version: " +
                                   serving.status().ToString());
  }
  const policy::dqn::PolicyMetadata& smeta = serving->metadata;
  out.serving_version = smeta.version;
  LEDE_ASSIGN_OR_RETURN(RetrainState state, ReadRetrainState(state_path()));

  LEDE_ASSIGN_OR_RETURN(bool use_requests, UsesRequestLog(*impl_->store, o));
  if (use_requests) return RunOnceOnRequests(*serving, std::move(state));

  // 1. New shards.
  RetrainRun run;
  run.prefix = FolderPrefix(o.experience_prefix);
  LEDE_RETURN_IF_ERROR(ListShards(*impl_->store, state, &run));
  out.n_new_shards = static_cast<int64_t>(run.new_keys.size());
  if (run.new_keys.empty()) {
    out.reason = "no new shards under '" + run.prefix + "' (" + std::to_string(run.keys.size()) +
                 " already processed)";
    log(out.reason);
    return out;
  }

  // 2-3. The replay window: read and filter (model, reward cost model).
  ReadWindow(*impl_->store, o, smeta, &run);
  out.n_new_transitions = run.n_new;
  out.n_bad_shards = run.n_new_bad_shards;
  out.n_other_model_shards = run.n_new_other_model_shards;
  if (run.n_new < o.min_new_transitions) {
    out.reason = std::to_string(run.new_keys.size()) + " new shards hold " + std::to_string(run.n_new) +
                 " usable transitions (model " + smeta.model_fingerprint + ", cost model " +
                 smeta.reward_cost_model + "), fewer than " + std::to_string(o.min_new_transitions) +
                 "; waiting for more";
    log(out.reason);
    out.decision = RetrainDecision::kNoNewData;
    return out;
  }
  log("read " + std::to_string(run.used_keys.size()) + " shards (" + std::to_string(run.new_keys.size()) +
      " new): " + std::to_string(run.n_read) + " transitions, " + std::to_string(run.window.size()) + " usable (" +
      std::to_string(run.n_new) + " new; filtered " + std::to_string(run.other_model) + " of other models, " +
      std::to_string(run.other_cost) + " under other cost models)");

  // 4. Split by request (by episode when that leaves a side empty).
  LEDE_RETURN_IF_ERROR(SplitHeldOut(o.heldout_fraction, &run));

  // 5. Warm start and fine-tune.
  run.dqn = o.dqn;
  run.dqn.hidden = serving->network.hidden();
  run.dqn.initial_network = std::make_shared<const policy::dqn::QNetwork>(serving->network);
  const auto train_start = std::chrono::steady_clock::now();
  LEDE_ASSIGN_OR_RETURN(run.trained, TrainDqn(run.train, run.dqn, [&](const DqnEpochReport& r) {
                          run.epochs.push_back({{"epoch", r.epoch}, {"td_loss", r.td_loss},
                                                {"action_agreement", r.train.action_agreement},
                                                {"elapsed_s", r.elapsed_s}});
                        }));
  out.train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();
  log("fine-tuned " + smeta.version + " on " + std::to_string(run.trained->n_train_transitions) + " transitions (" +
      std::to_string(run.dqn.epochs) + " epochs, lr " + std::to_string(run.dqn.lr) + ")");

  // 6a. Offline, on the held-out transitions; 6b. replay through the engine.
  LEDE_ASSIGN_OR_RETURN(run.off_serving, EvaluateOffline(serving->network, run.held, run.dqn));
  LEDE_ASSIGN_OR_RETURN(run.off_candidate, EvaluateOffline(run.trained->network, run.held, run.dqn));
  LEDE_ASSIGN_OR_RETURN(VersionReservation reserved, ReserveCandidateVersion(o));
  const std::string& version = reserved.name();
  policy::dqn::Artifact candidate = MakeCandidate(run, smeta, version);
  run.cand_metric = run.off_candidate.matched_return;
  run.serv_metric = run.off_serving.matched_return;
  if (!o.model_dir.empty() && !o.eval_prompts.empty()) {
    LEDE_RETURN_IF_ERROR(impl_->ReplayCandidate(o, smeta, &candidate, &run));
  }

  // 7. Decide. A metric that cannot be computed (offline: no held-out episode
  // the policy reproduces) is beaten only by a forced rollout (margin -inf),
  // which publishes whatever the numbers.
  const double improvement = run.cand_metric - run.serv_metric;
  const bool forced = std::isinf(o.publish_margin) && o.publish_margin < 0;
  run.publish = forced || (std::isfinite(run.cand_metric) && std::isfinite(run.serv_metric) &&
                           improvement > o.publish_margin);
  char reason[256];
  std::snprintf(reason, sizeof(reason), "%s: candidate %.4f vs serving %.4f (%+.4f), margin %g -> %s",
                run.metric_name.c_str(), run.cand_metric, run.serv_metric, improvement, o.publish_margin,
                run.publish ? "publish" : "keep serving");
  out.reason = reason;
  out.decision = run.publish ? RetrainDecision::kPublished : RetrainDecision::kRejected;
  out.metric_name = run.metric_name;
  out.candidate_metric = run.cand_metric;
  out.serving_metric = run.serv_metric;
  out.candidate_version = version;
  out.artifact_dir = run.publish ? policy::dqn::VersionDir(o.policy_root, version)
                                 : (fs::path(o.policy_root) / kCandidatesDir / version).string();
  out.report_path = (fs::path(out.artifact_dir) / kRetrainReportFile).string();
  out.report = RetrainReport(run, o, out, smeta, impl_->store->url());

  // Save (and publish) the candidate with its report.
  LEDE_RETURN_IF_ERROR(policy::dqn::SaveArtifact(out.artifact_dir, candidate));
  LEDE_RETURN_IF_ERROR(file::WriteFileAtomically(out.report_path, out.report.dump(2) + "\n"));
  if (run.publish) {
    LEDE_RETURN_IF_ERROR(policy::dqn::PublishServingVersion(o.policy_root, version, smeta.model_fingerprint));
  }
  // Uploaded before the state moves on: a failed upload retrains these shards next time.
  LEDE_RETURN_IF_ERROR(PushToPolicyStore(out));
  log(std::string(run.publish ? "published " : "rejected ") + version + ": " + out.reason);

  // 8. The state checkpoint.
  LEDE_RETURN_IF_ERROR(WriteRetrainState(state_path(), NextState(state, run, out)));
  LEDE_RETURN_IF_ERROR(PushStateToPolicyStore());
  return out;
}

}  // namespace lede::trainer
