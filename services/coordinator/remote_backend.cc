#include "services/coordinator/remote_backend.h"

#include <chrono>
#include <utility>

#include "shared/experience/served_costs.h"
#include "shared/speculation/cost_features.h"
#include "shared/rpc/grpc_status.h"
#include "shared/rpc/server.h"

namespace lede::coordinator {
namespace {

// What the speculation loop needs to know of the served model.
speculation::ModelLimits LimitsOf(const lede::v1::ModelInfo& info) {
  speculation::ModelLimits limits;
  limits.n_layers = info.n_layers();
  limits.vocab_size = info.vocab_size();
  limits.capacity = info.capacity();
  limits.context_window = info.context_window();
  limits.eos_ids.assign(info.eos_ids().begin(), info.eos_ids().end());
  return limits;
}

}  // namespace

std::unique_ptr<grpc::ClientContext> ModelCallContext(grpc::CallbackServerContext* server, absl::Duration rpc_timeout) {
  std::unique_ptr<grpc::ClientContext> ctx =
      server ? grpc::ClientContext::FromCallbackServerContext(*server) : std::make_unique<grpc::ClientContext>();
  auto cap = absl::ToChronoTime(absl::Now() + rpc_timeout);
  if (!server || server->deadline() > cap) ctx->set_deadline(cap);
  return ctx;
}

Status FromModelCall(const grpc::Status& s, const std::string& what) {
  Status status = rpc::FromGrpcStatus(s, what);
  if (status.code() == StatusCode::kFailedPrecondition) {
    return UnavailableError(std::string(status.message()) + " (the model service restarted; retry)");
  }
  return status;
}

RemoteBackend::RemoteBackend(const ModelClients& clients, grpc::CallbackServerContext* server, const lede::v1::ModelInfo& info,
              const lede::v1::GenerateRequest& request, const std::string& request_id, bool record_trace)
    : clients_(clients),
      server_(server),
      request_(request),
      request_id_(request_id),
      record_trace_(record_trace),
      limits_(LimitsOf(info)) {}

StatusOr<speculation::Prefilled> RemoteBackend::Open(const std::vector<int32_t>& prompt,
                                      const speculation::SessionOptions& options) {
  sampling_.set_temperature(static_cast<float>(options.sampling.temperature));
  sampling_.set_top_p(static_cast<float>(options.sampling.top_p));
  sampling_.set_seed(options.sampling.seed);
  lede::v1::OpenSessionRequest req;
  for (int32_t id : prompt) req.add_prompt_token_ids(id);
  *req.mutable_sampling() = sampling_;
  req.set_record_nll(options.record_nll);
  req.set_request_id(request_id_);
  req.set_owner_instance(clients_.owner_instance);
  req.set_max_queue_wait_ms(absl::ToInt64Milliseconds(clients_.max_queue_wait));
  req.set_max_new_tokens(options.max_new_tokens);
  lede::v1::OpenSessionResponse resp;
  // The client's deadline and cancellation, so that a request waiting in the
  // verifier's queue for a KV slot leaves it when its client does; capped at
  // the queue wait (which the verifier bounds itself) plus the prefill's
  // timeout. A verifier that allocated the
  // slot before the answer was lost frees it itself when it sees the call
  // cancelled, and CloseOrphan() closes it by request id otherwise.
  std::unique_ptr<grpc::ClientContext> ctx = ModelCallContext(server_, clients_.max_queue_wait + clients_.prefill_timeout);
  grpc::Status s = clients_.verifier->OpenSession(ctx.get(), req, &resp);
  if (s.error_code() == grpc::StatusCode::CANCELLED || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    CloseOrphan();
  }
  if (!s.ok()) return FromModelCall(s, "verifier OpenSession");
  slot_ = resp.slot();
  epoch_ = resp.pool_epoch();
  session_id_ = resp.session_id();
  open_ = true;
  speculation::Prefilled p;
  p.session = slot_;
  p.token = resp.first_token();
  p.nll = resp.first_nll();
  return p;
}

StatusOr<speculation::Draft> RemoteBackend::DraftRound(int64_t, const speculation::DraftRequest& r) {
  speculation::Draft d;
  if (fallback_) return d;  // the drafter is down: a full-depth step
  lede::v1::DraftRequest req;
  req.set_slot(slot_);
  req.set_pool_epoch(epoch_);
  req.set_session_id(session_id_);
  req.set_pending_token(r.pending_token);
  req.set_position(r.position);
  req.set_budget(r.budget);
  req.set_trace_nll(r.trace_nll);
  req.set_accept_ema(r.accept_ema);
  req.set_load(r.load);
  if (!(r.cost == speculation::CostFeatures{})) {
    req.mutable_cost()->set_probe(r.cost.probe);
    req.mutable_cost()->set_layer(r.cost.layer);
    req.mutable_cost()->set_verify(r.cost.verify);
  }
  req.mutable_context()->Add(r.context.begin(), r.context.end());
  req.set_round_index(r.round_index);
  req.set_record_trace(record_trace_ && r.record_trace);
  req.set_method(request_.method());
  *req.mutable_speculation() = request_.speculation();
  *req.mutable_sampling() = sampling_;
  req.set_request_id(request_id_);
  lede::v1::DraftResponse resp;
  grpc::Status s;
  if (clients_.fused_rounds->load()) {  // co-located: draft and verify in one call
    lede::v1::DraftAndVerifyResponse both;
    auto ctx = ModelCallContext(server_, clients_.rpc_timeout);
    s = clients_.drafter->DraftAndVerify(ctx.get(), req, &both);
    if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      *clients_.fused_rounds = false;  // the verifier is in another process after all
    } else if (s.ok()) {
      resp = std::move(*both.mutable_draft());
      verdict_ = std::move(*both.mutable_verify());
      have_verdict_ = true;
    }
  }
  if (!clients_.fused_rounds->load()) {
    auto ctx = ModelCallContext(server_, clients_.rpc_timeout);
    s = clients_.drafter->Draft(ctx.get(), req, &resp);
  }
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE && clients_.autoregressive_fallback) {
      fallback_ = true;
      rpc::LogEvent("warn", "drafter_unavailable_fallback", {{"request_id", request_id_}});
      return d;
    }
    return FromModelCall(s, "drafter Draft");
  }
  return FromDraftResponse(resp, r.round_index);
}

StatusOr<speculation::Verdict> RemoteBackend::VerifyRound(int64_t, int32_t pending_token,
                                           const speculation::Draft& d) {
  lede::v1::VerifyResponse resp;
  if (have_verdict_) {  // verified in the same call as the draft
    have_verdict_ = false;
    resp = std::move(verdict_);
    return ToVerdict(resp);
  }
  lede::v1::VerifyRequest req;
  req.set_slot(slot_);
  req.set_pool_epoch(epoch_);
  req.set_session_id(session_id_);
  req.set_pending_token(pending_token);
  req.set_position(position_);
  req.set_exit_layer(d.exit_layer);
  for (int32_t t : d.tokens) req.add_draft_tokens(t);
  req.set_draft_probs(std::move(probs_bytes_));
  probs_bytes_.clear();
  req.set_ready_layer(d.ready_layer);
  auto ctx = ModelCallContext(server_, clients_.rpc_timeout);
  grpc::Status s = clients_.verifier->Verify(ctx.get(), req, &resp);
  if (!s.ok()) return FromModelCall(s, "verifier Verify");
  return ToVerdict(resp);
}

void MeasuredCosts::UpdateDrafter(const lede::v1::CostProfile& p) {
  absl::MutexLock lock(&mu_);
  drafter_ = p;
  have_ = true;
  Refresh();
}

void MeasuredCosts::UpdateVerifier(const lede::v1::CostProfile& p) {
  absl::MutexLock lock(&mu_);
  verifier_ = p;
  have_ = true;
  Refresh();
}

void MeasuredCosts::SetPrior(const speculation::CostFeatures& prior) {
  absl::MutexLock lock(&mu_);
  prior_ = prior;
  Refresh();
}

void MeasuredCosts::SetMetrics(telemetry::StepCostMetrics* metrics) {
  absl::MutexLock lock(&mu_);
  metrics_ = metrics;
}

void MeasuredCosts::Refresh() {
  features_ = have_ ? experience::ServedCostFeatures(experience::MergeCostProfiles(drafter_, verifier_), prior_)
                    : prior_;
  if (metrics_ != nullptr) metrics_->SetPolicyCostFeatures(features_.probe, features_.layer, features_.verify);
}

speculation::CostFeatures MeasuredCosts::Features() const {
  absl::MutexLock lock(&mu_);
  return features_;
}

speculation::CostFeatures PriorCostFeatures(const lede::v1::ModelInfo& info) {
  const int64_t L = info.n_layers(), D = info.max_draft_length();
  speculation::CostTables t;
  t.probe = info.probe_cost();
  if (L >= 2 && info.draft_cost_size() == L + 1) t.draft.assign(info.draft_cost().begin(), info.draft_cost().end());
  const int64_t E = speculation::MiddleExitLayer(L);
  if (L >= 2 && D >= 1 && info.verify_cost_size() == (L + 1) * (D + 1)) {
    for (int64_t k = 0; k <= D; ++k) t.verify.push_back(info.verify_cost(static_cast<int>(E * (D + 1) + k)));
  }
  return speculation::CostFeaturesOfTables(t);
}

bool MeasuredCosts::Current(lede::v1::CostProfile* out) const {
  absl::MutexLock lock(&mu_);
  if (!have_) return false;
  *out = experience::MergeCostProfiles(drafter_, verifier_);
  return true;
}

speculation::Draft RemoteBackend::FromDraftResponse(const lede::v1::DraftResponse& resp, int32_t round_index) {
  // A response carries a profile at most once a second (model_host.h).
  if (resp.has_measured_costs() && resp.measured_costs().time_us() > 0 && clients_.measured_costs != nullptr) {
    clients_.measured_costs->UpdateDrafter(resp.measured_costs());
  }
  speculation::Draft d;
  d.exit_layer = resp.exit_layer();
  d.tokens.assign(resp.draft_tokens().begin(), resp.draft_tokens().end());
  probs_bytes_ = resp.draft_probs();
  d.ready_layer = resp.ready_layer();
  d.n_probes = resp.n_probes();
  d.n_decisions = resp.n_decisions();
  d.policy_version = resp.policy_version();
  d.trace.round_index = round_index;
  for (const lede::v1::DecisionRecord& rec : resp.decisions()) {
    speculation::Decision dec;
    dec.state.phase = static_cast<speculation::Phase>(rec.phase());
    dec.state.layer = rec.layer();
    dec.state.n_layers = rec.n_layers();
    dec.state.draft_pos = rec.draft_pos();
    dec.state.max_draft_len = rec.max_draft_len();
    dec.state.top1_prob = rec.top1_prob();
    dec.state.top_k_nll = rec.top_k_nll();
    dec.state.entropy = rec.entropy();
    dec.state.trace_nll = rec.trace_nll();
    dec.state.margin = rec.margin();
    dec.state.draft_conf = rec.draft_conf();
    dec.state.accept_ema = rec.accept_ema();
    dec.state.lookup_match = rec.lookup_match();
    dec.state.trigram_seen = rec.trigram_seen();
    dec.state.load = std::max<int32_t>(1, rec.load());
    dec.state.cost = {rec.cost().probe(), rec.cost().layer(), rec.cost().verify()};
    dec.state.temperature = rec.temperature();
    dec.action = rec.action() == lede::v1::EXIT_ACTION_EXIT ? speculation::Action::kExit : speculation::Action::kContinue;
    dec.draft_index = rec.draft_index();
    dec.wasted_probe = rec.wasted_probe();
    d.trace.decisions.push_back(dec);
  }
  return d;
}

speculation::Verdict RemoteBackend::ToVerdict(const lede::v1::VerifyResponse& resp) {
  // A response carries a profile at most once a second (model_host.h).
  if (resp.has_measured_costs() && resp.measured_costs().time_us() > 0 && clients_.measured_costs != nullptr) {
    clients_.measured_costs->UpdateVerifier(resp.measured_costs());
  }
  speculation::Verdict v;
  v.n_accepted = resp.n_accepted();
  v.tokens.assign(resp.tokens().begin(), resp.tokens().end());
  v.nll.assign(resp.nll().begin(), resp.nll().end());
  position_ += static_cast<int64_t>(v.tokens.size());
  return v;
}

void RemoteBackend::Close(int64_t) {
  if (!open_) return;
  open_ = false;
  lede::v1::CloseSessionRequest req;
  req.set_slot(slot_);
  req.set_pool_epoch(epoch_);
  req.set_session_id(session_id_);
  SendClose(req);
}

void RemoteBackend::CloseOrphan() {
  lede::v1::CloseSessionRequest req;
  req.set_slot(-1);
  req.set_request_id(request_id_);
  req.set_owner_instance(clients_.owner_instance);
  SendClose(req);
}

void RemoteBackend::SendClose(const lede::v1::CloseSessionRequest& req) {
  lede::v1::CloseSessionResponse resp;
  grpc::ClientContext ctx;  // not the client's: a cancelled request still frees its slot
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status s = clients_.verifier->CloseSession(&ctx, req, &resp);
  if (!s.ok()) {
    rpc::LogEvent("warn", "close_session_failed", {{"request_id", request_id_}, {"error", s.error_message()}});
  }
}

// ----------------------------------------------------------- ReplicaBackend

ReplicaBackend::ReplicaBackend(ReplicaSet& replicas, const ModelClients& base, grpc::CallbackServerContext* server,
                               const lede::v1::ModelInfo& info, const lede::v1::GenerateRequest& request,
                               const std::string& request_id, bool record_trace)
    : replicas_(replicas),
      base_(base),
      server_(server),
      info_(info),
      request_(request),
      request_id_(request_id),
      record_trace_(record_trace),
      limits_(LimitsOf(info)) {}

StatusOr<speculation::Prefilled> ReplicaBackend::Open(const std::vector<int32_t>& prompt,
                                                      const speculation::SessionOptions& options) {
  Status last = UnavailableError("no model replica is known yet (DNS has resolved none)");
  for (const std::shared_ptr<Replica>& replica : replicas_.Candidates()) {
    ModelClients clients = base_;
    clients.verifier = replica->verifier();
    clients.drafter = replica->drafter();
    clients.fused_rounds = replica->fused_rounds();
    clients.owner_instance = replica->owner_instance();
    auto backend = std::make_unique<RemoteBackend>(clients, server_, info_, request_, request_id_, record_trace_);
    backend->set_position(position_);
    StatusOr<speculation::Prefilled> opened = backend->Open(prompt, options);
    if (opened.ok()) {
      replica->SessionOpened();
      replica_ = replica;
      backend_ = std::move(backend);
      return opened;
    }
    if (opened.status().code() != StatusCode::kUnavailable &&
        opened.status().code() != StatusCode::kResourceExhausted) {
      return opened.status();
    }
    replicas_.MarkFailed(*replica);
    rpc::LogEvent("warn", "replica_refused_session", {{"replica", replica->name()},
                                                      {"request_id", request_id_},
                                                      {"error", std::string(opened.status().message())}});
    last = opened.status();
  }
  return last;
}

StatusOr<speculation::Draft> ReplicaBackend::DraftRound(int64_t session, const speculation::DraftRequest& r) {
  return backend_->DraftRound(session, r);
}

StatusOr<speculation::Verdict> ReplicaBackend::VerifyRound(int64_t session, int32_t pending_token,
                                                           const speculation::Draft& d) {
  return backend_->VerifyRound(session, pending_token, d);
}

void ReplicaBackend::Close(int64_t session) {
  if (backend_ == nullptr || closed_) return;
  closed_ = true;
  backend_->Close(session);
  replica_->SessionClosed();
}

}  // namespace lede::coordinator
