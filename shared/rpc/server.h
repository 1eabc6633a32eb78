// File: shared/rpc/server.h
//
// What every LEDE process does around its gRPC services (docs/design.md §3):
// a grpc::Server with the standard health checking service
// (grpc.health.v1.Health: service "" = readiness, SERVING while the
// ServerOptions::readiness check passes and NOT_SERVING otherwise and while
// shutting down; service "live" = liveness, SERVING while the process runs) and server reflection (grpc.reflection.v1alpha), /metrics and
// /healthz over HTTP (shared/telemetry), a clean shutdown on SIGTERM or
// SIGINT (stop accepting, let in-flight calls finish until a grace deadline,
// then cancel them); its logfmt lines on stderr are shared/log's.
//
// Usage in a main():
//   BlockTerminationSignals();            // first, before any thread starts
//   ServerRunner runner("verifier");
//   runner.AddService(&service);
//   LEDE_RETURN_IF_ERROR(runner.Serve(options, &registry));  // returns after SIGTERM/SIGINT
// (Serve = Start, WaitForTermination, Shutdown; call them one by one to do
// more in between.)
#ifndef LEDE_SHARED_RPC_SERVER_H_
#define LEDE_SHARED_RPC_SERVER_H_

#include <chrono>

#include "absl/time/time.h"
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <thread>

#include <grpcpp/server.h>

#include "absl/synchronization/mutex.h"
#include "shared/log/log.h"
#include "shared/rpc/security.h"
#include "shared/status/status.h"

namespace grpc {
class Service;
}

namespace prometheus {
class Registry;
}

namespace lede::telemetry {
class MetricsServer;
}  // namespace lede::telemetry

namespace lede::rpc {

struct ServerOptions {
  // gRPC listen address; port 0 picks a free port (read it back with port()).
  std::string listen_address = "127.0.0.1:0";
  // HTTP address of /metrics; "" = no metrics server.
  std::string metrics_address = "127.0.0.1:0";
  // How long in-flight calls may run after a termination signal.
  absl::Duration shutdown_grace = absl::Seconds(10);
  // Largest message, bytes (draft distributions of sampled rounds are K x V floats).
  int max_message_bytes = 64 << 20;
  // Largest message received, bytes; 0 = max_message_bytes. The
  // coordinator's public API sizes it to the context window:
  // a larger message fails with RESOURCE_EXHAUSTED before it is buffered.
  int max_receive_message_bytes = 0;
  // TLS (and mutual TLS) of the gRPC port; plaintext when empty. /metrics and
  // /healthz stay plain HTTP. Errors of MakeServerCredentials() come back
  // from Start().
  ServerTlsOptions tls;
  // Readiness (can this process serve now?): empty = ready once started.
  // Evaluated every `readiness_interval` for the gRPC health status "" and
  // on every HTTP GET /readyz; must be thread-safe and bounded in time.
  // Liveness (/healthz, gRPC health "live") never calls it.
  std::function<Status()> readiness;
  absl::Duration readiness_interval = absl::Milliseconds(500);
  // Idle threads the synchronous services keep for their calls (gRPC's
  // SyncServerOption MAX_POLLERS, whose default is 2); 0 = gRPC's default.
  // A thread that ends a call while more are idle exits, and the next call
  // beyond them starts a new one: with calls that block (a verification
  // waiting for its batch), gRPC's default started and ended a thread per
  // call at 16 streams (about 100 us of the verifier's CPU per token).
  // Set it to the calls expected at once (the KV slots, for a model
  // process).
  int max_handler_threads = 0;
  // gRPC server reflection (grpc_cli, grpcurl). The internal services turn it
  // off when they authenticate callers (an internal token or client
  // certificates): no need to describe the plane to whoever can reach it
  // (docs/security.md). Off takes gRPC's reflection plugin off this server's
  // builder: libgrpc++_reflection registers it for every server of the
  // process when it loads, so merely not enabling it would leave it on.
  bool reflection = true;
};

// Blocks SIGTERM and SIGINT in the calling thread and every thread it
// starts later, so that WaitForTermination() receives them. Call first in
// main().
void BlockTerminationSignals();

// Constructing one also sets two process-wide things a server wants
// (server.cc): Abseil's mutex deadlock detection off, and glibc's malloc
// with a fixed 1 MiB mmap threshold and 4 arenas (unless MALLOC_* says
// otherwise), so that a long run's RSS climbs less (server.cc; lede-model
// allocates with jemalloc instead, which these do not touch).
class ServerRunner {
 public:
  explicit ServerRunner(std::string process_name);
  ~ServerRunner();

  // Registers a service (borrowed; must outlive the runner). Before Start().
  void AddService(grpc::Service* service);
  // Builds and starts the server (and the metrics server when
  // metrics_address is set and `registry` is not null).
  // Errors: kUnavailable naming the address when it cannot be bound (or the
  // TLS files are not a valid PEM certificate and key); those of
  // MakeServerCredentials() for options.tls.
  Status Start(const ServerOptions& options, const prometheus::Registry* registry);
  // Start(), then WaitForTermination(), then `before_shutdown` (e.g. ending
  // long-lived streams), then Shutdown(). Errors: those of Start() (logged
  // as event=start_failed; nothing is left running).
  Status Serve(const ServerOptions& options, const prometheus::Registry* registry,
               const std::function<void()>& before_shutdown = nullptr);
  int port() const { return port_; }
  int metrics_port() const;
  grpc::Server* server() { return server_.get(); }

  // Blocks until SIGTERM or SIGINT arrives (or RequestTermination()).
  void WaitForTermination();
  // Wakes WaitForTermination() (tests, fatal errors).
  static void RequestTermination();
  // Marks the process NOT_SERVING, stops accepting calls, waits up to the
  // grace period for in-flight calls, then cancels the rest. Idempotent.
  void Shutdown();

 private:
  std::string process_name_;
  std::vector<grpc::Service*> services_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<telemetry::MetricsServer> metrics_;
  ServerOptions options_;
  int port_ = 0;
  bool shut_down_ = false;
  // The readiness poller (gRPC health "").
  void PollReadiness();
  std::thread readiness_thread_;
  absl::Mutex readiness_mu_;
  bool readiness_stop_ ABSL_GUARDED_BY(readiness_mu_) = false;
};

// The logger (shared/log/log.h), under the names its callers here have used.
using log::LogEvent;
using log::SetLogProcessName;

}  // namespace lede::rpc

#endif  // LEDE_SHARED_RPC_SERVER_H_
