#include "shared/rpc/server.h"

#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/server_builder.h>

#include "absl/synchronization/mutex.h"
#include "shared/status/status_macros.h"
#include "shared/telemetry/metrics.h"
#include "shared/telemetry/metrics_server.h"

namespace lede::rpc {
namespace {

sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

// glibc's malloc raises its mmap threshold each time a large block is freed
// (up to 32 MiB) and gives each of up to 8 x cores threads its own arena, so
// a long-running server that allocates tensors of varying sizes from many
// handler threads keeps its freed blocks in the arenas: the verifier's RSS
// rose 418 -> 483 MiB over a 10-minute 64-stream soak without levelling
// off. A fixed threshold (blocks of 1 MiB and more are mapped and unmapped,
// never cached) and 4 arenas halve the growth: 421 -> 447 MiB between
// minutes 1 and 9 of the same soak, about 3 MiB a minute, still not flat.
// 128 KiB kept it flat over 4 minutes (395-399 MiB) but cost
// 20-25% of autoregressive throughput at 16 streams (a page fault per 4 KiB
// of every logits tensor). The MALLOC_MMAP_THRESHOLD_ and MALLOC_ARENA_MAX
// environment variables, when set, win. lede-model now links jemalloc, so
// these settings shape only the other servers' glibc malloc (the
// coordinator and the policy service, whose RSS was flat either way).
void LimitAllocatorGrowth() {
#ifdef __GLIBC__
  if (getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 1 << 20);
  if (getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 4);
#endif
}

// Takes gRPC's server reflection plugin off one ServerBuilder. libgrpc++_reflection
// registers the plugin for every ServerBuilder of the process from a static
// initializer as soon as it is loaded (and it is linked, for the processes
// that want reflection), so not calling InitProtoReflectionServerBuilderPlugin()
// leaves reflection on; ServerOptions::reflection = false removes the plugin
// here instead (ServerBuilder applies options before plugins).
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return dynamic_cast<grpc::reflection::ProtoServerReflectionPlugin*>(p.get()) !=
                                           nullptr;
                                  }),
                   plugins->end());
  }
};

}  // namespace

void BlockTerminationSignals() {
  sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

ServerRunner::ServerRunner(std::string process_name) : process_name_(std::move(process_name)) {
  SetLogProcessName(process_name_);
  // Debian builds Abseil with deadlock detection on: every absl::Mutex lock
  // (gRPC's included) then records a stack trace into a global lock graph
  // (2-3% of the coordinator's CPU per round in a profile). A process that
  // serves turns it off; unit tests without a server keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  LimitAllocatorGrowth();
}

ServerRunner::~ServerRunner() { Shutdown(); }

void ServerRunner::AddService(grpc::Service* service) { services_.push_back(service); }

int ServerRunner::metrics_port() const { return metrics_ ? metrics_->port() : 0; }

Status ServerRunner::Start(const ServerOptions& options, const prometheus::Registry* registry) {
  options_ = options;
  grpc::EnableDefaultHealthCheckService(true);
  if (options.reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, MakeServerCredentials(options.tls));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, credentials, &port_);
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes > 0 ? options.max_receive_message_bytes
                                                                         : options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (grpc::Service* s : services_) builder.RegisterService(s);
  if (!options.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  if (options.max_handler_threads > 0) {
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, options.max_handler_threads);
  }
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    server_.reset();
    return UnavailableError("listen_address: cannot serve gRPC on " + options.listen_address);
  }
  if (registry != nullptr && !options.metrics_address.empty()) {
    auto metrics = telemetry::MetricsServer::Start(*registry, options.metrics_address, options.readiness);
    if (!metrics.ok()) {
      server_->Shutdown();
      server_.reset();
      return metrics.status();
    }
    metrics_ = std::move(*metrics);
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
  if (options.tls.enabled()) {
    LogEvent("info", "tls", {{"client_certificates", options.tls.client_ca_path.empty() ? "no" : "required"}});
  }
  server_->GetHealthCheckService()->SetServingStatus("live", true);
  if (options.readiness) {
    server_->GetHealthCheckService()->SetServingStatus("", options.readiness().ok());
    readiness_thread_ = std::thread([this] { PollReadiness(); });
  }
  LogEvent("info", "started", {{"grpc_port", std::to_string(port_)},
                               {"metrics_port", std::to_string(metrics_port())}});
  return OkStatus();
}

Status ServerRunner::Serve(const ServerOptions& options, const prometheus::Registry* registry,
                           const std::function<void()>& before_shutdown) {
  if (Status s = Start(options, registry); !s.ok()) {
    LogEvent("error", "start_failed", {{"error", s.ToString()}});
    return s;
  }
  WaitForTermination();
  if (before_shutdown) before_shutdown();
  Shutdown();
  return OkStatus();
}

void ServerRunner::WaitForTermination() {
  sigset_t set = TerminationSignals();
  int sig = 0;
  sigwait(&set, &sig);
  LogEvent("info", "terminating", {{"signal", sig == SIGINT ? "SIGINT" : "SIGTERM"}});
}

void ServerRunner::RequestTermination() { kill(getpid(), SIGTERM); }

void ServerRunner::PollReadiness() {
  bool last = true;
  absl::MutexLock lock(&readiness_mu_);
  while (!readiness_mu_.AwaitWithTimeout(absl::Condition(&readiness_stop_), options_.readiness_interval)) {
    readiness_mu_.Unlock();
    const Status s = options_.readiness();
    readiness_mu_.Lock();
    if (readiness_stop_) break;  // Shutdown() owns the status now
    server_->GetHealthCheckService()->SetServingStatus("", s.ok());
    if (s.ok() != last) {
      LogEvent(s.ok() ? "info" : "warn", s.ok() ? "ready" : "not_ready", {{"reason", std::string(s.message())}});
      last = s.ok();
    }
  }
}

void ServerRunner::Shutdown() {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  {
    absl::MutexLock lock(&readiness_mu_);
    readiness_stop_ = true;
  }
  if (readiness_thread_.joinable()) readiness_thread_.join();
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->GetHealthCheckService()->SetServingStatus("live", true);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + options_.shutdown_grace));
  server_->Wait();
  metrics_.reset();
  LogEvent("info", "stopped");
}

}  // namespace lede::rpc
