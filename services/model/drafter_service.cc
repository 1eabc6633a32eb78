// The drafter (lede.v1.Drafter): a round's drafting with the exit
// controller in-process, batched draft steps, and DraftAndVerify over the
// co-located verifier (model_service.h).
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/synchronization/mutex.h"
#include "policy/controllers.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "policy/dqn/method_factory.h"
#include "services/model/batch_scheduler.h"
#include "services/model/model_host.h"
#include "services/model/model_service.h"
#include "services/model/policy_follower.h"
#include "shared/model/batch.h"
#include "shared/model/decoding.h"
#include "shared/model/kv_cache.h"
#include "shared/model/llama.h"
#include "shared/rpc/grpc_status.h"
#include "shared/speculation/generation.h"
#include "shared/speculation/method.h"
#include "shared/speculation/method_proto.h"
#include "shared/speculation/cost_features.h"
#include "shared/status/status_macros.h"
#include "shared/telemetry/lede_metrics.h"
#include "shared/telemetry/metrics.h"

namespace lede::model_service {

using rpc::ToGrpcStatus;
using Clock = std::chrono::steady_clock;

namespace {

// Observes the wall time of every decision of the wrapped controller in
// lede_policy_decision_latency_seconds (in-process DQN, threshold rule, or a
// remote Decide call). Borrows both; one per Draft call.
class TimedExitController final : public speculation::ExitController {
 public:
  TimedExitController(speculation::ExitController& inner, telemetry::Histogram& latency)
      : inner_(inner), latency_(latency) {}
  std::string name() const override { return inner_.name(); }
  speculation::Action Decide(const speculation::ExitState& state) override {
    const auto t0 = Clock::now();
    speculation::Action a = inner_.Decide(state);
    latency_.Observe(std::chrono::duration<double>(Clock::now() - t0).count());
    return a;
  }

 private:
  speculation::ExitController& inner_;
  telemetry::Histogram& latency_;
};

// The fields of a DraftRequest checked before its method is planned: slot,
// pending_token, context and sampling. Returns the sampling parameters.
// Errors: kInvalidArgument naming the field.
StatusOr<speculation::SamplingParams> CheckDraftRequest(const lede::v1::DraftRequest& req,
                                                        const model::KvCache& cache, int64_t vocab_size) {
  if (req.slot() < 0 || req.slot() >= cache.n_slots()) {
    return InvalidArgumentError("slot: outside [0, " + std::to_string(cache.n_slots()) + ")");
  }
  if (req.pending_token() < 0 || req.pending_token() >= vocab_size) {
    return InvalidArgumentError("pending_token: outside [0, V)");
  }
  if (req.context_size() > speculation::kNgramWindow) {
    return InvalidArgumentError("context: " + std::to_string(req.context_size()) + " tokens, more than " +
                                std::to_string(speculation::kNgramWindow));
  }
  speculation::SamplingParams sampling = SamplingFromProto(req.sampling());
  LEDE_RETURN_IF_ERROR(ValidateSampling(sampling));
  return sampling;
}

// A round's draft configuration and the controllers it points to, owned
// here: the method's controller (or, for LEDE with remote decisions, the
// policy service's), the epsilon-greedy explorer around it, and the wrapper
// that times every decision. Moving it keeps config.controller valid.
struct PlannedDraft {
  model::DraftConfig config;
  std::unique_ptr<speculation::ExitController> controller, explorer;
  std::unique_ptr<TimedExitController> timed;
};

// The draft configuration of `spec` on this host's model and `cache`
// (policy/dqn/method_factory.h); LEDE uses the host's current policy, with
// exploration (epsilon > 0) seeded by the round's position. Errors:
// kUnavailable for LEDE before a policy is loaded; PlanMethod's;
// kInvalidArgument naming "speculation.<field>" for a configuration the
// model or cache cannot run.
StatusOr<PlannedDraft> PlanDraft(ModelHost& host, const speculation::MethodSpec& spec, const model::KvCache& cache,
                                 const speculation::SamplingParams& sampling, int64_t position) {
  const checkpoint::ModelConfig& c = host.model->config();
  policy::dqn::MethodContext context;
  context.n_layers = static_cast<int32_t>(c.n_layers);
  context.max_draft_len = static_cast<int32_t>(cache.max_draft_len());
  if (spec.method == speculation::SpeculationMethod::kLede) {
    context.artifact = host.policy();
    if (context.artifact == nullptr) return UnavailableError("method: LEDE needs a policy and none is loaded yet");
  }
  LEDE_ASSIGN_OR_RETURN(policy::dqn::MethodPlan plan, policy::dqn::PlanMethod(spec, context));
  PlannedDraft planned;
  model::DraftConfig& config = planned.config;
  config.mode = plan.mode;
  config.exit_layer = plan.exit_layer;
  config.draft_len = plan.draft_len;
  config.decision_spec = plan.decision_spec;
  config.policy_version = plan.policy_version;
  if (spec.method == speculation::SpeculationMethod::kLede && host.options.remote_decisions && host.policy_stub) {
    planned.controller = std::make_unique<RemoteDecisionController>(host.policy_stub);
  } else {
    planned.controller = plan.MakeController();
  }
  if (spec.method == speculation::SpeculationMethod::kLede && spec.epsilon > 0.0f) {
    config.policy_version += "+eps=" + std::to_string(spec.epsilon).substr(0, 5);  // "+eps=0.200": behaviour policy
    planned.explorer = std::make_unique<policy::EpsilonGreedyController>(
        *planned.controller, spec.epsilon, speculation::RoundSeed(sampling.seed, position, 3));
  }
  config.controller = planned.explorer ? planned.explorer.get() : planned.controller.get();
  if (config.controller != nullptr && host.metrics) {
    planned.timed = std::make_unique<TimedExitController>(*config.controller, host.metrics->policy_decision_latency);
    config.controller = planned.timed.get();
  }
  if (Status s = model::ValidateDraftConfig(config, c, cache); !s.ok()) {
    return InvalidArgumentError("speculation." + std::string(s.message()));
  }
  return planned;
}

// The engine's request for the round of `req`. Errors: kInvalidArgument
// naming load when it is negative, or the cost feature that is not a
// finite cost >= 0.
StatusOr<speculation::DraftRequest> DraftRequestFromProto(const lede::v1::DraftRequest& req) {
  speculation::DraftRequest dr;
  dr.pending_token = req.pending_token();
  dr.position = req.position();
  dr.budget = req.budget();
  dr.trace_nll = req.trace_nll();
  if (req.has_accept_ema()) dr.accept_ema = req.accept_ema();
  if (req.load() < 0) return InvalidArgumentError("load: " + std::to_string(req.load()) + " is negative");
  dr.load = std::max<int32_t>(1, req.load());
  dr.cost = {req.cost().probe(), req.cost().layer(), req.cost().verify()};
  LEDE_RETURN_IF_ERROR(speculation::CheckCostFeatures(dr.cost, "cost."));
  dr.temperature = static_cast<float>(req.sampling().temperature());  // checked by CheckDraftRequest
  dr.context.assign(req.context().begin(), req.context().end());
  dr.round_index = req.round_index();
  dr.record_trace = req.record_trace();
  return dr;
}

// One decision of the round on the wire: the state it saw and its action.
void AddDecisionRecord(const speculation::Decision& dec, lede::v1::DraftResponse* resp) {
  lede::v1::DecisionRecord* r = resp->add_decisions();
  r->set_phase(static_cast<lede::v1::Phase>(dec.state.phase));
  r->set_layer(dec.state.layer);
  r->set_n_layers(dec.state.n_layers);
  r->set_draft_pos(dec.state.draft_pos);
  r->set_max_draft_len(dec.state.max_draft_len);
  r->set_top1_prob(dec.state.top1_prob);
  r->set_top_k_nll(dec.state.top_k_nll);
  r->set_entropy(dec.state.entropy);
  r->set_trace_nll(dec.state.trace_nll);
  r->set_margin(dec.state.margin);
  r->set_draft_conf(dec.state.draft_conf);
  r->set_accept_ema(dec.state.accept_ema);
  r->set_lookup_match(dec.state.lookup_match);
  r->set_trigram_seen(dec.state.trigram_seen);
  r->set_load(dec.state.load);
  if (!(dec.state.cost == speculation::CostFeatures{})) {
    r->mutable_cost()->set_probe(dec.state.cost.probe);
    r->mutable_cost()->set_layer(dec.state.cost.layer);
    r->mutable_cost()->set_verify(dec.state.cost.verify);
  }
  r->set_temperature(dec.state.temperature);
  r->set_action(dec.action == speculation::Action::kExit ? lede::v1::EXIT_ACTION_EXIT : lede::v1::EXIT_ACTION_CONTINUE);
  r->set_draft_index(dec.draft_index);
  r->set_wasted_probe(dec.wasted_probe);
}

// Writes the drafted round into `resp`: exit layer, tokens, their draft
// probabilities, the counts and policy version, and the decisions (when
// traced). Errors: ProbsToBytes'.
Status FillDraftResponse(const model::DraftOutput& out, lede::v1::DraftResponse* resp) {
  const speculation::Draft& d = out.draft;
  resp->set_exit_layer(d.exit_layer);
  for (int32_t t : d.tokens) resp->add_draft_tokens(t);
  LEDE_ASSIGN_OR_RETURN(std::string probs, ProbsToBytes(out.probs));
  resp->set_draft_probs(std::move(probs));
  resp->set_ready_layer(d.ready_layer);
  resp->set_n_probes(d.n_probes);
  resp->set_n_decisions(d.n_decisions);
  resp->set_policy_version(d.policy_version);
  for (const speculation::Decision& dec : d.trace.decisions) AddDecisionRecord(dec, resp);
  return OkStatus();
}

}  // namespace

struct DrafterService::Impl {
  std::shared_ptr<ModelHost> host;
  VerifierService* verifier = nullptr;  // co-located, or null

  // Batched drafting (--max-batch > 1): every draft step and phase-1 probe
  // of a session's round is a job; the sessions drafting at the same moment
  // run their steps in one model::RunDrafterBatch pass per block span, each
  // leaving at its own exit layer, while every round's decisions stay its
  // own (its controller on its handler thread between steps). Batches start
  // at once (no wait): a session's next step depends on its previous one,
  // and a session not drafting now may be at the verifier for a while; the
  // steps that arrive while a batch runs form the next one.
  struct DraftJob {
    model::KvCache* cache = nullptr;
    model::DraftWork work;
    StatusOr<model::DraftStepResult> result = model::DraftStepResult{};
  };
  std::unique_ptr<BatchScheduler> scheduler;
  // Draft calls in progress: the sessions whose next draft step is at most
  // one decision away (the scheduler's open sessions). Counted and handed to
  // the scheduler under one lock, so the last count it hears is the count.
  absl::Mutex drafting_mu;
  int64_t drafting ABSL_GUARDED_BY(drafting_mu) = 0;

  void CountDrafting(int64_t delta) {
    if (!scheduler) return;
    absl::MutexLock lock(&drafting_mu);
    drafting += delta;
    scheduler->set_n_sessions(drafting);
  }

  // Counts one Draft call for the scheduler while it lives.
  class DraftingScope {
   public:
    explicit DraftingScope(Impl& impl) : impl_(impl) { impl_.CountDrafting(1); }
    ~DraftingScope() { impl_.CountDrafting(-1); }

   private:
    Impl& impl_;
  };

  void RunJobs(const std::vector<void*>& jobs) {
    BatchStepThreads step_threads(*host);  // all of --threads when the step runs alone
    std::map<model::KvCache*, std::vector<DraftJob*>> by_pool;
    for (void* j : jobs) by_pool[static_cast<DraftJob*>(j)->cache].push_back(static_cast<DraftJob*>(j));
    for (auto& [cache, group] : by_pool) {
      std::vector<model::DraftWork> work;
      work.reserve(group.size());
      for (DraftJob* j : group) work.push_back(j->work);
      std::vector<StatusOr<model::DraftStepResult>> results;
      try {
        results = model::RunDrafterBatch(*host->model, *cache, work);
      } catch (const std::exception& e) {  // libtorch's are converted; this is bad_alloc and the like
        results.assign(group.size(), InternalError(std::string("draft batch: ") + e.what()));
      }
      for (size_t k = 0; k < group.size(); ++k) group[k]->result = std::move(results[k]);
    }
  }

  // The Drafter's step runner for `cache`: null (every step alone on the
  // handler thread) without a scheduler.
  model::Drafter::StepRunner RunnerFor(model::KvCache& cache) {
    if (!scheduler) return nullptr;
    return [this, &cache](const model::DraftWork& w) -> StatusOr<model::DraftStepResult> {
      DraftJob job;
      job.cache = &cache;
      job.work = w;
      if (!scheduler->Submit(&job, 1)) return UnavailableError("drafter: shutting down");
      return std::move(job.result);
    };
  }
};

DrafterService::DrafterService(std::shared_ptr<ModelHost> host, VerifierService* colocated_verifier)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = std::move(host);
  impl_->verifier = colocated_verifier;
  if (impl_->host->options.max_batch > 1) {
    BatchSchedulerOptions o;
    o.max_batch = impl_->host->options.max_batch;
    o.n_workers = impl_->host->options.batch_workers;
    o.max_wait = impl_->host->options.batch_wait;
    // Draft steps of blocks [0, E) are bound by reading those weights: the
    // drafting sessions stay in one batch up to --batch-split-rows each, as
    // the verifier's (1.8 sessions per draft step at 16 LEDE streams
    // without it, 3.3 with it, and 8% more tokens/s; docs/serving.md).
    o.min_split_rows = impl_->host->options.batch_split_rows;
    if (impl_->host->metrics) o.batch_size = &impl_->host->metrics->draft_batch_size;
    impl_->scheduler = std::make_unique<BatchScheduler>(
        o, [impl = impl_.get()](const std::vector<void*>& jobs) { impl->RunJobs(jobs); });
  }
}

grpc::Status DrafterService::DraftAndVerify(grpc::ServerContext* context, const lede::v1::DraftRequest* req,
                                            lede::v1::DraftAndVerifyResponse* resp) {
  if (grpc::Status auth = impl_->host->options.internal_token.Check(*context); !auth.ok()) return auth;
  if (impl_->verifier == nullptr) {
    return ToGrpcStatus(UnimplementedError("DraftAndVerify: the verifier runs in another process"));
  }
  lede::v1::DraftResponse* d = resp->mutable_draft();
  grpc::Status drafted = Draft(context, req, d);
  if (!drafted.ok()) return drafted;
  lede::v1::VerifyRequest v;
  v.set_slot(req->slot());
  v.set_pool_epoch(req->pool_epoch());
  v.set_session_id(req->session_id());
  v.set_pending_token(req->pending_token());
  v.set_position(req->position());
  v.set_exit_layer(d->exit_layer());
  *v.mutable_draft_tokens() = d->draft_tokens();
  v.set_draft_probs(d->draft_probs());
  v.set_ready_layer(d->ready_layer());
  d->clear_draft_probs();  // the coordinator has no use for them now
  return impl_->verifier->Verify(context, &v, resp->mutable_verify());
}
DrafterService::~DrafterService() = default;

grpc::Status DrafterService::Describe(grpc::ServerContext* context, const lede::v1::DescribeRequest*,
                                      lede::v1::ModelInfo* info) {
  if (grpc::Status auth = impl_->host->options.internal_token.Check(*context); !auth.ok()) return auth;
  impl_->host->FillInfo(info);
  return grpc::Status::OK;
}

grpc::Status DrafterService::Draft(grpc::ServerContext* server_context, const lede::v1::DraftRequest* req,
                                   lede::v1::DraftResponse* resp) {
  if (grpc::Status auth = impl_->host->options.internal_token.Check(*server_context); !auth.ok()) return auth;
  ModelHost& host = *impl_->host;
  auto pool = host.PoolOfEpoch(req->pool_epoch());
  if (!pool.ok()) return ToGrpcStatus(pool.status());
  model::KvCache& cache = **pool;
  StatusOr<speculation::SamplingParams> sampling = CheckDraftRequest(*req, cache, host.model->config().vocab_size);
  if (!sampling.ok()) return ToGrpcStatus(sampling.status());

  if (req->method() == lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE) return grpc::Status::OK;  // nothing to draft
  StatusOr<speculation::MethodSpec> spec = speculation::MethodSpecFromProto(req->method(), req->speculation());
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  StatusOr<PlannedDraft> planned = PlanDraft(host, *spec, cache, *sampling, req->position());
  if (!planned.ok()) return ToGrpcStatus(planned.status());
  StatusOr<speculation::DraftRequest> dr = DraftRequestFromProto(*req);
  if (!dr.ok()) return ToGrpcStatus(dr.status());
  // The slot stays this session's while the draft runs (kv_cache.h).
  if (!cache.BeginDrafting(req->slot(), req->session_id())) return ToGrpcStatus(NotThisSession(req->slot()));
  struct DraftingGuard {
    model::KvCache& cache;
    int64_t slot;
    ~DraftingGuard() { cache.EndDrafting(slot); }
  } drafting_guard{cache, req->slot()};
  Impl::DraftingScope drafting(*impl_);
  SetComputeThreads(host.options.threads);  // steps without a scheduler run on this thread
  model::Drafter drafter(*host.model, cache, impl_->RunnerFor(cache));
  const auto draft_start = std::chrono::steady_clock::now();
  StatusOr<model::DraftOutput> out =
      model::DraftRound(*host.model, cache, drafter, req->slot(), planned->config, *sampling, *dr);
  if (!out.ok()) return ToGrpcStatus(out.status());
  // The served cost of a draft at this exit layer (served_costs.h).
  host.RecordDraftStep(out->draft.exit_layer, static_cast<int32_t>(out->draft.tokens.size()),
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - draft_start).count());
  host.MaybeAttachCosts(resp);
  if (Status s = FillDraftResponse(*out, resp); !s.ok()) return ToGrpcStatus(s);
  return grpc::Status::OK;
}

}  // namespace lede::model_service
