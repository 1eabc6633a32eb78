// lede-coordinator: the public lede.v1.Generation API
// (services/coordinator/coordinator.h). Never links libtorch.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "services/coordinator/chat_prompt.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/coordinator_flags.h"
#include "services/coordinator/openai_server.h"
#include "services/coordinator/request_validation.h"
#include "shared/flags/flags.h"
#include "shared/log/log.h"
#include "shared/rpc/server.h"
#include "shared/rpc/server_flags.h"
#include "shared/telemetry/metrics.h"

namespace {

int Run(const std::vector<std::string>& raw_args) {
  lede::coordinator::CoordinatorFlags fl;
  lede::flags::FlagSet flags;
  lede::coordinator::AddCoordinatorFlags(&flags, &fl);
  if (auto exit_code = lede::rpc::ParseCommandLine(
          "lede-coordinator", "lede-coordinator --model DIR [--config FILE] [flags]", raw_args, flags,
          [&] { return lede::coordinator::FinishCoordinatorFlags(&fl); })) {
    return *exit_code;
  }
  const lede::coordinator::CoordinatorOptions& o = fl.options;
  lede::coordinator::OpenAiServerOptions& http = fl.http;
  const std::string& model = fl.model;
  lede::rpc::BlockTerminationSignals();
  lede::telemetry::Registry registry;
  auto service = lede::coordinator::GenerationService::Create(o, &registry);
  if (!service.ok()) {
    std::cerr << "lede-coordinator: " << service.status().message() << "\n";
    return 2;
  }
  const lede::coordinator::RequestBounds bounds{fl.context_tokens, (*service)->max_token_bytes()};
  int64_t max_request_bytes = fl.max_request_bytes, max_body_bytes = fl.max_body_bytes;
  if (max_request_bytes <= 0) max_request_bytes = lede::coordinator::MaxRequestMessageBytes(bounds);
  if (max_body_bytes <= 0) max_body_bytes = lede::coordinator::MaxHttpBodyBytes(bounds);
  http.max_body_bytes = static_cast<size_t>(max_body_bytes);
  lede::log::LogEvent("info", "request_limits",
                      {{"context_tokens", std::to_string(fl.context_tokens)},
                       {"max_token_bytes", std::to_string(bounds.max_token_bytes)},
                       {"max_request_bytes", std::to_string(max_request_bytes)},
                       {"http_max_body_bytes", std::to_string(max_body_bytes)},
                       {"api_keys", std::to_string(o.api_keys.size())}});
  std::unique_ptr<lede::coordinator::OpenAiServer> openai;
  if (!http.listen_address.empty()) {
    std::string chat_format;
    lede::coordinator::ChatPromptRenderer render_chat = lede::coordinator::ChatRendererFor(model, &chat_format);
    lede::log::LogEvent(absl::StartsWith(chat_format, "plain (the chat template") ? "warn" : "info", "chat_format",
                        {{"model", model}, {"using", chat_format}});
    auto started = lede::coordinator::OpenAiServer::Start(service->get(), &registry, http, std::move(render_chat));
    if (!started.ok()) {
      std::cerr << "lede-coordinator: --http: " << started.status().message() << "\n";
      return 1;
    }
    openai = std::move(*started);
    lede::log::LogEvent("info", "openai_api_listening",
                        {{"port", std::to_string(openai->port())}, {"model", http.model_id}});
  }
  lede::rpc::ServerRunner runner("coordinator");
  runner.AddService(service->get());
  lede::rpc::ServerOptions so;
  lede::rpc::ApplyServerFlags(fl.server, &so);
  so.max_receive_message_bytes = static_cast<int>(std::min<int64_t>(max_request_bytes, INT32_MAX));
  // Ready = serving: not draining, and the verifier and drafter answer.
  so.readiness = [&service] { return (*service)->Readiness(absl::Milliseconds(300)); };
  // In-flight requests finish (or are cancelled after the grace period).
  // On SIGTERM: drain both APIs (new requests UNAVAILABLE) before the
  // servers stop; scripts/run and the Kubernetes preStop hook stop the model
  // services only after this process exits.
  if (!runner.Serve(so, &registry, [&] { (*service)->Drain(so.shutdown_grace); }).ok()) return 1;
  openai.reset();  // cancels HTTP streams still running after the grace period
  lede::Status flushed = (*service)->FlushExperience();
  lede::log::LogEvent(flushed.ok() ? "info" : "warn", "experience_flushed", {{"status", flushed.ToString()}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(std::vector<std::string>(argv + 1, argv + argc)); }
