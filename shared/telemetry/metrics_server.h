// File: shared/telemetry/metrics_server.h
//
// MetricsServer: an HTTP endpoint for Prometheus (DESIGN.md §6, "/metrics on
// every process"), served by civetweb from Debian's libcivetweb (1.15).
//
//   GET|HEAD /metrics  200, Content-Type "text/plain; version=0.0.4;
//                      charset=utf-8", body Registry::Serialize()
//   GET|HEAD /healthz  200, "ok\n" (the server's threads are alive)
//   other methods      405;  other paths  404
//
// Why civetweb's C API and not CivetServer (libcivetweb-cpp): CivetServer's
// constructor reports a failed start by throwing CivetException, and we throw
// nothing outside the torch glue (STYLE.md §2.6); mg_start2() returns the
// error text, which we turn into a Status, and mg_get_server_ports() reads
// back the port. One library fewer on the link line, too.
//
// Port 0: civetweb 1.15 binds "127.0.0.1:0" and mg_get_server_ports()
// reports the port the kernel chose (checked against Debian's 1.15), so
// tests bind port 0 and read port(); there is no probe-then-bind race.
//
// Threads: civetweb runs a listener thread and kServerThreads workers;
// keep-alive is off, so a slow client holds a worker for one request only.
// Note that civetweb's start sets SIGPIPE to SIG_IGN for the process.
//
// Thread-safety: port() and listen_address() may be called from any thread.
// Ownership: the Registry is borrowed and must outlive the server.
#ifndef LEDE_SHARED_TELEMETRY_METRICS_SERVER_H_
#define LEDE_SHARED_TELEMETRY_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "shared/status/status.h"
#include "shared/telemetry/metrics.h"

struct mg_context;

namespace lede::telemetry {

class MetricsServer {
 public:
  // Starts serving `registry` on `listen_address`, "HOST:PORT": HOST an IPv4
  // literal or a host name ("127.0.0.1", "0.0.0.0", "localhost"), PORT in
  // [0, 65535] with 0 meaning "any free port" (read it back with port()).
  // IPv6 is not supported (Debian's civetweb is built without it).
  //
  // Errors: kInvalidArgument if `listen_address` is not HOST:PORT with a
  //         PORT in range (names the address);
  //         kUnavailable if civetweb cannot listen there: port in use,
  //         address not local, host does not resolve (names the address and
  //         civetweb's reason).
  // On error nothing is left running.
  //
  // Example:
  //   LEDE_ASSIGN_OR_RETURN(auto server,
  //                         MetricsServer::Start(registry, "127.0.0.1:0"));
  //   std::cout << "metrics on :" << server->port() << "\n";
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const Registry& registry,
                                                        std::string listen_address);

  // Stops accepting, waits for in-flight requests and joins civetweb's
  // threads (mg_stop), so the Registry may be destroyed right after. Takes
  // milliseconds: it connects to its own port to wake civetweb's listener,
  // which otherwise notices the stop only after its 2 s poll() timeout.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The TCP port being listened on (the chosen one when 0 was asked for).
  int port() const { return port_; }
  // The address as given to Start().
  const std::string& listen_address() const { return listen_address_; }

  // Worker threads civetweb starts (a scrape is cheap; a few suffice).
  static constexpr int kServerThreads = 4;

 private:
  MetricsServer(const Registry& registry, std::string listen_address);

  const Registry& registry_;
  const std::string listen_address_;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
};

}  // namespace lede::telemetry

#endif  // LEDE_SHARED_TELEMETRY_METRICS_SERVER_H_
