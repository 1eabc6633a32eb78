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
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include "absl/time/time.h"
#include "services/coordinator/remote_backend.h"
#include "services/coordinator/session_lease.h"
#include "services/coordinator/request_validation.h"
#include "services/coordinator/response_writer.h"
#include "services/coordinator/stop_filter.h"
#include "shared/experience/transition.h"
#include "proto/lede/v1/model.grpc.pb.h"
#include "shared/rpc/grpc_status.h"
#include "shared/rpc/security.h"
#include "shared/rpc/server.h"
#include "shared/speculation/generation.h"
#include "shared/speculation/method.h"
#include "shared/status/status_macros.h"
#include "shared/storage/object_store.h"
#include "shared/telemetry/lede_metrics.h"
#include "shared/telemetry/metrics.h"
#include "shared/tokenizer/tokenizer.h"
#include "shared/experience/experience.h"
#include "shared/experience/experience_logger.h"
#include "shared/experience/request_log.h"

namespace lede::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
using lede::v1::GenerateRequest;
using lede::v1::GenerateResponse;
using lede::v1::SpeculationMethod;

lede::v1::FinishReason FinishToProto(speculation::FinishReason f) {
  switch (f) {
    case speculation::FinishReason::kEos: return lede::v1::FINISH_REASON_EOS;
    case speculation::FinishReason::kStop: return lede::v1::FINISH_REASON_STOP;
    default: return lede::v1::FINISH_REASON_LENGTH;
  }
}

// Admitted requests: waiting for the model (ModelInfo, then a KV slot and
// the prefill) until the first token, then running.
class Occupancy {
 public:
  explicit Occupancy(telemetry::SpecDecodeMetrics* metrics) : m_(metrics) {
    if (m_) m_->num_requests_waiting.Increment();
  }
  Occupancy(const Occupancy&) = delete;
  Occupancy& operator=(const Occupancy&) = delete;
  ~Occupancy() {
    if (m_) (running_ ? m_->num_requests_running : m_->num_requests_waiting).Decrement();
  }
  void Run() {
    if (m_ && !running_) {
      m_->num_requests_waiting.Decrement();
      m_->num_requests_running.Increment();
    }
    running_ = true;
  }

 private:
  telemetry::SpecDecodeMetrics* m_;
  bool running_ = false;
};

// The last response of a stream: the request's GenerationSummary.
GenerateResponse SummaryResponse(const speculation::GenerationResult& result, const std::string& request_id,
                                 bool stopped) {
  const speculation::GenerationStats& st = result.stats;
  GenerateResponse r;
  lede::v1::GenerationSummary* s = r.mutable_summary();
  s->set_request_id(request_id);
  s->set_finish_reason(stopped ? lede::v1::FINISH_REASON_STOP : FinishToProto(result.finish));
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
  s->set_policy_version(result.policy_version);
  return r;
}

// A finished request's rounds and tokens in the Prometheus metrics.
void RecordMetrics(const speculation::GenerationStats& st, lede::v1::FinishReason finish,
                   telemetry::SpecDecodeMetrics* metrics) {
  telemetry::SpecDecodeMetrics& m = *metrics;
  for (const speculation::RoundRecord& round : st.rounds) {
    m.RecordRound(round.exit_layer, round.n_drafted, round.n_accepted, round.latency_s);
    if (round.over_max_load) m.load_disabled_rounds.Increment();
    // A round emits its tokens together: each gets the round's time per token.
    for (int32_t i = 0; i < round.n_emitted; ++i) m.inter_token_latency.Observe(round.latency_s / round.n_emitted);
  }
  m.prompt_tokens.Increment(static_cast<double>(st.n_prompt_tokens));
  m.RecordSuccess(finish == lede::v1::FINISH_REASON_LENGTH ? "length" : "stop");
  m.generation_tokens.Increment(static_cast<double>(st.n_generated));
  m.time_to_first_token.Observe(st.prefill_s);
}

}  // namespace

struct GenerationService::Impl {
  // One request, start to end (validation, the loop, the summary, metrics,
  // experience); runs on the request's worker thread.
  // `context` is null for in-process calls (the HTTP front end): no client
  // deadline, cancellation through the writer. `fill_max_tokens`: a
  // max_new_tokens of 0 means "up to the context window" (min of the limit
  // and capacity minus the prompt) instead of INVALID_ARGUMENT.
  Status Run(grpc::CallbackServerContext* context, const GenerateRequest* request, ResponseWriter* writer,
             bool fill_max_tokens = false);

  // The steps of Run(): the request after validation, the prompt ids (the
  // token ids given, or the prompt text encoded with BOS), the request id
  // (the client's, or a fresh "req-<hex>"), the loop's options.
  Status RunRequest(grpc::CallbackServerContext* context, const GenerateRequest& request, ResponseWriter* writer,
                    bool fill_max_tokens);
  StatusOr<std::vector<int32_t>> ResolvePrompt(const GenerateRequest& request) const;
  std::string RequestId(const GenerateRequest& request);
  speculation::LoopOptions LoopFor(const GenerateRequest& request, const CheckedRequest& checked,
                                   const lede::v1::ModelInfo& info, int64_t prompt_len) const;

  CoordinatorOptions options;
  // Run() for the gRPC front end (GenerateReactor).
  RequestRunner runner = [this](grpc::CallbackServerContext* context, const GenerateRequest* request,
                                ResponseWriter* writer) { return Run(context, request, writer); };
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  int64_t max_token_bytes = 0;  // tokenizer->MaxTokenBytes()
  rpc::ApiKeys api_keys;
  // lede_prompt_tokenized_bytes_total: prompt text bytes given to the
  // tokenizer (work that the size checks bound); null without a registry.
  telemetry::Counter* tokenized_bytes = nullptr;
  // The model replicas, with this instance's lease on each verifier.
  std::unique_ptr<ReplicaSet> replicas;
  // Requests running (both front ends) and the drain at shutdown.
  std::mutex drain_mu;
  std::condition_variable drained;
  int64_t in_flight = 0;   // guarded by drain_mu
  // in_flight, readable without the lock: the load the exit policies see
  // (LoopOptions::current_load).
  std::atomic<int32_t> load{0};
  bool draining = false;   // guarded by drain_mu
  std::unique_ptr<telemetry::SpecDecodeMetrics> metrics;
  std::unique_ptr<experience::ExperienceLogger> logger;
  std::unique_ptr<experience::ExperienceLogger> request_log;  // null when off
  telemetry::Counter* experience_written = nullptr;
  telemetry::Counter* experience_dropped = nullptr;

  // The model processes' measured step costs (request-log records).
  MeasuredCosts measured_costs;

  std::mutex info_mu;
  bool have_info = false;
  lede::v1::ModelInfo info;       // guarded by info_mu
  experience::RewardSpec rewards;     // guarded by info_mu
  std::mt19937_64 id_rng{std::random_device{}()};  // request ids; guarded by info_mu

  // The timeouts and the fallback of every model call (the stubs are the
  // chosen replica's: ReplicaBackend).
  ModelClients Clients() {
    ModelClients c;
    c.rpc_timeout = options.rpc_timeout;
    c.max_queue_wait = options.max_queue_wait;
    c.prefill_timeout = options.prefill_timeout;
    c.autoregressive_fallback = options.autoregressive_fallback;
    c.measured_costs = &measured_costs;
    return c;
  }

  // The served model's ModelInfo: fetched from the first replica that
  // answers on the first request, then kept (every replica and a restarted
  // verifier serve the same model).
  StatusOr<lede::v1::ModelInfo> Info(grpc::CallbackServerContext* server) {
    {
      std::lock_guard<std::mutex> lock(info_mu);
      if (have_info) return info;
    }
    lede::v1::ModelInfo fresh;
    Status described = UnavailableError("verifier Describe: no model replica is known yet");
    for (const std::shared_ptr<Replica>& replica : replicas->Candidates()) {
      auto ctx = ModelCallContext(server, options.rpc_timeout);
      grpc::Status s = replica->verifier()->Describe(ctx.get(), lede::v1::DescribeRequest(), &fresh);
      described = s.ok() ? OkStatus() : FromModelCall(s, "verifier " + replica->name() + " Describe");
      if (described.ok()) SeedMeasuredCosts(*replica, fresh, server);
      if (described.ok() || described.code() != StatusCode::kUnavailable) break;
    }
    if (!described.ok()) return described;
    std::lock_guard<std::mutex> lock(info_mu);
    info = fresh;
    have_info = true;
    const int32_t L = fresh.n_layers();
    const int32_t D = fresh.max_draft_length();
    if (options.reward == "paper" || fresh.draft_cost_size() != L + 1 ||
        fresh.verify_cost_size() != (L + 1) * (D + 1)) {
      rewards = experience::RewardSpec::Paper(L);
    } else {
      std::vector<double> draft_cost(fresh.draft_cost().begin(), fresh.draft_cost().end());
      std::vector<std::vector<double>> verify(L + 1);
      for (int32_t e = 0; e <= L; ++e) {
        for (int32_t k = 0; k <= D; ++k) verify[e].push_back(fresh.verify_cost(e * (D + 1) + k));
      }
      rewards = experience::RewardSpec::Throughput(fresh.cost_model(), draft_cost, verify, fresh.probe_cost());
    }
    return info;
  }

  // The step costs the model processes measured so far, from their
  // Describe: a coordinator that starts beside warm model processes has them
  // before the next response that carries a profile (at most one a second).
  // The drafter's Describe is best effort (its profile comes with drafts too).
  void SeedMeasuredCosts(Replica& replica, const lede::v1::ModelInfo& verifier_info,
                         grpc::CallbackServerContext* server) {
    measured_costs.SetPrior(PriorCostFeatures(verifier_info));
    if (verifier_info.measured_costs().time_us() > 0) measured_costs.UpdateVerifier(verifier_info.measured_costs());
    if (replica.drafter() == nullptr) return;
    lede::v1::ModelInfo drafter_info;
    auto ctx = ModelCallContext(server, options.rpc_timeout);
    if (replica.drafter()->Describe(ctx.get(), lede::v1::DescribeRequest(), &drafter_info).ok() &&
        drafter_info.measured_costs().time_us() > 0) {
      measured_costs.UpdateDrafter(drafter_info.measured_costs());
    }
  }

  // The request log's record of a finished request (docs/serving.md "Request log").
  void LogRequest(const GenerateRequest& request, const std::vector<int32_t>& prompt,
                  const speculation::GenerationResult& result, const std::string& request_id, int32_t start_load,
                  int64_t max_new_tokens) {
    if (!request_log || !experience::IsLoggedRequest(request.temperature())) return;
    lede::v1::RequestRecord r;
    r.set_request_id(request_id);
    r.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    r.mutable_output_token_ids()->Add(result.tokens.begin(), result.tokens.end());
    r.set_ended_on_eos(result.finish == speculation::FinishReason::kEos);
    r.set_max_new_tokens(max_new_tokens);
    r.set_temperature(request.temperature());
    r.set_top_p(request.top_p());
    r.set_seed(request.seed());
    r.set_method(speculation::SpeculationMethodName(request.method()));
    r.set_policy_version(result.policy_version);
    {
      std::lock_guard<std::mutex> lock(info_mu);
      r.set_model_fingerprint(info.model_fingerprint());
    }
    r.set_load(std::max(1, start_load));
    const speculation::GenerationStats& st = result.stats;
    r.set_prefill_us(static_cast<int64_t>(st.prefill_s * 1e6));
    r.set_decode_us(static_cast<int64_t>(st.decode_s * 1e6));
    r.set_rounds(static_cast<int64_t>(st.rounds.size()));
    r.set_drafted_tokens(st.n_drafted);
    r.set_accepted_tokens(st.n_accepted);
    r.set_time_us(absl::ToUnixMicros(absl::Now()));
    if (lede::v1::CostProfile costs; measured_costs.Current(&costs)) *r.mutable_measured_costs() = std::move(costs);
    request_log->Log(std::move(r));
  }

  // The experience log (and, with request_log, the request log beside it)
  // on options.experience_url, its counters feeding the metrics.
  Status OpenExperienceLog() {
    auto store = storage::OpenObjectStore(options.experience_url);
    if (!store.ok()) return InvalidArgumentError("experience_url: " + std::string(store.status().message()));
    experience::ExperienceLoggerOptions lo;
    lo.prefix = options.experience_prefix;
    lo.queue_capacity_records = options.experience_queue_records;
    lo.max_shard_age = options.experience_shard_age;
    lo.retention.max_total_bytes = options.experience_max_bytes;
    lo.retention.max_age = options.experience_max_age;
    if (options.experience_max_bytes > 0) {
      lo.max_shard_bytes = std::min<int64_t>(lo.max_shard_bytes, options.experience_max_bytes);
    }
    telemetry::SpecDecodeMetrics* m = metrics.get();
    if (m != nullptr) {
      auto last = std::make_shared<experience::ExperienceLoggerCounters>();
      auto mu = std::make_shared<std::mutex>();
      lo.on_counters = [m, last, mu](const experience::ExperienceLoggerCounters& c) {
        std::lock_guard<std::mutex> lock(*mu);
        m->experience_records_written.Increment(static_cast<double>(c.records_written - last->records_written));
        m->experience_records_dropped.Increment(
            static_cast<double>((c.records_dropped + c.records_lost) - (last->records_dropped + last->records_lost)));
        m->experience_shards_written.Increment(static_cast<double>(c.shards_written - last->shards_written));
        m->experience_shards_deleted.Increment(static_cast<double>(c.shards_deleted - last->shards_deleted));
        m->experience_bytes_deleted.Increment(static_cast<double>(c.bytes_deleted - last->bytes_deleted));
        m->experience_stale_temp_files_removed.Increment(
            static_cast<double>(c.stale_temp_files_removed - last->stale_temp_files_removed));
        *last = c;
      };
    }
    lo.on_put_error = [](const Status& error, int64_t unreported) {
      rpc::LogEvent("error", "experience_write_failed",
                    {{"error", std::string(error.message())}, {"earlier_failures_not_logged", std::to_string(unreported)}});
    };
    lo.on_put_recovered = [](const experience::PutRecovery& r) {
      rpc::LogEvent("info", "experience_write_recovered",
                    {{"shard", r.key}, {"failed_attempts", std::to_string(r.failed_attempts)},
                     {"shards_lost", std::to_string(r.shards_given_up)},
                     {"outage_s", std::to_string(absl::ToDoubleSeconds(r.outage))}});
    };
    const experience::ExperienceLoggerOptions request_log_options = lo;
    auto created = experience::ExperienceLogger::Create(
        std::shared_ptr<storage::ObjectStore>(std::move(*store)), std::move(lo));
    if (!created.ok()) return created.status();
    logger = std::move(*created);
    if (options.request_log) LEDE_RETURN_IF_ERROR(OpenRequestLog(request_log_options));
    const experience::ExperienceLoggerCounters c = logger->counters();
    if (c.stale_temp_files_removed > 0) {
      rpc::LogEvent("info", "experience_stale_temp_files_removed",
                    {{"files", std::to_string(c.stale_temp_files_removed)},
                     {"bytes", std::to_string(c.stale_temp_bytes_removed)},
                     {"store", options.experience_url}});
    }
    return OkStatus();
  }

  // The request log beside the experience shards: the experience logger's
  // options (store, retention, queue) with the request log's kind and prefix.
  Status OpenRequestLog(experience::ExperienceLoggerOptions lo) {
    auto store = storage::OpenObjectStore(options.experience_url);
    if (!store.ok()) return InvalidArgumentError("experience_url: " + std::string(store.status().message()));
    lo.prefix = options.request_log_prefix;
    lo.on_counters = nullptr;
    if (telemetry::SpecDecodeMetrics* m = metrics.get(); m != nullptr) {
      auto last = std::make_shared<experience::ExperienceLoggerCounters>();
      auto mu = std::make_shared<std::mutex>();
      lo.on_counters = [m, last, mu](const experience::ExperienceLoggerCounters& c) {
        std::lock_guard<std::mutex> lock(*mu);
        m->request_log_records_written.Increment(static_cast<double>(c.records_written - last->records_written));
        m->request_log_records_dropped.Increment(
            static_cast<double>((c.records_dropped + c.records_lost) - (last->records_dropped + last->records_lost)));
        *last = c;
      };
    }
    lo.on_put_error = [](const Status& error, int64_t unreported) {
      rpc::LogEvent("error", "request_log_write_failed",
                    {{"error", std::string(error.message())}, {"earlier_failures_not_logged", std::to_string(unreported)}});
    };
    lo.on_put_recovered = [](const experience::PutRecovery& r) {
      rpc::LogEvent("info", "request_log_write_recovered",
                    {{"shard", r.key}, {"failed_attempts", std::to_string(r.failed_attempts)},
                     {"shards_lost", std::to_string(r.shards_given_up)},
                     {"outage_s", std::to_string(absl::ToDoubleSeconds(r.outage))}});
    };
    auto log = experience::CreateRequestLog(std::shared_ptr<storage::ObjectStore>(std::move(*store)), std::move(lo));
    if (!log.ok()) return log.status();
    request_log = std::move(*log);
    return OkStatus();
  }

  void LogExperience(const speculation::GenerationResult& result, const std::string& request_id) {
    if (!logger) return;
    experience::RewardSpec spec;
    std::string fingerprint;
    {
      std::lock_guard<std::mutex> lock(info_mu);
      spec = rewards;
      fingerprint = info.model_fingerprint();
    }
    for (const speculation::RoundTrace& trace : result.traces) {
      for (const experience::Transition& t :
           experience::ToTransitions(trace, spec, request_id, result.policy_version, fingerprint)) {
        lede::v1::Transition record;
        experience::ToProto(t, &record);
        logger->Log(std::move(record));
      }
    }
  }
};

namespace {

// The options' own checks, before anything is opened. Errors:
// kInvalidArgument naming the option.
Status ValidateOptions(const CoordinatorOptions& options) {
  if (options.tokenizer_path.empty()) return InvalidArgumentError("tokenizer_path: required");
  if (options.reward != "throughput" && options.reward != "paper") {
    return InvalidArgumentError("reward: must be throughput or paper, got '" + options.reward + "'");
  }
  if (options.max_new_tokens_limit < 1) return InvalidArgumentError("max_new_tokens_limit: must be >= 1");
  if (options.speculation_max_load < 0) {
    return InvalidArgumentError("speculation_max_load: must be >= 0 (0 = no limit), got " +
                                std::to_string(options.speculation_max_load));
  }
  for (const std::string& key : options.api_keys) {
    if (key.empty()) return InvalidArgumentError("api_keys: an empty key");
  }
  return OkStatus();
}

// The channel arguments of every model-service channel.
grpc::ChannelArguments ModelChannelArgs(const CoordinatorOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  rpc::ApplyServerName(options.model_tls, &args);
  // Reconnect within about a second of a model process coming back
  // (gRPC's default backoff grows to 120 s; requests failed for ~19 s after
  // a restart). Loopback or in-cluster peers: retrying a
  // refused connection every second costs nothing.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

// The replica set's options: its targets (static, DNS, or the one
// verifier/drafter pair), channels, leases and the KV-slot gauges.
ReplicaSetOptions ReplicaOptions(const CoordinatorOptions& options,
                                 std::shared_ptr<grpc::ChannelCredentials> credentials,
                                 telemetry::SpecDecodeMetrics* metrics) {
  ReplicaSetOptions ro;
  if (telemetry::SpecDecodeMetrics* m = metrics) {
    ro.on_slots = [m](int64_t capacity, int64_t in_use) {  // the replicas' KV slots, as their leases report
      m->kv_slots_capacity.Set(static_cast<double>(capacity));
      m->kv_slots_in_use.Set(static_cast<double>(in_use));
    };
  }
  ro.targets = options.replicas;
  ro.dns_name = options.replica_dns;
  ro.verifier_port = options.replica_verifier_port;
  ro.drafter_port = options.replica_drafter_port;
  ro.refresh_interval = options.replica_refresh_interval;
  if (ro.targets.empty() && ro.dns_name.empty()) {
    ro.targets.push_back(ReplicaTarget{options.verifier_target, options.drafter_target});
  }
  ro.credentials = credentials;
  ro.token = options.internal_token;
  ro.channel_args = ModelChannelArgs(options);
  ro.lease.owner_name = options.instance_name;
  ro.lease.ttl = options.lease_ttl;
  ro.lease.renew_interval = options.lease_renew_interval;
  return ro;
}

}  // namespace

GenerationService::GenerationService() : impl_(std::make_unique<Impl>()) {}
GenerationService::~GenerationService() { (void)FlushExperience(); }

StatusOr<std::unique_ptr<GenerationService>> GenerationService::Create(const CoordinatorOptions& options,
                                                                       prometheus::Registry* registry) {
  LEDE_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<GenerationService> service(new GenerationService());
  Impl& impl = *service->impl_;
  impl.options = options;
  LEDE_ASSIGN_OR_RETURN(impl.tokenizer, tokenizer::LoadTokenizer(options.tokenizer_path));
  impl.max_token_bytes = impl.tokenizer->MaxTokenBytes();
  impl.api_keys = rpc::ApiKeys(options.api_keys);
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                        rpc::MakeChannelCredentials(options.model_tls, "model_tls"));
  if (registry != nullptr) {
    impl.metrics = std::make_unique<telemetry::SpecDecodeMetrics>(*registry);
    impl.measured_costs.SetMetrics(impl.metrics.get());
    impl.tokenized_bytes =
        &telemetry::UnlabelledCounter(*registry, "lede_prompt_tokenized_bytes_total",
                                      "Prompt text bytes given to the tokenizer (after the size checks)");
  }
  ReplicaSetOptions ro = ReplicaOptions(options, std::move(credentials), impl.metrics.get());
  // The leases' first renewals free a predecessor's sessions before the first request.
  LEDE_ASSIGN_OR_RETURN(impl.replicas, ReplicaSet::Create(std::move(ro)));
  if (!options.experience_url.empty()) LEDE_RETURN_IF_ERROR(impl.OpenExperienceLog());
  return service;
}

int64_t GenerationService::max_token_bytes() const { return impl_->max_token_bytes; }

Status GenerationService::FlushExperience() {
  Status requests = impl_->request_log ? impl_->request_log->Flush() : OkStatus();
  Status experience = impl_->logger ? impl_->logger->Flush() : OkStatus();
  return experience.ok() ? requests : experience;
}

Status GenerationService::Impl::Run(grpc::CallbackServerContext* context, const GenerateRequest* request,
                                    ResponseWriter* writer, bool fill_max_tokens) {
  const auto t0 = Clock::now();
  bool admitted = false;
  {
    std::lock_guard<std::mutex> lock(drain_mu);
    if (!draining) {
      ++in_flight;
      load.store(static_cast<int32_t>(in_flight), std::memory_order_relaxed);
      admitted = true;
    }
  }
  const Status status = admitted ? RunRequest(context, *request, writer, fill_max_tokens)
                                 : UnavailableError("the coordinator is shutting down; retry on another replica");
  if (admitted) {
    std::lock_guard<std::mutex> lock(drain_mu);
    if (--in_flight == 0) drained.notify_all();
    load.store(static_cast<int32_t>(in_flight), std::memory_order_relaxed);
  }
  if (metrics) {
    metrics->RecordRequest(speculation::SpeculationMethodName(request->method()), status.code(),
                           std::chrono::duration<double>(Clock::now() - t0).count());
  }
  if (!status.ok()) {
    rpc::LogEvent("info", "request_failed", {{"request_id", request->request_id()},
                                             {"code", telemetry::GrpcCodeName(status.code())},
                                             {"error", std::string(status.message())}});
  }
  return status;
}

Status GenerationService::Impl::RunRequest(grpc::CallbackServerContext* context, const GenerateRequest& request,
                                           ResponseWriter* writer, bool fill_max_tokens) {
  LEDE_ASSIGN_OR_RETURN(const CheckedRequest checked,
                        ValidateRequest(request, options.max_new_tokens_limit, fill_max_tokens));
  Occupancy occupancy(metrics.get());
  LEDE_ASSIGN_OR_RETURN(const lede::v1::ModelInfo info, Info(context));
  LEDE_RETURN_IF_ERROR(ValidateForModel(request, info));
  // Before tokenization: what cannot fit is rejected in O(1), so a huge
  // prompt costs no tokenizer time (request_validation.h).
  if (info.capacity() > 0) {
    LEDE_RETURN_IF_ERROR(ValidateRequestSize(request, RequestBounds{info.capacity(), max_token_bytes, info.context_window()}));
  }
  LEDE_ASSIGN_OR_RETURN(const std::vector<int32_t> prompt, ResolvePrompt(request));
  const std::string request_id = RequestId(request);
  const speculation::LoopOptions loop = LoopFor(request, checked, info, static_cast<int64_t>(prompt.size()));
  const int32_t start_load = load.load(std::memory_order_relaxed);
  ReplicaBackend backend(*replicas, Clients(), context, info, request, request_id, loop.record_traces);
  backend.set_position(static_cast<int64_t>(prompt.size()));

  // Text deltas: detokenized, held back while they could start a stop string.
  tokenizer::StreamingDetokenizer detok(*tokenizer, prompt.back());
  StopStringFilter stops({request.stop().begin(), request.stop().end()});
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
    std::string text;
    for (int32_t id : tokens) text += detok.Push(id);
    return send(stops.Push(text), tokens) && !stops.stopped();
  };
  LEDE_ASSIGN_OR_RETURN(const speculation::GenerationResult result,
                        speculation::RunGeneration(backend, prompt, loop, sink));
  if ((context != nullptr && context->IsCancelled()) || write_failed) {
    if (metrics) metrics->RecordSuccess("abort");
    if (context != nullptr && context->IsCancelled()) {
      return Status(StatusCode::kCancelled, "client cancelled the request");
    }
    return writer->WriteFailedStatus();
  }
  if (!stops.stopped()) {
    std::string rest = stops.Push(detok.Flush());
    if (!stops.stopped()) rest += stops.Flush();
    send(rest, {});
  }

  const GenerateResponse summary = SummaryResponse(result, request_id, stops.stopped());
  writer->Write(summary);
  if (metrics) RecordMetrics(result.stats, summary.summary().finish_reason(), metrics.get());
  LogExperience(result, request_id);
  LogRequest(request, prompt, result, request_id, start_load, loop.max_new_tokens);
  const speculation::GenerationStats& st = result.stats;
  rpc::LogEvent("info", "request_done",
                {{"request_id", request_id},
                 {"method", speculation::SpeculationMethodName(request.method())},
                 {"tokens", std::to_string(st.n_generated)},
                 {"acceptance_rate", std::to_string(st.acceptance_rate())},
                 {"tokens_per_s", std::to_string(st.decode_tokens_per_s())},
                 {"fallback", backend.fell_back() ? "true" : "false"}});
  return OkStatus();
}

StatusOr<std::vector<int32_t>> GenerationService::Impl::ResolvePrompt(const GenerateRequest& request) const {
  if (request.prompt_token_ids_size() > 0) {
    return std::vector<int32_t>(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  }
  if (tokenized_bytes != nullptr) tokenized_bytes->Increment(static_cast<double>(request.prompt().size()));
  auto encoded = tokenizer->Encode(request.prompt(), /*add_bos=*/true, /*add_eos=*/false);
  if (!encoded.ok()) return InvalidArgumentError("prompt: " + std::string(encoded.status().message()));
  return std::move(*encoded);
}

std::string GenerationService::Impl::RequestId(const GenerateRequest& request) {
  if (!request.request_id().empty()) return request.request_id();
  std::lock_guard<std::mutex> lock(info_mu);
  char buf[32];
  snprintf(buf, sizeof(buf), "req-%016llx", static_cast<unsigned long long>(id_rng()));
  return buf;
}

speculation::LoopOptions GenerationService::Impl::LoopFor(const GenerateRequest& request,
                                                          const CheckedRequest& checked,
                                                          const lede::v1::ModelInfo& info,
                                                          int64_t prompt_len) const {
  speculation::LoopOptions loop;
  loop.max_new_tokens = request.max_new_tokens();
  if (checked.auto_max_tokens) {
    loop.max_new_tokens =
        std::max<int64_t>(1, std::min<int64_t>(options.max_new_tokens_limit, info.capacity() - prompt_len));
  }
  const SpeculationMethod method = request.method();
  loop.mode = speculation::LoopMode(speculation::MethodFromProto(method).value_or(speculation::SpeculationMethod::kLede));
  loop.session.sampling.temperature = request.temperature();
  loop.session.sampling.top_p = checked.top_p;
  loop.session.sampling.seed = request.seed();
  loop.record_traces = logger != nullptr && loop.mode == speculation::SpeculationMode::kAdaptive;
  loop.current_load = [this] { return load.load(std::memory_order_relaxed); };
  loop.current_cost = [this] { return measured_costs.Features(); };
  loop.speculation_max_load = options.speculation_max_load;
  return loop;
}

Status GenerationService::GenerateInProcess(const GenerateRequest& request,
                                            const std::function<bool(const GenerateResponse&)>& on_response,
                                            bool fill_max_tokens) {
  CallbackWriter writer(on_response);
  return impl_->Run(nullptr, &request, &writer, fill_max_tokens);
}

bool GenerationService::Drain(absl::Duration grace) {
  std::unique_lock<std::mutex> lock(impl_->drain_mu);
  impl_->draining = true;
  rpc::LogEvent("info", "draining", {{"in_flight", std::to_string(impl_->in_flight)},
                                     {"grace_s", std::to_string(absl::ToDoubleSeconds(grace))}});
  const bool done = impl_->drained.wait_for(lock, absl::ToChronoMilliseconds(grace), [&] { return impl_->in_flight == 0; });
  rpc::LogEvent(done ? "info" : "warn", "drained", {{"in_flight", std::to_string(impl_->in_flight)}});
  return done;
}

bool GenerationService::draining() const {
  std::lock_guard<std::mutex> lock(impl_->drain_mu);
  return impl_->draining;
}

Status GenerationService::Readiness(absl::Duration timeout) {
  if (draining()) return UnavailableError("draining: the coordinator is shutting down");
  return CheckModelServices(timeout);
}

Status GenerationService::CheckModelServices(absl::Duration timeout) {
  // Ready while any replica's verifier and drafter both connect.
  const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
  std::string down;
  for (const std::shared_ptr<Replica>& replica : impl_->replicas->All()) {
    if (replica->Connected(deadline)) return OkStatus();
    down += (down.empty() ? "" : ", ") + replica->target().verifier +
            (replica->target().drafter == replica->target().verifier ? "" : "+" + replica->target().drafter);
  }
  return UnavailableError(down.empty() ? "no model replica is known yet"
                                       : "no model replica is reachable (verifier+drafter: " + down + ")");
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::Generate(grpc::CallbackServerContext* context,
                                                                       const grpc::ByteBuffer* raw) {
  auto reject = [&](const Status& status) {
    if (impl_->metrics) impl_->metrics->RecordRequest("unknown", status.code(), 0.0);
    rpc::LogEvent("info", "request_failed", {{"code", telemetry::GrpcCodeName(status.code())},
                                             {"error", std::string(status.message())}});
    return new RejectReactor(rpc::ToGrpcStatus(status));
  };
  // The API key first, before the request is even copied (never logged).
  if (!impl_->api_keys.empty()) {
    const auto& metadata = context->client_metadata();
    const auto it = metadata.find("authorization");
    const std::string_view presented =
        it == metadata.end() ? std::string_view() : std::string_view(it->second.data(), it->second.size());
    if (!impl_->api_keys.Allows(presented)) {
      return reject(Status(StatusCode::kUnauthenticated,
                           it == metadata.end() ? "authorization: missing (want \"Bearer <API key>\" metadata)"
                                                : "authorization: not a valid API key"));
    }
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (raw->Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
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
  return new GenerateReactor(impl_->runner, context, std::move(request));
}

}  // namespace lede::coordinator
