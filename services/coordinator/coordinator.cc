#include "services/coordinator/coordinator.h"

#include <algorithm>
#include <cctype>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include "absl/time/time.h"
#include "shared/experience/transition.h"
#include "proto/lede/v1/model.grpc.pb.h"
#include "shared/rpc/grpc_status.h"
#include "shared/rpc/server.h"
#include "shared/speculation/generation.h"
#include "shared/status/status_macros.h"
#include "shared/storage/object_store.h"
#include "shared/telemetry/lede_metrics.h"
#include "shared/telemetry/metrics.h"
#include "shared/tokenizer/tokenizer.h"
#include "shared/experience/experience.h"
#include "shared/experience/experience_logger.h"

namespace lede::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
using lede::v1::GenerateRequest;
using lede::v1::GenerateResponse;
using lede::v1::SpeculationMethod;

// A status from a model process, as the client should see it: a session
// whose pool is gone (the verifier restarted) is UNAVAILABLE, like a
// process that is down; the rest keeps its code.
Status FromModelCall(const grpc::Status& s, const std::string& what) {
  Status status = rpc::FromGrpcStatus(s, what);
  if (status.code() == StatusCode::kFailedPrecondition) {
    return UnavailableError(std::string(status.message()) + " (the model service restarted; retry)");
  }
  return status;
}

lede::v1::FinishReason FinishToProto(speculation::FinishReason f) {
  switch (f) {
    case speculation::FinishReason::kEos: return lede::v1::FINISH_REASON_EOS;
    case speculation::FinishReason::kStop: return lede::v1::FINISH_REASON_STOP;
    default: return lede::v1::FINISH_REASON_LENGTH;
  }
}

}  // namespace

class ResponseWriter;

struct GenerationService::Impl {
  // One request, start to end (validation, the loop, the summary, metrics,
  // experience); runs on the request's worker thread.
  // `context` is null for in-process calls (the HTTP front end): no client
  // deadline, cancellation through the writer. `fill_max_tokens`: a
  // max_new_tokens of 0 means "up to the context window" (min of the limit
  // and capacity minus the prompt) instead of INVALID_ARGUMENT.
  Status Run(grpc::CallbackServerContext* context, const GenerateRequest* request, ResponseWriter* writer,
             bool fill_max_tokens = false);

  CoordinatorOptions options;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::shared_ptr<grpc::Channel> verifier_channel, drafter_channel;
  std::unique_ptr<lede::v1::Verifier::Stub> verifier;
  std::unique_ptr<lede::v1::Drafter::Stub> drafter;
  // Drafter and verifier share a process: one DraftAndVerify call per round.
  std::atomic<bool> fused_rounds{false};
  std::unique_ptr<telemetry::SpecDecodeMetrics> metrics;
  std::unique_ptr<experience::ExperienceLogger> logger;
  telemetry::Counter* experience_written = nullptr;
  telemetry::Counter* experience_dropped = nullptr;

  std::mutex info_mu;
  bool have_info = false;
  lede::v1::ModelInfo info;       // guarded by info_mu
  policy::RewardSpec rewards;     // guarded by info_mu
  std::mt19937_64 id_rng{std::random_device{}()};  // request ids; guarded by info_mu

  // A client context for a call made on behalf of `server`: its deadline
  // (capped at rpc_timeout_s) and its cancellation.
  std::unique_ptr<grpc::ClientContext> CallContext(grpc::CallbackServerContext* server) const {
    std::unique_ptr<grpc::ClientContext> ctx =
        server ? grpc::ClientContext::FromCallbackServerContext(*server) : std::make_unique<grpc::ClientContext>();
    auto cap = std::chrono::system_clock::now() +
               std::chrono::milliseconds(static_cast<int64_t>(options.rpc_timeout_s * 1000));
    if (!server || server->deadline() > cap) ctx->set_deadline(cap);
    return ctx;
  }

  // The verifier's ModelInfo: fetched on the first request that finds the
  // verifier up, then kept (a restarted verifier serves the same model).
  StatusOr<lede::v1::ModelInfo> Info(grpc::CallbackServerContext* server) {
    {
      std::lock_guard<std::mutex> lock(info_mu);
      if (have_info) return info;
    }
    auto ctx = CallContext(server);
    lede::v1::ModelInfo fresh;
    grpc::Status s = verifier->Describe(ctx.get(), lede::v1::DescribeRequest(), &fresh);
    if (!s.ok()) return FromModelCall(s, "verifier Describe");
    std::lock_guard<std::mutex> lock(info_mu);
    info = fresh;
    have_info = true;
    const int32_t L = fresh.n_layers();
    const int32_t D = fresh.max_draft_length();
    if (options.reward == "paper" || fresh.draft_cost_size() != L + 1 ||
        fresh.verify_cost_size() != (L + 1) * (D + 1)) {
      rewards = policy::RewardSpec::Paper(L);
    } else {
      std::vector<double> draft_cost(fresh.draft_cost().begin(), fresh.draft_cost().end());
      std::vector<std::vector<double>> verify(L + 1);
      for (int32_t e = 0; e <= L; ++e) {
        for (int32_t k = 0; k <= D; ++k) verify[e].push_back(fresh.verify_cost(e * (D + 1) + k));
      }
      rewards = policy::RewardSpec::Throughput(fresh.cost_model(), draft_cost, verify, fresh.probe_cost());
    }
    return info;
  }

  void LogExperience(const speculation::GenerationResult& result, const std::string& request_id) {
    if (!logger) return;
    policy::RewardSpec spec;
    std::string fingerprint;
    {
      std::lock_guard<std::mutex> lock(info_mu);
      spec = rewards;
      fingerprint = info.model_fingerprint();
    }
    for (const model::RoundTrace& trace : result.traces) {
      for (const policy::Transition& t :
           policy::ToTransitions(trace, spec, request_id, result.policy_version, fingerprint)) {
        lede::v1::Transition record;
        experience::ToProto(t, &record);
        logger->Log(std::move(record));
      }
    }
  }
};

// The speculation loop's backend over gRPC: one session on the verifier,
// rounds drafted by the drafter.
class RemoteBackend : public speculation::SpeculationBackend {
 public:
  RemoteBackend(GenerationService::Impl& impl, grpc::CallbackServerContext* server, const lede::v1::ModelInfo& info,
                const GenerateRequest& request, const std::string& request_id, bool record_trace)
      : impl_(impl), server_(server), request_(request), request_id_(request_id), record_trace_(record_trace) {
    limits_.n_layers = info.n_layers();
    limits_.vocab_size = info.vocab_size();
    limits_.capacity = info.capacity();
    limits_.eos_ids.assign(info.eos_ids().begin(), info.eos_ids().end());
  }

  const speculation::ModelLimits& limits() const override { return limits_; }

  StatusOr<speculation::Prefilled> Open(const std::vector<int32_t>& prompt,
                                        const speculation::SessionOptions& options) override {
    sampling_.set_temperature(static_cast<float>(options.sampling.temperature));
    sampling_.set_top_p(static_cast<float>(options.sampling.top_p));
    sampling_.set_seed(options.sampling.seed);
    lede::v1::OpenSessionRequest req;
    for (int32_t id : prompt) req.add_prompt_token_ids(id);
    *req.mutable_sampling() = sampling_;
    req.set_record_nll(options.record_nll);
    req.set_request_id(request_id_);
    lede::v1::OpenSessionResponse resp;
    // Not the client's context: a client deadline or cancel that lands while
    // the verifier prefills would lose the response, and with it the slot
    // number needed to close the session (the slot leaked until the idle
    // reclaim). The next call carries the client's deadline; Close() frees it.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(impl_.options.rpc_timeout_s * 1000)));
    grpc::Status s = impl_.verifier->OpenSession(&ctx, req, &resp);
    if (!s.ok()) return FromModelCall(s, "verifier OpenSession");
    slot_ = resp.slot();
    epoch_ = resp.pool_epoch();
    open_ = true;
    speculation::Prefilled p;
    p.session = slot_;
    p.token = resp.first_token();
    p.nll = resp.first_nll();
    return p;
  }

  StatusOr<speculation::Draft> DraftRound(int64_t, const speculation::DraftRequest& r) override {
    speculation::Draft d;
    if (fallback_) return d;  // the drafter is down: a full-depth step
    lede::v1::DraftRequest req;
    req.set_slot(slot_);
    req.set_pool_epoch(epoch_);
    req.set_pending_token(r.pending_token);
    req.set_position(r.position);
    req.set_budget(r.budget);
    req.set_trace_nll(r.trace_nll);
    req.set_accept_ema(r.accept_ema);
    req.set_round_index(r.round_index);
    req.set_record_trace(record_trace_ && r.record_trace);
    req.set_method(request_.method());
    *req.mutable_speculation() = request_.speculation();
    *req.mutable_sampling() = sampling_;
    req.set_request_id(request_id_);
    lede::v1::DraftResponse resp;
    grpc::Status s;
    if (impl_.fused_rounds.load()) {  // co-located: draft and verify in one call
      lede::v1::DraftAndVerifyResponse both;
      auto ctx = impl_.CallContext(server_);
      s = impl_.drafter->DraftAndVerify(ctx.get(), req, &both);
      if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
        impl_.fused_rounds = false;  // the verifier is in another process after all
      } else if (s.ok()) {
        resp = std::move(*both.mutable_draft());
        verdict_ = std::move(*both.mutable_verify());
        have_verdict_ = true;
      }
    }
    if (!impl_.fused_rounds.load()) {
      auto ctx = impl_.CallContext(server_);
      s = impl_.drafter->Draft(ctx.get(), req, &resp);
    }
    if (!s.ok()) {
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE && impl_.options.autoregressive_fallback) {
        fallback_ = true;
        rpc::LogEvent("warn", "drafter_unavailable_fallback", {{"request_id", request_id_}});
        return d;
      }
      return FromModelCall(s, "drafter Draft");
    }
    d.exit_layer = resp.exit_layer();
    d.tokens.assign(resp.draft_tokens().begin(), resp.draft_tokens().end());
    probs_bytes_ = resp.draft_probs();
    d.ready_layer = resp.ready_layer();
    d.n_probes = resp.n_probes();
    d.n_decisions = resp.n_decisions();
    d.policy_version = resp.policy_version();
    d.trace.round_index = r.round_index;
    for (const lede::v1::DecisionRecord& rec : resp.decisions()) {
      model::Decision dec;
      dec.state.phase = static_cast<model::Phase>(rec.phase());
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
      dec.action = rec.action() == lede::v1::EXIT_ACTION_EXIT ? model::Action::kExit : model::Action::kContinue;
      dec.draft_index = rec.draft_index();
      d.trace.decisions.push_back(dec);
    }
    return d;
  }

  StatusOr<speculation::Verdict> VerifyRound(int64_t, int32_t pending_token,
                                             const speculation::Draft& d) override {
    lede::v1::VerifyResponse resp;
    if (have_verdict_) {  // verified in the same call as the draft
      have_verdict_ = false;
      resp = std::move(verdict_);
      return ToVerdict(resp);
    }
    lede::v1::VerifyRequest req;
    req.set_slot(slot_);
    req.set_pool_epoch(epoch_);
    req.set_pending_token(pending_token);
    req.set_position(position_);
    req.set_exit_layer(d.exit_layer);
    for (int32_t t : d.tokens) req.add_draft_tokens(t);
    req.set_draft_probs(std::move(probs_bytes_));
    probs_bytes_.clear();
    req.set_ready_layer(d.ready_layer);
    auto ctx = impl_.CallContext(server_);
    grpc::Status s = impl_.verifier->Verify(ctx.get(), req, &resp);
    if (!s.ok()) return FromModelCall(s, "verifier Verify");
    return ToVerdict(resp);
  }

  speculation::Verdict ToVerdict(const lede::v1::VerifyResponse& resp) {
    speculation::Verdict v;
    v.n_accepted = resp.n_accepted();
    v.tokens.assign(resp.tokens().begin(), resp.tokens().end());
    v.nll.assign(resp.nll().begin(), resp.nll().end());
    position_ += static_cast<int64_t>(v.tokens.size());
    return v;
  }

  void Close(int64_t) override {
    if (!open_) return;
    open_ = false;
    lede::v1::CloseSessionRequest req;
    req.set_slot(slot_);
    req.set_pool_epoch(epoch_);
    lede::v1::CloseSessionResponse resp;
    grpc::ClientContext ctx;  // not the client's: a cancelled request still frees its slot
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status s = impl_.verifier->CloseSession(&ctx, req, &resp);
    if (!s.ok()) {
      rpc::LogEvent("warn", "close_session_failed", {{"request_id", request_id_}, {"error", s.error_message()}});
    }
  }

  void set_position(int64_t n) { position_ = n; }
  bool fell_back() const { return fallback_; }

 private:
  GenerationService::Impl& impl_;
  grpc::CallbackServerContext* server_;
  const GenerateRequest& request_;
  std::string request_id_;
  bool record_trace_;
  speculation::ModelLimits limits_;
  lede::v1::SamplingParams sampling_;
  std::string probs_bytes_;
  lede::v1::VerifyResponse verdict_;  // of a DraftAndVerify call, until VerifyRound takes it
  bool have_verdict_ = false;
  int64_t slot_ = 0;
  uint64_t epoch_ = 0;
  int64_t position_ = 0;  // committed length of the slot
  bool open_ = false;
  bool fallback_ = false;
};

std::string SpeculationMethodName(SpeculationMethod method) {
  if (method == lede::v1::SPECULATION_METHOD_UNSPECIFIED || !lede::v1::SpeculationMethod_IsValid(method)) {
    return "lede";  // what the loop runs for UNSPECIFIED; invalid ones fail validation
  }
  constexpr char kPrefix[] = "SPECULATION_METHOD_";
  std::string name = lede::v1::SpeculationMethod_Name(method).substr(sizeof(kPrefix) - 1);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

bool ParseSpeculationMethodName(const std::string& name, SpeculationMethod* method) {
  std::string upper = "SPECULATION_METHOD_";
  for (char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  SpeculationMethod m;
  if (name.empty() || name == "unspecified" || !lede::v1::SpeculationMethod_Parse(upper, &m)) return false;
  *method = m;
  return true;
}

GenerationService::GenerationService() : impl_(std::make_unique<Impl>()) {}
GenerationService::~GenerationService() { (void)FlushExperience(); }

StatusOr<std::unique_ptr<GenerationService>> GenerationService::Create(const CoordinatorOptions& options,
                                                                       prometheus::Registry* registry) {
  if (options.tokenizer_path.empty()) return InvalidArgumentError("tokenizer_path: required");
  if (options.reward != "throughput" && options.reward != "paper") {
    return InvalidArgumentError("reward: must be throughput or paper, got '" + options.reward + "'");
  }
  if (options.max_new_tokens_limit < 1) return InvalidArgumentError("max_new_tokens_limit: must be >= 1");
  std::unique_ptr<GenerationService> service(new GenerationService());
  Impl& impl = *service->impl_;
  impl.options = options;
  LEDE_ASSIGN_OR_RETURN(impl.tokenizer, tokenizer::LoadTokenizer(options.tokenizer_path));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  auto verifier_channel = grpc::CreateCustomChannel(options.verifier_target, grpc::InsecureChannelCredentials(), args);
  auto drafter_channel = options.drafter_target == options.verifier_target
                             ? verifier_channel
                             : grpc::CreateCustomChannel(options.drafter_target,
                                                         grpc::InsecureChannelCredentials(), args);
  impl.verifier_channel = verifier_channel;
  impl.drafter_channel = drafter_channel;
  impl.verifier = lede::v1::Verifier::NewStub(verifier_channel);
  impl.drafter = lede::v1::Drafter::NewStub(drafter_channel);
  impl.fused_rounds = options.drafter_target == options.verifier_target;
  if (registry != nullptr) impl.metrics = std::make_unique<telemetry::SpecDecodeMetrics>(*registry);
  if (!options.experience_url.empty()) {
    auto store = storage::OpenObjectStore(options.experience_url);
    if (!store.ok()) return InvalidArgumentError("experience_url: " + std::string(store.status().message()));
    experience::ExperienceLoggerOptions lo;
    lo.prefix = options.experience_prefix;
    lo.queue_capacity_records = options.experience_queue_records;
    lo.max_shard_age = absl::Milliseconds(static_cast<int64_t>(options.experience_shard_age_s * 1000));
    telemetry::SpecDecodeMetrics* m = impl.metrics.get();
    if (m != nullptr) {
      auto last = std::make_shared<experience::ExperienceLoggerCounters>();
      auto mu = std::make_shared<std::mutex>();
      lo.on_counters = [m, last, mu](const experience::ExperienceLoggerCounters& c) {
        std::lock_guard<std::mutex> lock(*mu);
        m->experience_records_written.Increment(static_cast<double>(c.records_written - last->records_written));
        m->experience_records_dropped.Increment(
            static_cast<double>((c.records_dropped + c.records_lost) - (last->records_dropped + last->records_lost)));
        m->experience_shards_written.Increment(static_cast<double>(c.shards_written - last->shards_written));
        *last = c;
      };
    }
    auto logger = experience::ExperienceLogger::Create(
        std::shared_ptr<storage::ObjectStore>(std::move(*store)), std::move(lo));
    if (!logger.ok()) return logger.status();
    impl.logger = std::move(*logger);
  }
  return service;
}

Status GenerationService::FlushExperience() {
  return impl_->logger ? impl_->logger->Flush() : OkStatus();
}

// Where a request's responses go: the reactor (blocking the worker, never
// the reactor, while the client is slow).
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // False once the client is gone.
  virtual bool Write(const GenerateResponse& response) = 0;
  // What a failed Write() means for the request's status: a gRPC stream
  // that broke is UNAVAILABLE; an HTTP client that hung up cancelled it.
  virtual Status WriteFailedStatus() const { return UnavailableError("client stream closed"); }
};

Status GenerationService::Impl::Run(grpc::CallbackServerContext* context, const GenerateRequest* request,
                                    ResponseWriter* writer, bool fill_max_tokens) {
  Impl& impl = *this;
  const auto t0 = Clock::now();
  const SpeculationMethod method = request->method();
  auto finish = [&](const Status& status) {
    if (impl.metrics) {
      impl.metrics->RecordRequest(SpeculationMethodName(method), status.code(),
                                  std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (!status.ok()) {
      rpc::LogEvent("info", "request_failed", {{"request_id", request->request_id()},
                                               {"code", telemetry::GrpcCodeName(status.code())},
                                               {"error", std::string(status.message())}});
    }
    return status;
  };

  // --- validation that needs no model process
  if (request->request_id().size() > 128) return finish(InvalidArgumentError("request_id: longer than 128 bytes"));
  if (!tokenizer::IsValidUtf8(request->request_id())) return finish(InvalidArgumentError("request_id: invalid UTF-8"));
  if (!request->prompt().empty() && request->prompt_token_ids_size() > 0) {
    return finish(InvalidArgumentError("prompt: give prompt or prompt_token_ids, not both"));
  }
  if (request->prompt().empty() && request->prompt_token_ids_size() == 0) {
    return finish(InvalidArgumentError("prompt: empty"));
  }
  if (!tokenizer::IsValidUtf8(request->prompt())) return finish(InvalidArgumentError("prompt: invalid UTF-8"));
  const bool auto_max_tokens = fill_max_tokens && request->max_new_tokens() == 0;
  if (!auto_max_tokens &&
      (request->max_new_tokens() <= 0 || request->max_new_tokens() > impl.options.max_new_tokens_limit)) {
    return finish(InvalidArgumentError("max_new_tokens: must be in [1, " +
                                       std::to_string(impl.options.max_new_tokens_limit) + "], got " +
                                       std::to_string(request->max_new_tokens())));
  }
  if (!(request->temperature() >= 0.0f) || !std::isfinite(request->temperature())) {
    return finish(InvalidArgumentError("temperature: must be a finite number >= 0"));
  }
  const double top_p = request->top_p() == 0.0f ? 1.0 : request->top_p();
  if (!(top_p > 0.0 && top_p <= 1.0)) return finish(InvalidArgumentError("top_p: must be in (0, 1]"));
  if (!lede::v1::SpeculationMethod_IsValid(method)) {
    return finish(InvalidArgumentError("method: unknown speculation method " + std::to_string(method)));
  }
  const lede::v1::SpeculationParams& sp = request->speculation();
  if (method == lede::v1::SPECULATION_METHOD_THRESHOLD && !(sp.threshold() > 0.0f && sp.threshold() <= 1.0f)) {
    return finish(InvalidArgumentError("speculation.threshold: must be in (0, 1]"));
  }
  if ((method == lede::v1::SPECULATION_METHOD_LEDE || method == lede::v1::SPECULATION_METHOD_UNSPECIFIED) &&
      !(sp.epsilon() >= 0.0f && sp.epsilon() <= 1.0f)) {
    return finish(InvalidArgumentError("speculation.epsilon: must be in [0, 1]"));
  }
  size_t max_stop = 0;
  for (int i = 0; i < request->stop_size(); ++i) {
    if (request->stop(i).empty() || !tokenizer::IsValidUtf8(request->stop(i))) {
      return finish(InvalidArgumentError("stop[" + std::to_string(i) + "]: empty or invalid UTF-8"));
    }
    max_stop = std::max(max_stop, request->stop(i).size());
  }

  // --- the model
  // Admitted: waiting for the model (ModelInfo, then a KV slot and the
  // prefill); running from the first token on.
  struct Occupancy {
    telemetry::SpecDecodeMetrics* m;
    bool running = false;
    explicit Occupancy(telemetry::SpecDecodeMetrics* metrics) : m(metrics) {
      if (m) m->num_requests_waiting.Increment();
    }
    void Run() {
      if (m && !running) {
        m->num_requests_waiting.Decrement();
        m->num_requests_running.Increment();
      }
      running = true;
    }
    ~Occupancy() {
      if (m) (running ? m->num_requests_running : m->num_requests_waiting).Decrement();
    }
  } occupancy(impl.metrics.get());
  StatusOr<lede::v1::ModelInfo> info = impl.Info(context);
  if (!info.ok()) return finish(info.status());
  if (method == lede::v1::SPECULATION_METHOD_STATIC) {
    if (sp.exit_layer() < 1 || sp.exit_layer() > info->n_layers()) {
      return finish(InvalidArgumentError("speculation.exit_layer: " + std::to_string(sp.exit_layer()) +
                                         " outside [1, " + std::to_string(info->n_layers()) + "]"));
    }
    if (sp.draft_length() < 1 || sp.draft_length() > info->max_draft_length()) {
      return finish(InvalidArgumentError("speculation.draft_length: " + std::to_string(sp.draft_length()) +
                                         " outside [1, " + std::to_string(info->max_draft_length()) + "]"));
    }
  }
  std::vector<int32_t> prompt;
  if (request->prompt_token_ids_size() > 0) {
    prompt.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (prompt[i] < 0 || prompt[i] >= info->vocab_size()) {
        return finish(InvalidArgumentError("prompt_token_ids[" + std::to_string(i) + "]: " +
                                           std::to_string(prompt[i]) + " outside [0, " +
                                           std::to_string(info->vocab_size()) + ")"));
      }
    }
  } else {
    auto encoded = impl.tokenizer->Encode(request->prompt(), /*add_bos=*/true, /*add_eos=*/false);
    if (!encoded.ok()) return finish(InvalidArgumentError("prompt: " + std::string(encoded.status().message())));
    prompt = std::move(*encoded);
  }
  std::string request_id = request->request_id();
  if (request_id.empty()) {
    std::lock_guard<std::mutex> lock(impl.info_mu);
    char buf[32];
    snprintf(buf, sizeof(buf), "req-%016llx", static_cast<unsigned long long>(impl.id_rng()));
    request_id = buf;
  }

  // --- the loop
  speculation::LoopOptions loop;
  loop.max_new_tokens = request->max_new_tokens();
  if (auto_max_tokens) {
    loop.max_new_tokens = std::max<int64_t>(
        1, std::min<int64_t>(impl.options.max_new_tokens_limit,
                             info->capacity() - static_cast<int64_t>(prompt.size())));
  }
  loop.mode = method == lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE ? speculation::SpeculationMode::kAutoregressive
              : method == lede::v1::SPECULATION_METHOD_STATIC      ? speculation::SpeculationMode::kStatic
                                                                   : speculation::SpeculationMode::kAdaptive;
  loop.session.sampling.temperature = request->temperature();
  loop.session.sampling.top_p = top_p;
  loop.session.sampling.seed = request->seed();
  loop.record_traces = impl.logger != nullptr && loop.mode == speculation::SpeculationMode::kAdaptive;
  RemoteBackend backend(impl, context, *info, *request, request_id, loop.record_traces);
  backend.set_position(static_cast<int64_t>(prompt.size()));

  tokenizer::StreamingDetokenizer detok(*impl.tokenizer, prompt.back());
  std::string held;       // text not yet sent: could be the start of a stop string
  bool stopped = false;   // a stop string matched
  bool write_failed = false;
  auto send = [&](const std::string& text, const std::vector<int32_t>& ids) {
    if (text.empty() && ids.empty()) return true;
    GenerateResponse r;
    r.mutable_delta()->set_text(text);
    for (int32_t id : ids) r.mutable_delta()->add_token_ids(id);
    if (!writer->Write(r)) write_failed = true;
    return !write_failed;
  };
  auto sink = [&](const std::vector<int32_t>& tokens) {
    occupancy.Run();
    if (context != nullptr && context->IsCancelled()) return false;
    for (int32_t id : tokens) held += detok.Push(id);
    for (const std::string& stop : request->stop()) {
      if (size_t at = held.find(stop); at != std::string::npos) {
        held.resize(at);
        stopped = true;
      }
    }
    if (stopped) {
      send(held, tokens);
      held.clear();
      return false;
    }
    // Hold back what could still become a stop string, cut at a character boundary.
    size_t keep = max_stop > 0 ? std::min(held.size(), max_stop - 1) : 0;
    size_t cut = held.size() - keep;
    while (cut > 0 && cut < held.size() && (static_cast<unsigned char>(held[cut]) & 0xC0) == 0x80) --cut;
    std::string out = held.substr(0, cut);
    held.erase(0, cut);
    return send(out, tokens);
  };
  StatusOr<speculation::GenerationResult> result = speculation::RunGeneration(backend, prompt, loop, sink);
  if (!result.ok()) return finish(result.status());
  if ((context != nullptr && context->IsCancelled()) || write_failed) {
    if (impl.metrics) impl.metrics->RecordSuccess("abort");
    if (context != nullptr && context->IsCancelled()) {
      return finish(Status(StatusCode::kCancelled, "client cancelled the request"));
    }
    return finish(writer->WriteFailedStatus());
  }
  if (!stopped) {
    held += detok.Flush();
    if (!held.empty()) send(held, {});
  }

  const speculation::GenerationStats& st = result->stats;
  GenerateResponse r;
  lede::v1::GenerationSummary* s = r.mutable_summary();
  s->set_request_id(request_id);
  s->set_finish_reason(stopped ? lede::v1::FINISH_REASON_STOP : FinishToProto(result->finish));
  s->set_prompt_tokens(st.n_prompt_tokens);
  s->set_generated_tokens(st.n_generated);
  s->set_rounds(static_cast<int64_t>(st.rounds.size()));
  s->set_drafted_tokens(st.n_drafted);
  s->set_accepted_tokens(st.n_accepted);
  s->set_acceptance_rate(st.acceptance_rate());
  s->set_mean_exit_layer(st.mean_exit_layer());
  s->set_mean_draft_length(st.mean_draft_len());
  s->set_tokens_per_round(st.tokens_per_round());
  s->set_time_to_first_token_us(static_cast<int64_t>(st.prefill_s * 1e6));
  s->set_decode_time_us(static_cast<int64_t>(st.decode_s * 1e6));
  s->set_decode_tokens_per_second(st.decode_tokens_per_s());
  s->set_policy_version(result->policy_version);
  writer->Write(r);

  if (impl.metrics) {
    telemetry::SpecDecodeMetrics& m = *impl.metrics;
    for (const speculation::RoundRecord& round : st.rounds) {
      m.RecordRound(round.exit_layer, round.n_drafted, round.n_accepted, round.latency_s);
      // A round emits its tokens together: each gets the round's time per token.
      for (int32_t i = 0; i < round.n_emitted; ++i) m.inter_token_latency.Observe(round.latency_s / round.n_emitted);
    }
    m.prompt_tokens.Increment(static_cast<double>(st.n_prompt_tokens));
    m.RecordSuccess(s->finish_reason() == lede::v1::FINISH_REASON_LENGTH ? "length" : "stop");
    m.generation_tokens.Increment(static_cast<double>(st.n_generated));
    m.time_to_first_token.Observe(st.prefill_s);
  }
  impl.LogExperience(*result, request_id);
  rpc::LogEvent("info", "request_done",
                {{"request_id", request_id},
                 {"method", SpeculationMethodName(method)},
                 {"tokens", std::to_string(st.n_generated)},
                 {"acceptance_rate", std::to_string(st.acceptance_rate())},
                 {"tokens_per_s", std::to_string(st.decode_tokens_per_s())},
                 {"fallback", backend.fell_back() ? "true" : "false"}});
  return finish(OkStatus());
}

// The server side of one Generate call (gRPC callback API): a worker thread
// runs Impl::Run and hands responses to the reactor through a small queue;
// the reactor writes one at a time. The worker finishes the call once the
// queue is drained; OnDone() waits for the worker to be out before the
// reactor is deleted.
class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public ResponseWriter {
 public:
  GenerateReactor(GenerationService::Impl& impl, grpc::CallbackServerContext* context, GenerateRequest request)
      : impl_(impl), context_(context), request_(std::move(request)) {
    std::thread([this] { Work(); }).detach();
  }

  bool Write(const GenerateResponse& response) override {
    grpc::ByteBuffer buffer;
    bool own = false;
    if (!grpc::SerializationTraits<GenerateResponse>::Serialize(response, &buffer, &own).ok()) return false;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.size() < kMaxQueued || failed_; });
    if (failed_) return false;
    queue_.push_back(std::move(buffer));
    if (!writing_) StartNextLocked();
    return true;
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    queue_.pop_front();
    if (!ok) {
      failed_ = true;
      queue_.clear();
    } else if (!queue_.empty()) {
      StartNextLocked();
    }
    cv_.notify_all();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
    cv_.notify_all();
  }

  void OnDone() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return worker_done_; });
    }
    delete this;
  }

 private:
  static constexpr size_t kMaxQueued = 8;

  void StartNextLocked() {
    writing_ = true;
    StartWrite(&queue_.front());
  }

  void Work() {
    Status status = impl_.Run(context_, &request_, this);
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return (!writing_ && queue_.empty()) || failed_; });
    }
    Finish(rpc::ToGrpcStatus(status));
    std::lock_guard<std::mutex> lock(mu_);
    worker_done_ = true;
    cv_.notify_all();
  }

  GenerationService::Impl& impl_;
  grpc::CallbackServerContext* context_;
  GenerateRequest request_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<grpc::ByteBuffer> queue_;  // front = the write in flight (when writing_)
  bool writing_ = false;
  bool failed_ = false;       // client gone or write failed
  bool worker_done_ = false;
};

namespace {

// The HTTP front end's writer: a callback; a false return is a client that
// hung up, which cancels the request.
class CallbackWriter final : public ResponseWriter {
 public:
  explicit CallbackWriter(const std::function<bool(const GenerateResponse&)>& fn) : fn_(fn) {}
  bool Write(const GenerateResponse& response) override { return fn_(response); }
  Status WriteFailedStatus() const override {
    return Status(StatusCode::kCancelled, "client disconnected");
  }

 private:
  const std::function<bool(const GenerateResponse&)>& fn_;
};

}  // namespace

Status GenerationService::GenerateInProcess(const GenerateRequest& request,
                                            const std::function<bool(const GenerateResponse&)>& on_response,
                                            bool fill_max_tokens) {
  CallbackWriter writer(on_response);
  return impl_->Run(nullptr, &request, &writer, fill_max_tokens);
}

Status GenerationService::CheckModelServices(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::system_clock::now() + timeout;
  if (!impl_->verifier_channel->WaitForConnected(deadline)) {
    return UnavailableError("verifier " + impl_->options.verifier_target + " is not reachable");
  }
  if (!impl_->drafter_channel->WaitForConnected(deadline)) {
    return UnavailableError("drafter " + impl_->options.drafter_target + " is not reachable");
  }
  return OkStatus();
}

// Finishes a call at once with an error (no worker needed).
class RejectReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RejectReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::Generate(grpc::CallbackServerContext* context,
                                                                       const grpc::ByteBuffer* raw) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (raw->Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  auto reject = [&](const Status& status) {
    if (impl_->metrics) impl_->metrics->RecordRequest("unknown", status.code(), 0.0);
    rpc::LogEvent("info", "request_failed", {{"code", telemetry::GrpcCodeName(status.code())},
                                             {"error", std::string(status.message())}});
    return new RejectReactor(rpc::ToGrpcStatus(status));
  };
  // Text fields first, as bytes: invalid UTF-8 names its field.
  lede::v1::GenerateRequestText text;
  if (!text.ParseFromString(bytes)) return reject(InvalidArgumentError("request: not a GenerateRequest"));
  if (!tokenizer::IsValidUtf8(text.request_id())) return reject(InvalidArgumentError("request_id: invalid UTF-8"));
  if (!tokenizer::IsValidUtf8(text.prompt())) return reject(InvalidArgumentError("prompt: invalid UTF-8"));
  for (int i = 0; i < text.stop_size(); ++i) {
    if (!tokenizer::IsValidUtf8(text.stop(i))) {
      return reject(InvalidArgumentError("stop[" + std::to_string(i) + "]: invalid UTF-8"));
    }
  }
  GenerateRequest request;
  if (!request.ParseFromString(bytes)) return reject(InvalidArgumentError("request: not a GenerateRequest"));
  return new GenerateReactor(*impl_, context, std::move(request));
}

}  // namespace lede::coordinator
