#include "services/coordinator/coordinator_flags.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/coordinator/request_validation.h"
#include "services/coordinator/session_lease.h"
#include "shared/flags/flags.h"
#include "shared/rpc/security.h"
#include "shared/tokenizer/model_files.h"

namespace lede::coordinator {

CoordinatorFlags::CoordinatorFlags() {
  server.listen = "127.0.0.1:50051";
  server.metrics = "127.0.0.1:9401";
  http.listen_address = "127.0.0.1:8000";
  http.model_id.clear();
  replica_refresh_s = absl::ToDoubleSeconds(options.replica_refresh_interval);
  replica_verifier_port = options.replica_verifier_port;
  replica_drafter_port = options.replica_drafter_port;
  max_new_tokens_limit = options.max_new_tokens_limit;
  rpc_timeout_s = absl::ToDoubleSeconds(options.rpc_timeout);
  queue_wait_s = absl::ToDoubleSeconds(options.max_queue_wait);
  prefill_timeout_s = absl::ToDoubleSeconds(options.prefill_timeout);
  shard_age_s = absl::ToDoubleSeconds(options.experience_shard_age);
  lease_ttl_s = absl::ToDoubleSeconds(options.lease_ttl);
  speculation_max_load = options.speculation_max_load;
  http_threads = http.threads;
  http_max_connections = http.max_connections;
  http_max_per_client = http.max_connections_per_client;
  http_deadline_s = absl::ToDoubleSeconds(http.request_deadline);
  http_listen_backlog = http.listen_backlog;
  http_idle_worker_s = absl::ToDoubleSeconds(http.idle_worker_timeout);
}

void AddCoordinatorFlags(flags::FlagSet* flags, CoordinatorFlags* v) {
  CoordinatorOptions& o = v->options;
  flags->Add("model", &v->model, "served model directory (its tokenizer is used)", true);
  flags->Add("tokenizer", &o.tokenizer_path, "tokenizer file (default: found beside --model)");
  flags->Add("verifier", &o.verifier_target, "verifier address host:port");
  flags->Add("drafter", &o.drafter_target, "drafter address host:port (= --verifier when co-located)");
  flags->Add("replicas", &v->replicas,
             "several model replicas instead of --verifier/--drafter: VERIFIER[+DRAFTER],... (host:port each; "
             "one address = co-located)");
  flags->Add("replica-dns", &o.replica_dns,
             "DNS name whose addresses are model replicas (a Kubernetes headless Service), re-resolved periodically");
  flags->Add("replica-verifier-port", &v->replica_verifier_port, "--replica-dns: the verifiers' port");
  flags->Add("replica-drafter-port", &v->replica_drafter_port, "--replica-dns: the drafters' port (0 = co-located)");
  flags->Add("replica-refresh-s", &v->replica_refresh_s, "--replica-dns: seconds between resolutions");
  flags->Add("http", &v->http.listen_address, "HTTP address of the OpenAI-compatible API; empty = none");
  flags->Add("served-model-name", &v->http.model_id,
             "model id of the OpenAI API (default: the --model directory's name)");
  flags->Add("http-threads", &v->http_threads, "HTTP worker threads kept (more start on demand)");
  flags->Add("http-idle-worker-s", &v->http_idle_worker_s,
             "an HTTP worker beyond --http-threads with no connection for this long exits");
  flags->Add("http-listen-backlog", &v->http_listen_backlog,
             "connections the kernel queues before the HTTP API accepts them (capped by net.core.somaxconn)");
  flags->Add("http-max-connections", &v->http_max_connections, "open HTTP connections at once; more get 503");
  flags->Add("http-max-connections-per-client", &v->http_max_per_client,
             "open HTTP connections from one client address; more get 503");
  flags->Add("http-request-deadline-s", &v->http_deadline_s,
             "seconds for a request's line, headers and body (and a kept-alive connection's idle gap)");
  flags->Add("max-new-tokens-limit", &v->max_new_tokens_limit, "largest max_new_tokens a request may ask for");
  flags->Add("rpc-timeout-s", &v->rpc_timeout_s, "deadline of each call to a model process");
  flags->Add("max-queue-wait-s", &v->queue_wait_s,
             "how long a request may wait in the verifier's queue for a free KV slot (then 429 / RESOURCE_EXHAUSTED)");
  flags->Add("prefill-timeout-s", &v->prefill_timeout_s,
             "how long a prompt's prefill may take once it has a KV slot, when its client set no deadline");
  flags->Add("speculation-max-load", &v->speculation_max_load,
             "requests in flight (running and queued) above which speculative requests decode "
             "autoregressively, round by round (0 = no limit; vLLM's --speculative-disable-by-batch-size)");
  flags->Add("autoregressive-fallback", &o.autoregressive_fallback,
             "serve full-depth steps when the drafter is down instead of failing");
  flags->Add("experience", &o.experience_url,
             "object store for experience: a directory, file:///dir or s3://bucket/prefix?endpoint=...");
  flags->Add("experience-prefix", &o.experience_prefix, "key prefix of experience shards in the store");
  flags->Add("experience-shard-age-s", &v->shard_age_s, "publish a shard at least this often");
  flags->Add("experience-max-bytes", &o.experience_max_bytes,
             "retention: delete the oldest experience shards beyond this many bytes (0 = keep all)");
  flags->Add("experience-max-age-h", &v->max_age_h,
             "retention: delete experience shards older than this many hours (0 = keep all)");
  flags->Add("request-log", &o.request_log,
             "log finished greedy requests (users' prompt and output token ids) beside the experience; false: off");
  flags->Add("reward", &o.reward, "rewards of logged transitions: throughput | paper");
  // Bounded input and the security of the public API (docs/security.md).
  flags->Add("max-context-tokens", &v->context_tokens,
             "context window that sizes the request limits (0 = the model's config)");
  flags->Add("max-request-bytes", &v->max_request_bytes, "largest gRPC request message (0 = sized to the context)");
  flags->Add("http-max-body-bytes", &v->max_body_bytes, "largest HTTP request body (0 = sized to the context)");
  flags->Add("api-key-file", &v->api_key_file, "API keys of the public APIs, one per line (also $LEDE_API_KEYS)");
  rpc::ServerFlagHelp help;
  help.listen = "gRPC address of the public API";
  help.metrics = "HTTP address of /metrics";
  help.shutdown_grace = "how long in-flight requests may finish after SIGTERM";
  help.tls_served = "the public gRPC API and the OpenAI HTTP API (HTTPS)";
  help.internal_token = "sent on every call to the model services";
  rpc::AddServerFlags(flags, &v->server, help);
  rpc::AddChannelTlsFlags(flags, "model-tls", "the model services", &o.model_tls);
  flags->Add("instance-name", &v->instance_name,
             "stable name across restarts: a restart frees its predecessor's KV sessions at once "
             "(auto = host name + --listen when its port is fixed; empty = none)");
  flags->Add("session-lease-ttl-s", &v->lease_ttl_s,
             "the verifier frees this coordinator's sessions this long after it dies");
}

namespace {

// The OpenAI API's options (only checked when it is on).
Status FinishHttpFlags(CoordinatorFlags* v) {
  OpenAiServerOptions& http = v->http;
  if (http.model_id.empty()) {
    std::filesystem::path p = std::filesystem::path(v->model).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    http.model_id = p.filename().string();
    if (http.model_id.empty()) http.model_id = "lede";
  }
  http.threads = static_cast<int>(v->http_threads);
  if (v->http_max_connections < 1 || v->http_max_per_client < 1 || !(v->http_deadline_s > 0)) {
    return InvalidArgumentError(
        "--http-max-connections, --http-max-connections-per-client and --http-request-deadline-s must be positive");
  }
  if (v->http_listen_backlog < 1 || v->http_listen_backlog > (1 << 20)) {
    return InvalidArgumentError("--http-listen-backlog " + std::to_string(v->http_listen_backlog) +
                                ": must be in [1, 1048576]");
  }
  if (!(v->http_idle_worker_s > 0) || v->http_idle_worker_s > 86400) {
    return InvalidArgumentError(absl::StrCat("--http-idle-worker-s ", v->http_idle_worker_s) +
                                ": must be in (0, 86400]");
  }
  http.listen_backlog = static_cast<int>(v->http_listen_backlog);
  http.idle_worker_timeout = absl::Seconds(v->http_idle_worker_s);
  http.max_connections = static_cast<int>(std::min<int64_t>(v->http_max_connections, 1 << 16));
  http.max_connections_per_client = static_cast<int>(std::min<int64_t>(v->http_max_per_client, 1 << 16));
  http.request_deadline = absl::Seconds(v->http_deadline_s);
  return OkStatus();
}

}  // namespace

Status FinishCoordinatorFlags(CoordinatorFlags* v) {
  CoordinatorOptions& o = v->options;
  StatusOr<rpc::InternalToken> token = rpc::InternalToken::LoadIfSet(v->server.internal_token_file);
  if (!token.ok()) return token.status();
  o.internal_token = *std::move(token);
  if (!v->replicas.empty()) {
    auto targets = ParseReplicaTargets(v->replicas);
    if (!targets.ok()) return InvalidArgumentError("--" + std::string(targets.status().message()));
    o.replicas = *targets;
  }
  if (!(v->replica_refresh_s > 0) || v->replica_verifier_port < 1 || v->replica_verifier_port > 65535 ||
      v->replica_drafter_port < 0 || v->replica_drafter_port > 65535) {
    return InvalidArgumentError(
        "--replica-refresh-s must be > 0, --replica-verifier-port in 1..65535, --replica-drafter-port in 0..65535");
  }
  o.replica_refresh_interval = absl::Seconds(v->replica_refresh_s);
  o.replica_verifier_port = static_cast<int>(v->replica_verifier_port);
  o.replica_drafter_port = static_cast<int>(v->replica_drafter_port);
  o.max_new_tokens_limit = v->max_new_tokens_limit;
  if (v->speculation_max_load < 0 || v->speculation_max_load > (int64_t{1} << 30)) {
    return InvalidArgumentError("--speculation-max-load must be in [0, 2^30] (0 = no limit), got " +
                                std::to_string(v->speculation_max_load));
  }
  o.speculation_max_load = static_cast<int32_t>(v->speculation_max_load);
  if (!(v->rpc_timeout_s > 0) || !(v->prefill_timeout_s > 0) || !(v->queue_wait_s >= 0)) {
    return InvalidArgumentError("--rpc-timeout-s and --prefill-timeout-s must be > 0 and --max-queue-wait-s >= 0, got " +
                                absl::StrCat(v->rpc_timeout_s, ", ", v->prefill_timeout_s, " and ", v->queue_wait_s));
  }
  o.rpc_timeout = absl::Seconds(v->rpc_timeout_s);
  o.max_queue_wait = absl::Seconds(v->queue_wait_s);
  o.prefill_timeout = absl::Seconds(v->prefill_timeout_s);
  o.experience_shard_age = absl::Seconds(v->shard_age_s);
  o.lease_ttl = absl::Seconds(v->lease_ttl_s);
  o.instance_name = v->instance_name == "auto" ? DefaultInstanceName(v->server.listen) : v->instance_name;
  if (o.experience_max_bytes < 0 || !(v->max_age_h >= 0)) {
    return InvalidArgumentError("--experience-max-bytes and --experience-max-age-h must not be negative");
  }
  o.experience_max_age = absl::Hours(v->max_age_h);
  if (o.tokenizer_path.empty()) {
    auto found = tokenizer::FindTokenizerFile(v->model);
    if (!found.ok()) return Status(found.status().code(), "--model: " + std::string(found.status().message()));
    o.tokenizer_path = *found;
  }
  const char* env_keys = std::getenv("LEDE_API_KEYS");
  auto keys = rpc::ApiKeys::Load(v->api_key_file, env_keys == nullptr ? "" : env_keys);
  if (!keys.ok()) return keys.status();
  o.api_keys = keys->keys();
  if (v->context_tokens <= 0) {
    auto window = ReadContextWindow(v->model);
    if (!window.ok()) {
      return Status(window.status().code(), "--max-context-tokens: " + std::string(window.status().message()));
    }
    v->context_tokens = *window;
  }
  v->http.api_keys = o.api_keys;
  v->http.tls_cert_path = v->server.tls.cert_path;
  v->http.tls_key_path = v->server.tls.key_path;
  if (!v->http.listen_address.empty()) return FinishHttpFlags(v);
  return OkStatus();
}

}  // namespace lede::coordinator
