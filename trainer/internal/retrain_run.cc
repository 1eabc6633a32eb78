#include "trainer/internal/retrain_run.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <set>
#include <utility>

#include "shared/experience/experience.h"
#include "shared/status/status_macros.h"
#include "trainer/heldout_split.h"

namespace lede::trainer::internal {
namespace {

namespace fs = std::filesystem;
using experience::Transition;
using nlohmann::json;

constexpr char kReportFormat[] = "lede-retrain-report-v1";
constexpr char kExploreMarker[] = "+eps=";

bool IsExploration(const std::string& version) { return version.find(kExploreMarker) != std::string::npos; }

json OfflineJson(const OfflinePolicyMetrics& m) {
  json j = json::object();
  for (const auto& [name, value] : OfflineMetricFields(m)) j[name] = value;
  return j;
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

}  // namespace

std::string UtcNow(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[48];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

// The folder form of a key prefix ("" stays "", "a" becomes "a/").
std::string FolderPrefix(const std::string& prefix) {
  if (prefix.empty() || prefix.back() == '/') return prefix;
  return prefix + "/";
}

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
      } else if (t.reward_cost_model != smeta.reward_cost_model && run->repriceable.count(t.reward_cost_model) == 0) {
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
      {"repriced_transitions", run.repriced},
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

}  // namespace lede::trainer::internal
