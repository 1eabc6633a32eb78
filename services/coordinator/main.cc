// lede-coordinator: the public lede.v1.Generation API
// (services/coordinator/coordinator.h). Never links libtorch.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "services/coordinator/chat_prompt.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/openai_server.h"
#include "services/coordinator/request_validation.h"
#include "services/coordinator/session_lease.h"
#include "shared/flags/flags.h"
#include "shared/rpc/server.h"
#include "shared/telemetry/metrics.h"
#include "shared/tokenizer/model_files.h"

namespace {

int Run(const std::vector<std::string>& raw_args) {
  lede::coordinator::CoordinatorOptions o;
  std::string model, listen = "127.0.0.1:50051", metrics = "127.0.0.1:9401";
  int64_t limit = o.max_new_tokens_limit;
  double grace_s = 10;
  lede::coordinator::OpenAiServerOptions http;
  http.listen_address = "127.0.0.1:8000";
  http.model_id.clear();
  int64_t http_threads = http.threads;
  lede::flags::FlagSet flags;
  flags.Add("model", &model, "served model directory (its tokenizer is used)", true);
  flags.Add("tokenizer", &o.tokenizer_path, "tokenizer file (default: found beside --model)");
  flags.Add("verifier", &o.verifier_target, "verifier address host:port");
  flags.Add("drafter", &o.drafter_target, "drafter address host:port (= --verifier when co-located)");
  std::string replicas;
  double replica_refresh_s = absl::ToDoubleSeconds(o.replica_refresh_interval);
  int64_t replica_verifier_port = o.replica_verifier_port, replica_drafter_port = o.replica_drafter_port;
  flags.Add("replicas", &replicas,
            "several model replicas instead of --verifier/--drafter: VERIFIER[+DRAFTER],... (host:port each; "
            "one address = co-located)");
  flags.Add("replica-dns", &o.replica_dns,
            "DNS name whose addresses are model replicas (a Kubernetes headless Service), re-resolved periodically");
  flags.Add("replica-verifier-port", &replica_verifier_port, "--replica-dns: the verifiers' port");
  flags.Add("replica-drafter-port", &replica_drafter_port, "--replica-dns: the drafters' port (0 = co-located)");
  flags.Add("replica-refresh-s", &replica_refresh_s, "--replica-dns: seconds between resolutions");
  flags.Add("listen", &listen, "gRPC address of the public API");
  flags.Add("metrics", &metrics, "HTTP address of /metrics");
  flags.Add("http", &http.listen_address, "HTTP address of the OpenAI-compatible API; empty = none");
  flags.Add("served-model-name", &http.model_id,
            "model id of the OpenAI API (default: the --model directory's name)");
  flags.Add("http-threads", &http_threads, "HTTP worker threads started up front (more start on demand)");
  int64_t http_max_connections = http.max_connections, http_max_per_client = http.max_connections_per_client;
  double http_deadline_s = absl::ToDoubleSeconds(http.request_deadline);
  flags.Add("http-max-connections", &http_max_connections, "open HTTP connections at once; more get 503");
  flags.Add("http-max-connections-per-client", &http_max_per_client,
            "open HTTP connections from one client address; more get 503");
  flags.Add("http-request-deadline-s", &http_deadline_s,
            "seconds for a request's line, headers and body (and a kept-alive connection's idle gap)");
  flags.Add("max-new-tokens-limit", &limit, "largest max_new_tokens a request may ask for");
  double rpc_timeout_s = absl::ToDoubleSeconds(o.rpc_timeout);
  double shard_age_s = absl::ToDoubleSeconds(o.experience_shard_age);
  flags.Add("rpc-timeout-s", &rpc_timeout_s, "deadline of each call to a model process");
  double queue_wait_s = absl::ToDoubleSeconds(o.max_queue_wait);
  flags.Add("max-queue-wait-s", &queue_wait_s,
            "how long a request may wait for a free KV slot when its client set no deadline");
  int64_t speculation_max_load = o.speculation_max_load;
  flags.Add("speculation-max-load", &speculation_max_load,
            "requests in flight (running and queued) above which speculative requests decode "
            "autoregressively, round by round (0 = no limit; vLLM's --speculative-disable-by-batch-size)");
  flags.Add("autoregressive-fallback", &o.autoregressive_fallback,
            "serve full-depth steps when the drafter is down instead of failing");
  flags.Add("experience", &o.experience_url,
            "object store for experience: a directory, file:///dir or s3://bucket/prefix?endpoint=...");
  flags.Add("experience-prefix", &o.experience_prefix, "key prefix of experience shards in the store");
  flags.Add("experience-shard-age-s", &shard_age_s, "publish a shard at least this often");
  double max_age_h = 0;
  flags.Add("experience-max-bytes", &o.experience_max_bytes,
            "retention: delete the oldest experience shards beyond this many bytes (0 = keep all)");
  flags.Add("experience-max-age-h", &max_age_h,
            "retention: delete experience shards older than this many hours (0 = keep all)");
  flags.Add("reward", &o.reward, "rewards of logged transitions: throughput | paper");
  flags.Add("shutdown-grace-s", &grace_s, "how long in-flight requests may finish after SIGTERM");
  // Issue 17: bounded input and the security of the public API (docs/security.md).
  int64_t context_tokens = 0, max_request_bytes = 0, max_body_bytes = 0;
  flags.Add("max-context-tokens", &context_tokens,
            "context window that sizes the request limits (0 = the model's config)");
  flags.Add("max-request-bytes", &max_request_bytes, "largest gRPC request message (0 = sized to the context)");
  flags.Add("http-max-body-bytes", &max_body_bytes, "largest HTTP request body (0 = sized to the context)");
  lede::rpc::ServerTlsOptions tls;
  lede::rpc::AddServerTlsFlags(&flags, &tls, "the public gRPC API and the OpenAI HTTP API (HTTPS)");
  std::string api_key_file;
  flags.Add("api-key-file", &api_key_file, "API keys of the public APIs, one per line (also $LEDE_API_KEYS)");
  lede::rpc::AddChannelTlsFlags(&flags, "model-tls", "the model services", &o.model_tls);
  std::string token_file;
  lede::rpc::AddInternalTokenFlag(&flags, &token_file, "sent on every call to the model services");
  std::string instance_name = "auto";
  double lease_ttl_s = absl::ToDoubleSeconds(o.lease_ttl);
  flags.Add("instance-name", &instance_name,
            "stable name across restarts: a restart frees its predecessor's KV sessions at once "
            "(auto = host name + --listen when its port is fixed; empty = none)");
  flags.Add("session-lease-ttl-s", &lease_ttl_s, "the verifier frees this coordinator's sessions this long after it dies");
  if (lede::flags::WantsHelp(raw_args)) {
    std::cout << "usage: lede-coordinator --model DIR [--config FILE] [flags]\n" << flags.Usage();
    return 0;
  }
  auto args = lede::flags::ExpandConfigFile(raw_args);
  lede::Status parsed = args.ok() ? flags.Parse(*args) : args.status();
  if (parsed.ok()) {
    auto token = lede::rpc::InternalToken::LoadIfSet(token_file);
    if (token.ok()) o.internal_token = *std::move(token);
    parsed = token.status();
  }
  if (!parsed.ok()) {
    std::cerr << "lede-coordinator: " << parsed.message() << "\n";
    return 2;
  }
  if (!replicas.empty()) {
    auto targets = lede::coordinator::ParseReplicaTargets(replicas);
    if (!targets.ok()) {
      std::cerr << "lede-coordinator: --" << targets.status().message() << "\n";
      return 2;
    }
    o.replicas = *targets;
  }
  if (!(replica_refresh_s > 0) || replica_verifier_port < 1 || replica_verifier_port > 65535 ||
      replica_drafter_port < 0 || replica_drafter_port > 65535) {
    std::cerr << "lede-coordinator: --replica-refresh-s must be > 0, --replica-verifier-port in 1..65535, "
                 "--replica-drafter-port in 0..65535\n";
    return 2;
  }
  o.replica_refresh_interval = absl::Seconds(replica_refresh_s);
  o.replica_verifier_port = static_cast<int>(replica_verifier_port);
  o.replica_drafter_port = static_cast<int>(replica_drafter_port);
  o.max_new_tokens_limit = limit;
  if (speculation_max_load < 0 || speculation_max_load > (int64_t{1} << 30)) {
    std::cerr << "lede-coordinator: --speculation-max-load must be in [0, 2^30] (0 = no limit), got "
              << speculation_max_load << "\n";
    return 2;
  }
  o.speculation_max_load = static_cast<int32_t>(speculation_max_load);
  o.rpc_timeout = absl::Seconds(rpc_timeout_s);
  o.max_queue_wait = absl::Seconds(queue_wait_s);
  o.experience_shard_age = absl::Seconds(shard_age_s);
  o.lease_ttl = absl::Seconds(lease_ttl_s);
  o.instance_name = instance_name == "auto" ? lede::coordinator::DefaultInstanceName(listen) : instance_name;
  if (o.experience_max_bytes < 0 || !(max_age_h >= 0)) {
    std::cerr << "lede-coordinator: --experience-max-bytes and --experience-max-age-h must not be negative\n";
    return 2;
  }
  o.experience_max_age = absl::Hours(max_age_h);
  if (o.tokenizer_path.empty()) {
    auto found = lede::tokenizer::FindTokenizerFile(model);
    if (!found.ok()) {
      std::cerr << "lede-coordinator: --model: " << found.status().message() << "\n";
      return 2;
    }
    o.tokenizer_path = *found;
  }
  const char* env_keys = std::getenv("LEDE_API_KEYS");
  auto keys = lede::rpc::ApiKeys::Load(api_key_file, env_keys == nullptr ? "" : env_keys);
  if (!keys.ok()) {
    std::cerr << "lede-coordinator: " << keys.status().message() << "\n";
    return 2;
  }
  if (context_tokens <= 0) {
    auto window = lede::coordinator::ReadContextWindow(model);
    if (!window.ok()) {
      std::cerr << "lede-coordinator: --max-context-tokens: " << window.status().message() << "\n";
      return 2;
    }
    context_tokens = *window;
  }
  lede::rpc::BlockTerminationSignals();
  lede::telemetry::Registry registry;
  o.api_keys = keys->keys();
  auto service = lede::coordinator::GenerationService::Create(o, &registry);
  if (!service.ok()) {
    std::cerr << "lede-coordinator: " << service.status().message() << "\n";
    return 2;
  }
  const lede::coordinator::RequestBounds bounds{context_tokens, (*service)->max_token_bytes()};
  if (max_request_bytes <= 0) max_request_bytes = lede::coordinator::MaxRequestMessageBytes(bounds);
  if (max_body_bytes <= 0) max_body_bytes = lede::coordinator::MaxHttpBodyBytes(bounds);
  http.max_body_bytes = static_cast<size_t>(max_body_bytes);
  http.api_keys = o.api_keys;
  http.tls_cert_path = tls.cert_path;
  http.tls_key_path = tls.key_path;
  lede::rpc::LogEvent("info", "request_limits",
                      {{"context_tokens", std::to_string(context_tokens)},
                       {"max_token_bytes", std::to_string(bounds.max_token_bytes)},
                       {"max_request_bytes", std::to_string(max_request_bytes)},
                       {"http_max_body_bytes", std::to_string(max_body_bytes)},
                       {"api_keys", std::to_string(o.api_keys.size())}});
  std::unique_ptr<lede::coordinator::OpenAiServer> openai;
  if (!http.listen_address.empty()) {
    if (http.model_id.empty()) {
      std::filesystem::path p = std::filesystem::path(model).lexically_normal();
      if (p.filename().empty()) p = p.parent_path();
      http.model_id = p.filename().string();
      if (http.model_id.empty()) http.model_id = "lede";
    }
    http.threads = static_cast<int>(http_threads);
    if (http_max_connections < 1 || http_max_per_client < 1 || !(http_deadline_s > 0)) {
      std::cerr << "lede-coordinator: --http-max-connections, --http-max-connections-per-client and "
                   "--http-request-deadline-s must be positive\n";
      return 2;
    }
    http.max_connections = static_cast<int>(std::min<int64_t>(http_max_connections, 1 << 16));
    http.max_connections_per_client = static_cast<int>(std::min<int64_t>(http_max_per_client, 1 << 16));
    http.request_deadline = absl::Seconds(http_deadline_s);
    std::string chat_format;
    lede::coordinator::ChatPromptRenderer render_chat = lede::coordinator::ChatRendererFor(model, &chat_format);
    lede::rpc::LogEvent(chat_format.rfind("plain (the chat template", 0) == 0 ? "warn" : "info", "chat_format",
                        {{"model", model}, {"using", chat_format}});
    auto started = lede::coordinator::OpenAiServer::Start(service->get(), &registry, http, std::move(render_chat));
    if (!started.ok()) {
      std::cerr << "lede-coordinator: --http: " << started.status().message() << "\n";
      return 1;
    }
    openai = std::move(*started);
    lede::rpc::LogEvent("info", "openai_api_listening",
                        {{"port", std::to_string(openai->port())}, {"model", http.model_id}});
  }
  lede::rpc::ServerRunner runner("coordinator");
  runner.AddService(service->get());
  lede::rpc::ServerOptions so;
  so.listen_address = listen;
  so.metrics_address = metrics;
  so.shutdown_grace = absl::Seconds(grace_s);
  so.max_receive_message_bytes = static_cast<int>(std::min<int64_t>(max_request_bytes, INT32_MAX));
  so.tls = tls;
  // Ready = serving: not draining, and the verifier and drafter answer.
  so.readiness = [&service] { return (*service)->Readiness(absl::Milliseconds(300)); };
  // In-flight requests finish (or are cancelled after the grace period).
  // On SIGTERM: drain both APIs (new requests UNAVAILABLE) before the
  // servers stop; scripts/run and the Kubernetes preStop hook stop the model
  // services only after this process exits.
  if (!runner.Serve(so, &registry, [&] { (*service)->Drain(so.shutdown_grace); }).ok()) return 1;
  openai.reset();  // cancels HTTP streams still running after the grace period
  lede::Status flushed = (*service)->FlushExperience();
  lede::rpc::LogEvent(flushed.ok() ? "info" : "warn", "experience_flushed", {{"status", flushed.ToString()}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(std::vector<std::string>(argv + 1, argv + argc)); }
