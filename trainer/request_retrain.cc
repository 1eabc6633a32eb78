#include "trainer/request_retrain.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <memory>
#include <utility>

#include "policy/dqn/artifact.h"
#include "policy/dqn/method_factory.h"
#include "shared/experience/request_log.h"
#include "shared/experience/served_costs.h"
#include "shared/model/cost/cost_profiles.h"
#include "shared/status/status_macros.h"
#include "trainer/dqn.h"
#include "trainer/heldout_split.h"

namespace lede::trainer {
namespace {

void Log(const RequestRetrainOptions& o, const std::string& line) {
  if (o.log) o.log(line);
}

// The serving policy's greedy controllers, one per replayed request.
struct ServingPlan {
  speculation::DecisionSpec spec;
  ControllerMaker make;
};

StatusOr<ServingPlan> PlanOf(std::shared_ptr<const policy::dqn::Artifact> artifact, int32_t n_layers) {
  LEDE_ASSIGN_OR_RETURN(policy::dqn::MethodPlan plan, policy::dqn::PlanTrainedPolicy(std::move(artifact), n_layers));
  ServingPlan p;
  p.spec = plan.decision_spec;
  auto shared = std::make_shared<policy::dqn::MethodPlan>(std::move(plan));
  p.make = [shared](int64_t) { return shared->MakeController(); };
  return p;
}

// The sampling settings a logged request was served with (greedy for
// records without them).
speculation::SamplingParams RecordSampling(const lede::v1::RequestRecord& record) {
  speculation::SamplingParams s;
  if (experience::IsGreedyRecord(record)) return s;
  s.temperature = record.temperature();
  s.top_p = record.top_p() == 0.0f ? 1.0 : record.top_p();
  s.seed = record.seed();
  return s;
}

// The candidate's held-out acceptance, greedy and sampled apart, into `out`
// and the candidate's offline metrics.
Status ReportHeldoutAcceptance(const std::vector<ShadowTrace>& heldout, const ServingPlan& candidate,
                               const RequestRetrainOptions& options, policy::dqn::Artifact* artifact,
                               RequestRetrainOutcome* out) {
  LEDE_ASSIGN_OR_RETURN(out->heldout_acceptance, ReplayAcceptanceOf(heldout, candidate.spec, candidate.make));
  const ReplayAcceptanceByKind& a = out->heldout_acceptance;
  auto& m = artifact->metadata.offline_metrics;
  m["heldout_greedy_requests"] = static_cast<double>(a.greedy.n_requests);
  m["heldout_greedy_acceptance"] = a.greedy.rate();
  m["heldout_sampled_requests"] = static_cast<double>(a.sampled.n_requests);
  m["heldout_sampled_acceptance"] = a.sampled.rate();
  Log(options, "msg=\"held-out acceptance\" greedy_requests=" + std::to_string(a.greedy.n_requests) +
                   " greedy_acceptance=" + std::to_string(a.greedy.rate()) +
                   " sampled_requests=" + std::to_string(a.sampled.n_requests) +
                   " sampled_expected_acceptance=" + std::to_string(a.sampled.rate()));
  return OkStatus();
}

}  // namespace

StatusOr<ShadowTrace> TraceLoggedRequest(const model::LlamaModel& model, const lede::v1::RequestRecord& record,
                                         int32_t top_k) {
  const std::vector<int32_t> prompt(record.prompt_token_ids().begin(), record.prompt_token_ids().end());
  const std::vector<int32_t> output(record.output_token_ids().begin(), record.output_token_ids().end());
  // A request that did not end on EOS ended at its budget or a stop string:
  // the replay's budget is what it emitted, so it never runs past the log.
  const int64_t n_out = static_cast<int64_t>(output.size());
  const int64_t max_new = record.ended_on_eos() ? std::max<int64_t>(record.max_new_tokens(), n_out + 1) : n_out;
  LEDE_ASSIGN_OR_RETURN(ShadowTrace t, ComputeShadowTrace(model, prompt, output, record.ended_on_eos(), max_new,
                                                          top_k, record.request_id(), RecordSampling(record)));
  t.load = std::max(1, record.load());
  return t;
}

namespace {

// The usable logged requests' shadow traces, split by request.
struct RequestSplit {
  std::vector<ShadowTrace> train, selection, heldout;
  int64_t n_requests = 0;  // usable requests traced (greedy and sampled)
};

// Traces every usable record and splits them: held out by request id, the
// rest 3:1 into train and selection, with at least one held-out and one
// selection request where there are enough.
StatusOr<RequestSplit> TraceAndSplitRequests(const model::LlamaModel& model,
                                             const std::vector<lede::v1::RequestRecord>& records,
                                             const RequestRetrainOptions& options) {
  RequestSplit split;
  const int32_t top_k = options.dinkelbach.spec.top_k;
  int64_t n_train_seen = 0;
  for (const lede::v1::RequestRecord& r : records) {
    StatusOr<ShadowTrace> t = TraceLoggedRequest(model, r, top_k);
    if (!t.ok() && t.status().code() == StatusCode::kInvalidArgument) continue;  // empty output, too long
    if (!t.ok()) return t.status();
    ++split.n_requests;
    if (IsHeldOut(r.request_id(), options.heldout_fraction)) {
      split.heldout.push_back(*std::move(t));
    } else {
      (n_train_seen++ % 4 == 3 ? split.selection : split.train).push_back(*std::move(t));
    }
  }
  if (split.heldout.empty() && !split.train.empty()) {  // at least one held-out request
    split.heldout.push_back(std::move(split.train.back()));
    split.train.pop_back();
  }
  if (split.selection.empty() && split.train.size() > 1) {
    split.selection.push_back(std::move(split.train.back()));
    split.train.pop_back();
  }
  return split;
}

}  // namespace

StatusOr<model::cost::ServedStepCosts> ServedCostsOfLog(const std::vector<lede::v1::RequestRecord>& records,
                                                  int64_t n_layers) {
  // The newest record whose profile can price: its format and threads.
  const lede::v1::CostProfile* newest = nullptr;
  for (auto it = records.rbegin(); it != records.rend() && newest == nullptr; ++it) {
    if (it->has_measured_costs() && experience::CanPrice(it->measured_costs())) newest = &it->measured_costs();
  }
  if (newest == nullptr) return NotFoundError("measured_costs: no logged request carries a usable cost profile");
  if (newest->draft_step_s_size() != n_layers + 1) {
    return InvalidArgumentError("measured_costs.draft_step_s: " + std::to_string(newest->draft_step_s_size()) +
                                " entries for a model of " + std::to_string(n_layers) + " layers (want L + 1)");
  }
  model::cost::ServedStepCosts c;
  c.weight_format = newest->weight_format();
  c.threads = newest->threads();
  c.draft_step_s.assign(static_cast<size_t>(n_layers + 1), 0.0);
  c.verify_s.assign(static_cast<size_t>(newest->verify_s_size()), 0.0);
  bool have_line = false;
  for (auto it = records.rbegin(); it != records.rend(); ++it) {
    if (!it->has_measured_costs()) continue;
    const lede::v1::CostProfile& p = it->measured_costs();
    if (p.weight_format() != c.weight_format || p.threads() != c.threads) continue;
    for (int i = 0; i < p.draft_step_s_size() && i < p.draft_step_samples_size() && i <= n_layers; ++i) {
      if (c.draft_step_s[i] == 0 && p.draft_step_samples(i) > 0) c.draft_step_s[i] = p.draft_step_s(i);
    }
    for (int k = 0; k < p.verify_s_size() && k < p.verify_samples_size() && k < static_cast<int>(c.verify_s.size());
         ++k) {
      if (c.verify_s[k] == 0 && p.verify_samples(k) > 0) c.verify_s[k] = p.verify_s(k);
    }
    if (!have_line && p.verify_intercept_s() > 0 && p.head_layers() > 0) {  // a line across exit layers
      c.verify_intercept_s = p.verify_intercept_s();
      c.verify_slope_s = p.verify_slope_s();
      have_line = true;
    }
  }
  return c;
}

StatusOr<std::unique_ptr<model::cost::CostModel>> ServedCostModelOfLog(const std::vector<lede::v1::RequestRecord>& records,
                                                                 const model::LlamaModel& model) {
  LEDE_ASSIGN_OR_RETURN(model::cost::ServedStepCosts costs, ServedCostsOfLog(records, model.n_layers()));
  return model::cost::MakeServedCostModel(model.config(), costs);
}

StatusOr<std::unique_ptr<model::cost::CostModel>> ReadServedCostModel(storage::ObjectStore& store,
                                                                const std::string& prefix,
                                                                const model::LlamaModel& model) {
  LEDE_ASSIGN_OR_RETURN(experience::RequestLogRead read, experience::ReadRequestLog(store, prefix));
  const std::string fingerprint = model.config().ArchitectureFingerprint();
  std::vector<lede::v1::RequestRecord> own;
  for (lede::v1::RequestRecord& r : read.records) {
    if (r.model_fingerprint() == fingerprint) own.push_back(std::move(r));
  }
  return ServedCostModelOfLog(own, model);
}

namespace {

// 1. The request log under the prefix; which shards are new (recorded in
// `out`, bad new ones logged). 2. Of the served model only: a shard holding
// a record of another model is skipped whole (one writer serves one model,
// so it is not this deployment's log), counted and logged once; the run goes
// on with the others. Returns the usable records, in log order.
StatusOr<std::vector<lede::v1::RequestRecord>> ReadRequestLog(storage::ObjectStore& store,
                                                              const std::set<std::string>& processed,
                                                              const std::string& fingerprint,
                                                              const RequestRetrainOptions& options,
                                                              RequestRetrainOutcome* out) {
  LEDE_ASSIGN_OR_RETURN(experience::RequestLogRead read, experience::ReadRequestLog(store, options.requests_prefix));
  out->n_bad_shards = read.bad_shards();
  std::vector<lede::v1::RequestRecord> usable;
  size_t first_record = 0;  // the shard's records in read.records (appended in shard order)
  for (const experience::ShardReport& s : read.shards) {
    const bool is_new = processed.count(s.path) == 0;
    const auto begin = read.records.begin() + static_cast<std::ptrdiff_t>(first_record);
    const auto end = begin + static_cast<std::ptrdiff_t>(s.records);
    first_record += static_cast<size_t>(s.records);
    if (is_new) out->new_shards.push_back(s.path);
    const auto other = std::find_if(begin, end, [&](const lede::v1::RequestRecord& r) {
      return r.model_fingerprint() != fingerprint;
    });
    if (!s.error.empty() && is_new && other == end) {  // a bad shard of another model counts once, as that
      ++out->n_new_bad_shards;
      Log(options, "msg=\"bad request-log shard skipped\" shard=" + s.path + " good_records=" +
                       std::to_string(s.records) + " error=\"" + s.error + "\"");
    }
    if (other != end) {
      ++out->n_other_model_shards;
      if (is_new) {
        ++out->n_new_other_model_shards;
        Log(options, "msg=\"request-log shard of another model skipped\" shard=" + s.path + " request=" +
                         other->request_id() + " model_fingerprint=\"" + other->model_fingerprint() +
                         "\" serving_model_fingerprint=\"" + fingerprint + "\"");
      }
      continue;
    }
    if (is_new) out->n_new_records += s.records;
    usable.insert(usable.end(), std::make_move_iterator(begin), std::make_move_iterator(end));
  }
  return usable;
}

// The prices: the deployment's own measured costs when logged in `records`
// (and options.price_with_logged_costs), else `fallback`, whose name or
// "served" is recorded in out->cost_model. *served holds the model made.
const model::cost::CostModel& PricingOf(const std::vector<lede::v1::RequestRecord>& records, const model::LlamaModel& model,
                                  const model::cost::CostModel& fallback, const RequestRetrainOptions& options,
                                  std::unique_ptr<model::cost::CostModel>* served, RequestRetrainOutcome* out) {
  if (options.price_with_logged_costs) {
    StatusOr<std::unique_ptr<model::cost::CostModel>> made = ServedCostModelOfLog(records, model);
    if (made.ok()) {
      *served = *std::move(made);
    } else if (made.status().code() != StatusCode::kNotFound) {
      Log(options, "msg=\"logged costs unusable\" error=\"" + std::string(made.status().message()) + "\"");
    }
  }
  const model::cost::CostModel& pricing = *served ? **served : fallback;
  out->cost_model = pricing.name();
  Log(options, "msg=\"pricing\" cost_model=" + out->cost_model);
  return pricing;
}

// 4. The candidate's artifact, trained by Dinkelbach iteration on the
// training requests (its selection metrics in offline_metrics).
StatusOr<policy::dqn::Artifact> TrainCandidate(const RequestSplit& split, const model::cost::CostModel& cost,
                                               const std::string& fingerprint, const RequestRetrainOptions& options,
                                               int64_t n_train) {
  DinkelbachOptions d = options.dinkelbach;
  d.model_fingerprint = fingerprint;
  LEDE_ASSIGN_OR_RETURN(DinkelbachResult result, TrainDinkelbach(split.train, split.selection, cost, d));
  policy::dqn::PolicyMetadata meta;
  meta.version = options.version;
  meta.model_fingerprint = fingerprint;
  meta.decision = d.spec;
  meta.reward_cost_model = cost.name();
  meta.training_data.n_requests = n_train;
  meta.training_options["request_log"] = 1;
  const DinkelbachIteration& sel = result.iterations[result.selected_iteration - 1];
  meta.training_options["rho"] = sel.rho;
  policy::dqn::Artifact artifact = MakeArtifact(result.dqn, d.dqn, meta);
  artifact.metadata.offline_metrics["selection_speedup"] = sel.selection_speedup;
  artifact.metadata.offline_metrics["train_speedup"] = sel.train_speedup;
  return artifact;
}

// 5. Publishes the candidate iff its held-out replay speed-up beats the
// serving one's by the margin (saved under policy_root, SERVING moved);
// otherwise saves it under candidates/ and keeps SERVING.
Status PublishIfBetter(const policy::dqn::Artifact& candidate, const std::string& fingerprint,
                       const RequestRetrainOptions& options, RequestRetrainOutcome* out) {
  const bool better = std::isfinite(out->candidate_speedup) && std::isfinite(out->serving_speedup) &&
                      out->candidate_speedup - out->serving_speedup > options.publish_margin;
  char numbers[160];
  std::snprintf(numbers, sizeof(numbers), "held-out replay: candidate %.4fx, serving %s %.4fx, margin %g",
                out->candidate_speedup, out->serving_version.c_str(), out->serving_speedup, options.publish_margin);
  if (better) {
    out->artifact_dir = policy::dqn::VersionDir(options.policy_root, options.version);
    LEDE_RETURN_IF_ERROR(policy::dqn::SaveArtifact(out->artifact_dir, candidate));
    LEDE_RETURN_IF_ERROR(policy::dqn::PublishServingVersion(options.policy_root, options.version, fingerprint));
    out->decision = RequestRetrainDecision::kPublished;
    out->reason = std::string("published: ") + numbers;
  } else {
    out->artifact_dir = (std::filesystem::path(options.policy_root) / "candidates" / options.version).string();
    LEDE_RETURN_IF_ERROR(policy::dqn::SaveArtifact(out->artifact_dir, candidate, /*overwrite=*/true));
    out->decision = RequestRetrainDecision::kRejected;
    out->reason = std::string("rejected (not better by the margin): ") + numbers;
  }
  Log(options, "msg=\"request retrain decision\" decision=" + std::string(better ? "published" : "rejected") +
                   " version=" + options.version + " candidate_speedup=" + std::to_string(out->candidate_speedup) +
                   " serving_speedup=" + std::to_string(out->serving_speedup) +
                   " requests=" + std::to_string(out->n_requests) + " bad_shards=" + std::to_string(out->n_bad_shards));
  return OkStatus();
}

}  // namespace

StatusOr<RequestRetrainOutcome> RetrainOnRequests(storage::ObjectStore& store, const model::LlamaModel& model,
                                                  const model::cost::CostModel& cost,
                                                  const std::set<std::string>& processed,
                                                  const RequestRetrainOptions& options) {
  if (!(options.heldout_fraction > 0 && options.heldout_fraction < 1)) {
    return InvalidArgumentError("heldout_fraction: must be in (0, 1)");
  }
  if (options.policy_root.empty()) return InvalidArgumentError("policy_root: required");
  LEDE_RETURN_IF_ERROR(policy::dqn::ValidateVersionName(options.version));
  const std::string fingerprint = model.config().ArchitectureFingerprint();
  const int32_t n_layers = static_cast<int32_t>(model.n_layers());

  // 1. The request log; which shards are new. 2. Of the served model only.
  RequestRetrainOutcome out;
  out.cost_model = cost.name();  // until the log's costs price the run
  LEDE_ASSIGN_OR_RETURN(std::vector<lede::v1::RequestRecord> usable,
                        ReadRequestLog(store, processed, fingerprint, options, &out));
  if (out.n_new_records == 0) {
    out.reason = out.n_new_other_model_shards > 0 ? "no new logged requests of this model (" +
                                                        std::to_string(out.n_new_other_model_shards) +
                                                        " new shards of another model skipped)"
                                                  : "no new logged requests";
    return out;
  }
  if (options.max_requests < 1) return InvalidArgumentError("max_requests: must be >= 1");
  if (static_cast<int64_t>(usable.size()) > options.max_requests) {
    usable.erase(usable.begin(), usable.end() - options.max_requests);
  }
  std::unique_ptr<model::cost::CostModel> served;
  const model::cost::CostModel& pricing = PricingOf(usable, model, cost, options, &served, &out);

  // 3. Split by request; shadow traces.
  const auto train_start = std::chrono::steady_clock::now();
  LEDE_ASSIGN_OR_RETURN(RequestSplit split, TraceAndSplitRequests(model, usable, options));
  // The policy sees the deployment's cost profile (ExitState::cost): the
  // features of the model pricing the replays, as a cost-conditioned policy
  // is trained (dinkelbach.h cost_profiles) and as the coordinator sends
  // them when served.
  const speculation::CostFeatures features =
      model::cost::CostFeaturesOf(pricing, model.n_layers(), options.dinkelbach.spec.max_draft_len);
  for (auto* part : {&split.train, &split.selection, &split.heldout}) {
    for (ShadowTrace& t : *part) t.cost = features;
  }
  out.cost_features = features;
  out.n_requests = split.n_requests;
  out.n_train = static_cast<int64_t>(split.train.size() + split.selection.size());
  out.n_heldout = static_cast<int64_t>(split.heldout.size());
  if (split.train.empty() || split.selection.empty() || split.heldout.empty()) {
    out.decision = RequestRetrainDecision::kNoNewData;
    out.new_shards.clear();  // they stay new and accumulate with the next ones
    out.reason = "too few usable requests to train and evaluate (" + std::to_string(out.n_requests) + ")";
    return out;
  }

  // 4. The candidate.
  LEDE_ASSIGN_OR_RETURN(policy::dqn::Artifact serving_artifact,
                        policy::dqn::LoadServingArtifact(options.policy_root, fingerprint));
  out.serving_version = serving_artifact.metadata.version;
  auto serving = std::make_shared<const policy::dqn::Artifact>(std::move(serving_artifact));
  Log(options, "msg=\"training on logged requests\" train=" + std::to_string(split.train.size()) +
                   " selection=" + std::to_string(split.selection.size()) +
                   " heldout=" + std::to_string(split.heldout.size()) + " serving=" + out.serving_version);
  LEDE_ASSIGN_OR_RETURN(policy::dqn::Artifact candidate_artifact,
                        TrainCandidate(split, pricing, fingerprint, options, out.n_train));
  out.train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();
  auto candidate = std::make_shared<const policy::dqn::Artifact>(candidate_artifact);

  // 5. Both replayed on the held-out requests; publish iff better.
  LEDE_ASSIGN_OR_RETURN(ServingPlan sp, PlanOf(serving, n_layers));
  LEDE_ASSIGN_OR_RETURN(ServingPlan cp, PlanOf(candidate, n_layers));
  LEDE_ASSIGN_OR_RETURN(out.serving_speedup, SimulatedSpeedup(split.heldout, sp.spec, sp.make, pricing));
  LEDE_ASSIGN_OR_RETURN(out.candidate_speedup, SimulatedSpeedup(split.heldout, cp.spec, cp.make, pricing));
  candidate_artifact.metadata.offline_metrics["heldout_replay_speedup"] = out.candidate_speedup;
  candidate_artifact.metadata.offline_metrics["heldout_replay_speedup_serving"] = out.serving_speedup;
  LEDE_RETURN_IF_ERROR(ReportHeldoutAcceptance(split.heldout, cp, options, &candidate_artifact, &out));
  out.candidate_version = options.version;
  LEDE_RETURN_IF_ERROR(PublishIfBetter(candidate_artifact, fingerprint, options, &out));
  return out;
}

}  // namespace lede::trainer
