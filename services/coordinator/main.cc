// lede-coordinator: the public lede.v1.Generation API
// (services/coordinator/coordinator.h). Never links libtorch.
#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "services/coordinator/chat_prompt.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/openai_server.h"
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
  flags.Add("listen", &listen, "gRPC address of the public API");
  flags.Add("metrics", &metrics, "HTTP address of /metrics");
  flags.Add("http", &http.listen_address, "HTTP address of the OpenAI-compatible API; empty = none");
  flags.Add("served-model-name", &http.model_id,
            "model id of the OpenAI API (default: the --model directory's name)");
  flags.Add("http-threads", &http_threads, "HTTP worker threads (most concurrent HTTP requests)");
  flags.Add("max-new-tokens-limit", &limit, "largest max_new_tokens a request may ask for");
  double rpc_timeout_s = absl::ToDoubleSeconds(o.rpc_timeout);
  double shard_age_s = absl::ToDoubleSeconds(o.experience_shard_age);
  flags.Add("rpc-timeout-s", &rpc_timeout_s, "deadline of each call to a model process");
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
  if (lede::flags::WantsHelp(raw_args)) {
    std::cout << "usage: lede-coordinator --model DIR [--config FILE] [flags]\n" << flags.Usage();
    return 0;
  }
  auto args = lede::flags::ExpandConfigFile(raw_args);
  lede::Status parsed = args.ok() ? flags.Parse(*args) : args.status();
  if (!parsed.ok()) {
    std::cerr << "lede-coordinator: " << parsed.message() << "\n";
    return 2;
  }
  o.max_new_tokens_limit = limit;
  o.rpc_timeout = absl::Seconds(rpc_timeout_s);
  o.experience_shard_age = absl::Seconds(shard_age_s);
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
  lede::rpc::BlockTerminationSignals();
  lede::telemetry::Registry registry;
  auto service = lede::coordinator::GenerationService::Create(o, &registry);
  if (!service.ok()) {
    std::cerr << "lede-coordinator: " << service.status().message() << "\n";
    return 2;
  }
  std::unique_ptr<lede::coordinator::OpenAiServer> openai;
  if (!http.listen_address.empty()) {
    if (http.model_id.empty()) {
      std::filesystem::path p = std::filesystem::path(model).lexically_normal();
      if (p.filename().empty()) p = p.parent_path();
      http.model_id = p.filename().string();
      if (http.model_id.empty()) http.model_id = "lede";
    }
    http.threads = static_cast<int>(http_threads);
    if (lede::coordinator::HasChatTemplate(model)) {
      lede::rpc::LogEvent("warn", "chat_template_not_rendered",
                          {{"model", model}, {"using", "plain chat format (README Serving)"}});
    }
    auto started = lede::coordinator::OpenAiServer::Start(service->get(), &registry, http,
                                                          lede::coordinator::RenderPlainChatPrompt);
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
  // In-flight requests finish (or are cancelled after the grace period).
  if (!runner.Serve(so, &registry).ok()) return 1;
  openai.reset();  // cancels HTTP streams still running after the grace period
  lede::Status flushed = (*service)->FlushExperience();
  lede::rpc::LogEvent(flushed.ok() ? "info" : "warn", "experience_flushed", {{"status", flushed.ToString()}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(std::vector<std::string>(argv + 1, argv + argc)); }
