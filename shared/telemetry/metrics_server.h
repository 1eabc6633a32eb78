// File: shared/telemetry/metrics_server.h
//
// MetricsServer: an HTTP endpoint for Prometheus (docs/design.md §6, "/metrics on
// every process"), served by cpp-httplib from Debian's libcpp-httplib (0.11).
//
//   GET|HEAD /metrics  200, Content-Type "text/plain; version=0.0.4;
//                      charset=utf-8", body SerializeText(registry)
//   GET|HEAD /healthz  200, "ok\n": liveness (the process runs; its server
//                      threads answer). Never depends on other processes.
//   GET|HEAD /readyz   readiness: 200 "ready\n" when the process can serve
//                      (the `readiness` check passes, or there is none),
//                      503 "not ready: <reason>\n" otherwise
//   other methods      405;  other paths  404
//
// Defences (docs/security.md "Metrics and health ports"): the server runs
// on a ConnectionGuard (connection_guard.h) with MetricsServerOptions: an
// elastic pool of workers (one per open connection, min_threads kept,
// the rest exit after idle_worker_timeout), caps on open connections in
// total and per client address, a deadline for each request's head and
// body, and a listen backlog of 4096. A connection over a cap is answered
// by the guard's triage thread, which never runs a handler and never waits
// on one client: there GET|HEAD /healthz is 200 "ok\n", GET|HEAD /metrics
// is 200 with the exposition, /readyz is 503 "not ready: <reason>" and
// anything else 404/405. So slow clients hold only their own workers until
// the request deadline cuts them, and /healthz is answered whatever slow
// clients or a slow readiness check do.
//
// Threads: a listener, the guard's watchdog and triage threads, and the
// pool's workers, all std::thread with the default stack size (which fits
// the static TLS of a process that loads libtorch).
//
// Port 0 binds any free port and port() reports it, so tests bind port 0;
// there is no probe-then-bind race. The listening socket sets SO_REUSEADDR
// only: cpp-httplib's default also sets SO_REUSEPORT, which would let a
// second process share a port that is in use instead of failing.
//
// Thread-safety: port() and listen_address() may be called from any thread.
// Ownership: the Registry is borrowed and must outlive the server.
#ifndef LEDE_SHARED_TELEMETRY_METRICS_SERVER_H_
#define LEDE_SHARED_TELEMETRY_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "shared/status/status.h"
#include "shared/telemetry/connection_guard.h"
#include "shared/telemetry/metrics.h"

namespace httplib {
class Server;
}

namespace lede::telemetry {

// Splits "HOST:PORT": HOST an IPv4 literal or a host name without ':' or
// ',', PORT 1-5 digits in [0, 65535]. Errors: kInvalidArgument naming the
// address.
StatusOr<std::pair<std::string, int>> ParseListenAddress(const std::string& listen_address);

// The listen backlog of LEDE's HTTP servers: gRPC's, so a burst of
// connections waits in the kernel's accept queue instead of being reset
// (cpp-httplib's own is 5). Linux caps it at net.core.somaxconn.
inline constexpr int kDefaultListenBacklog = 4096;

// Binds `server` (not yet listening) to `listen_address` ("HOST:PORT", 0 =
// any free port) with SO_REUSEADDR only and a listen backlog of
// `listen_backlog` pending connections, and returns the bound port; call
// server->listen_after_bind() next (on a thread of its own).
// Errors: kInvalidArgument for a malformed address or a backlog < 1 (naming
// listen_backlog); kUnavailable if it cannot be bound (port in use, address
// not local, host unknown), naming the address. Also sets SIGPIPE to SIG_IGN
// for the process (a client that hangs up mid-response must not kill the
// server).
StatusOr<int> BindHttpServer(httplib::Server* server, const std::string& listen_address,
                             int listen_backlog = kDefaultListenBacklog);

// Waits (up to 5 s) until `server`'s listen_after_bind(), started on another
// thread, is accepting, so that a stop() right after cannot be lost.
void WaitUntilListening(httplib::Server& server);

// The defences of a metrics/health port (see the file comment). Every
// field has a default that suits a process scraped by one Prometheus and
// probed by one orchestrator.
struct MetricsServerOptions {
  // Pending connections the kernel queues before accept().
  int listen_backlog = kDefaultListenBacklog;
  // Workers kept when idle; more start on demand, one per open connection.
  int min_threads = 2;
  // A worker beyond min_threads with no connection for this long exits.
  absl::Duration idle_worker_timeout = absl::Seconds(10);
  // Open connections at once, and from one client IP address; more are
  // answered by the triage thread (see the file comment).
  int max_connections = 64;
  int max_connections_per_client = 16;
  // A request's line, headers and body must arrive within this (a scrape
  // sends them at once); the connection is shut down otherwise.
  absl::Duration request_deadline = absl::Seconds(5);
  // How long triage waits for the request head of a connection over a cap.
  absl::Duration triage_deadline = absl::Seconds(1);
  // Example: MetricsServerOptions o; o.max_connections = 256;
};

class MetricsServer {
 public:
  // Starts serving `registry` on `listen_address`, "HOST:PORT": HOST an IPv4
  // literal or a host name ("127.0.0.1", "0.0.0.0", "localhost"), PORT in
  // [0, 65535] with 0 meaning "any free port" (read it back with port()).
  //
  // Errors: those of BindHttpServer(). On error nothing is left running.
  //
  // Example:
  //   LEDE_ASSIGN_OR_RETURN(auto server,
  //                         MetricsServer::Start(registry, "127.0.0.1:0"));
  //   std::cout << "metrics on :" << server->port() << "\n";
  // `readiness` (may be empty = always ready) answers /readyz; it runs on a
  // server worker per request, so it must be thread-safe and quick (bounded
  // by its own timeout); it never runs for /healthz.
  // Errors also: kInvalidArgument for options out of range (< 1 counts or
  // non-positive durations), naming the field.
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const Registry& registry,
                                                        std::string listen_address,
                                                        std::function<Status()> readiness = nullptr,
                                                        MetricsServerOptions options = {});

  // Stops accepting, waits for in-flight requests and joins the server's
  // threads, so the Registry may be destroyed right after.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The TCP port being listened on (the chosen one when 0 was asked for).
  int port() const { return port_; }
  // The address as given to Start().
  const std::string& listen_address() const { return listen_address_; }

  // Connections open, over a cap, cut by the deadline; workers running.
  ConnectionGuard::Stats connection_stats() const { return guard_->stats(); }

 private:
  MetricsServer(const Registry& registry, std::string listen_address);

  const Registry& registry_;
  std::function<Status()> readiness_;
  const std::string listen_address_;
  std::unique_ptr<ConnectionGuard> guard_;  // outlives http_'s listen loop
  std::unique_ptr<httplib::Server> http_;
  std::thread listener_;
  int port_ = 0;
};

}  // namespace lede::telemetry

#endif  // LEDE_SHARED_TELEMETRY_METRICS_SERVER_H_
