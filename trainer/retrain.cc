#include "trainer/retrain.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <utility>

#include "policy/dqn/artifact.h"
#include "policy/dqn/artifact_store.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "policy/dqn/q_network.h"
#include "shared/experience/experience.h"
#include "shared/experience/request_log.h"
#include "shared/file/file.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/llama.h"
#include "shared/status/status_macros.h"
#include "shared/storage/object_store.h"
#include "trainer/internal/retrain_run.h"
#include "trainer/policy_root_lock.h"
#include "trainer/request_retrain.h"

namespace lede::trainer {
namespace {

namespace fs = std::filesystem;
using internal::FolderPrefix;
using internal::ReserveCandidateVersion;
using internal::RetrainRun;
using internal::UtcNow;

}  // namespace

struct Retrainer::Impl {
  std::unique_ptr<storage::ObjectStore> store;
  std::unique_ptr<storage::ObjectStore> policy_store;  // null: policy_root alone
  // The request trainer's model (lazily loaded on the first run that needs it).
  std::shared_ptr<const model::LlamaModel> model;
  // The td trainer's replay evaluation (step 6b).
  internal::ReplayEvaluator replay;
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
  LEDE_RETURN_IF_ERROR(PullFromPolicyStore());
  // The serving policy: the warm start, the baseline, and what the data must match.
  StatusOr<policy::dqn::Artifact> serving = policy::dqn::LoadServingArtifact(o.policy_root);
  if (!serving.ok()) {
    return FailedPreconditionError("policy root " + o.policy_root + " has no loadable SERVING version: " +
                                   serving.status().ToString());
  }
  LEDE_ASSIGN_OR_RETURN(RetrainState state, ReadRetrainState(state_path()));
  LEDE_ASSIGN_OR_RETURN(bool use_requests, UsesRequestLog(*impl_->store, o));
  if (use_requests) return RunOnceOnRequests(*serving, std::move(state));
  return RunOnceOnTransitions(*serving, state);
}

// Steps 1-6 of the td trainer (the file comment of retrain.h).
StatusOr<RetrainOutcome> Retrainer::RunOnceOnTransitions(const policy::dqn::Artifact& serving,
                                                         const RetrainState& state) {
  const RetrainOptions& o = options_;
  auto log = [&o](const std::string& line) {
    if (o.log) o.log(line);
  };
  const policy::dqn::PolicyMetadata& smeta = serving.metadata;
  RetrainOutcome out;
  out.serving_version = smeta.version;

  // 1. New shards.
  RetrainRun run;
  run.prefix = FolderPrefix(o.experience_prefix);
  LEDE_RETURN_IF_ERROR(internal::ListShards(*impl_->store, state, &run));
  out.n_new_shards = static_cast<int64_t>(run.new_keys.size());
  if (run.new_keys.empty()) {
    out.reason = "no new shards under '" + run.prefix + "' (" + std::to_string(run.keys.size()) +
                 " already processed)";
    log(out.reason);
    return out;
  }

  // 2-3. The replay window: read and filter (model, reward cost model). A
  // policy priced by the deployment's served costs takes the transitions of
  // the other cost models too, re-priced with the costs the request log
  // carries (trainer/retrain_pricing.h).
  const bool served = smeta.reward_cost_model == internal::kServedCostModel;
  if (served) LEDE_RETURN_IF_ERROR(impl_->replay.LoadServedCosts(o, *impl_->store, smeta, &run));
  internal::ReadWindow(*impl_->store, o, smeta, &run);
  if (served) LEDE_RETURN_IF_ERROR(impl_->replay.RepriceWindow(smeta, &run));
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
  LEDE_RETURN_IF_ERROR(internal::SplitHeldOut(o.heldout_fraction, &run));

  // 5. Warm start and fine-tune.
  run.dqn = o.dqn;
  run.dqn.hidden = serving.network.hidden();
  run.dqn.initial_network = std::make_shared<const policy::dqn::QNetwork>(serving.network);
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
  LEDE_ASSIGN_OR_RETURN(run.off_serving, EvaluateOffline(serving.network, run.held, run.dqn));
  LEDE_ASSIGN_OR_RETURN(run.off_candidate, EvaluateOffline(run.trained->network, run.held, run.dqn));
  LEDE_ASSIGN_OR_RETURN(VersionReservation reserved, ReserveCandidateVersion(o));
  policy::dqn::Artifact candidate = internal::MakeCandidate(run, smeta, reserved.name());
  run.cand_metric = run.off_candidate.matched_return;
  run.serv_metric = run.off_serving.matched_return;
  if (!o.model_dir.empty() && !o.eval_prompts.empty()) {
    LEDE_RETURN_IF_ERROR(impl_->replay.ReplayCandidate(o, smeta, &candidate, &run));
  }
  return DecideAndPublish(smeta, candidate, state, &run, std::move(out));
}

// Steps 7-8: the decision, the candidate saved (and published) with its
// report, the state checkpoint.
StatusOr<RetrainOutcome> Retrainer::DecideAndPublish(const policy::dqn::PolicyMetadata& smeta,
                                                     const policy::dqn::Artifact& candidate,
                                                     const RetrainState& state, RetrainRun* run_ptr,
                                                     RetrainOutcome out) {
  const RetrainOptions& o = options_;
  RetrainRun& run = *run_ptr;
  const std::string& version = candidate.metadata.version;
  // A metric that cannot be computed (offline: no held-out episode the
  // policy reproduces) is beaten only by a forced rollout (margin -inf),
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
  out.report = internal::RetrainReport(run, o, out, smeta, impl_->store->url());

  // Save (and publish) the candidate with its report.
  LEDE_RETURN_IF_ERROR(policy::dqn::SaveArtifact(out.artifact_dir, candidate));
  LEDE_RETURN_IF_ERROR(file::WriteFileAtomically(out.report_path, out.report.dump(2) + "\n"));
  if (run.publish) {
    LEDE_RETURN_IF_ERROR(policy::dqn::PublishServingVersion(o.policy_root, version, smeta.model_fingerprint));
  }
  // Uploaded before the state moves on: a failed upload retrains these shards next time.
  LEDE_RETURN_IF_ERROR(PushToPolicyStore(out));
  if (o.log) o.log(std::string(run.publish ? "published " : "rejected ") + version + ": " + out.reason);

  // 8. The state checkpoint.
  LEDE_RETURN_IF_ERROR(WriteRetrainState(state_path(), internal::NextState(state, run, out)));
  LEDE_RETURN_IF_ERROR(PushStateToPolicyStore());
  return out;
}

}  // namespace lede::trainer
