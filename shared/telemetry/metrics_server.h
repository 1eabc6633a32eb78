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
// Threads: cpp-httplib runs one listener thread and a pool of kServerThreads
// workers, all std::thread with the default stack size. (The civetweb server
// this replaced started its threads with a compiled-in ~100 KiB stack, too
// small for the static TLS of a process that loads libtorch; that needed a
// pthread_attr_setstacksize interposer, which is gone with civetweb.)
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

#include "shared/status/status.h"
#include "shared/telemetry/metrics.h"

namespace httplib {
class Server;
}

namespace lede::telemetry {

// Splits "HOST:PORT": HOST an IPv4 literal or a host name without ':' or
// ',', PORT 1-5 digits in [0, 65535]. Errors: kInvalidArgument naming the
// address.
StatusOr<std::pair<std::string, int>> ParseListenAddress(const std::string& listen_address);

// Binds `server` (not yet listening) to `listen_address` ("HOST:PORT", 0 =
// any free port) with SO_REUSEADDR only, and returns the bound port; call
// server->listen_after_bind() next (on a thread of its own).
// Errors: kInvalidArgument for a malformed address; kUnavailable if it
// cannot be bound (port in use, address not local, host unknown), naming
// the address. Also sets SIGPIPE to SIG_IGN for the process (a client that
// hangs up mid-response must not kill the server).
StatusOr<int> BindHttpServer(httplib::Server* server, const std::string& listen_address);

// Waits (up to 5 s) until `server`'s listen_after_bind(), started on another
// thread, is accepting, so that a stop() right after cannot be lost.
void WaitUntilListening(httplib::Server& server);

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
  // by its own timeout).
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const Registry& registry,
                                                        std::string listen_address,
                                                        std::function<Status()> readiness = nullptr);

  // Stops accepting, waits for in-flight requests and joins the server's
  // threads, so the Registry may be destroyed right after.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The TCP port being listened on (the chosen one when 0 was asked for).
  int port() const { return port_; }
  // The address as given to Start().
  const std::string& listen_address() const { return listen_address_; }

  // Worker threads (a scrape is cheap; a few suffice).
  static constexpr int kServerThreads = 4;

 private:
  MetricsServer(const Registry& registry, std::string listen_address);

  const Registry& registry_;
  std::function<Status()> readiness_;
  const std::string listen_address_;
  std::unique_ptr<httplib::Server> http_;
  std::thread listener_;
  int port_ = 0;
};

}  // namespace lede::telemetry

#endif  // LEDE_SHARED_TELEMETRY_METRICS_SERVER_H_
