// File: shared/telemetry/connection_guard.h
//
// ConnectionGuard: keeps a cpp-httplib 0.11 server answering while slow,
// idle or too many clients hold connections. It guards the coordinator's
// OpenAI HTTP API and every process's metrics/health port
// (metrics_server.h). cpp-httplib runs each connection on a worker from a
// task queue and times out each read on its own, so a client sending a
// header line every few seconds holds its worker indefinitely; with a fixed
// pool a handful of such clients stall every other request. The guard adds,
// around the library's accept loop and without patching it:
//   - an elastic worker pool (httplib::TaskQueue): a connection within the
//     caps never waits for a worker, so slow clients hold only their own
//     threads. Idle workers wait last-in first-out and one beyond
//     min_threads that has had no connection for idle_worker_timeout exits,
//     so the pool shrinks back after a burst even under a trickle of
//     traffic;
//   - caps on open connections, in total and per client address;
//   - a deadline for each request as a whole (request line, headers and
//     body) and for the idle time between keep-alive requests: a connection
//     that has not reached a handler within request_deadline is shut down by
//     a watchdog thread, however often it sends a byte;
//   - a triage thread for the connections over a cap: it never runs a
//     handler and never blocks on one client (one poll() loop over all of
//     them, each with its own triage_deadline). It reads the request head,
//     asks options.over_capacity for the answer (the metrics server answers
//     /healthz and /metrics from there; the default is 503 with Retry-After
//     and a JSON error), writes it, half-closes and drains the socket before
//     closing it, so a client over capacity gets an HTTP answer, never a
//     connection reset. With TLS (plaintext = false) the triage cannot speak
//     HTTP and closes such connections at once.
// The guard learns each connection's socket when the listener hands the
// accepted connection to the pool (the one socket on the guarded port it
// has not seen before; only the listener thread accepts) and keeps a dup()
// of it, so the watchdog's shutdown() always reaches the right connection
// even after the library closed its descriptor.
//
// Route handlers call HandlerStarted() first and the server's logger calls
// ResponseDone() after each response is written (SSE streams included), so
// a request in a handler or streaming is never cut by the deadline.
//
// Thread-safety: NewTaskQueue() is for the server's new_task_queue (once per
// listen); HandlerStarted()/ResponseDone() from connection threads; stats()
// from any thread. The guard must outlive the server's listen loop.
#ifndef LEDE_SHARED_TELEMETRY_CONNECTION_GUARD_H_
#define LEDE_SHARED_TELEMETRY_CONNECTION_GUARD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/time.h"

namespace httplib {
class TaskQueue;
}

namespace lede::telemetry {

// An answer the guard writes itself (from its triage thread) to a
// connection over a cap.
struct GuardResponse {
  int status = 503;
  std::string content_type = "application/json";
  std::string body;
  // Seconds for the Retry-After header; 0 = no header.
  int retry_after_s = 1;
};

// Chooses the answer to a request that arrived on a connection over a cap.
// `method` and `path` come from its request line ("" when the head did not
// arrive within triage_deadline or is not HTTP); `reason` says which cap.
// Runs on the triage thread, which serves every such connection: it must be
// quick and never wait on a request handler, a lock a handler holds for
// long, or the network.
using OverCapacityHandler =
    std::function<GuardResponse(const std::string& method, const std::string& path, const std::string& reason)>;

// The default answer over a cap: 503, Retry-After: 1, and OpenAI's error
// envelope {"error": {"message": reason, "type": "server_error", "param":
// null, "code": "too_many_connections"}}.
GuardResponse TooManyConnections(const std::string& reason);

struct ConnectionGuardOptions {
  // Workers started with the pool (more are started on demand, up to
  // max_connections), and the floor the pool shrinks back to.
  int min_threads = 32;
  // A worker beyond min_threads that has had no connection for this long
  // exits (the pool shrinks back after a burst). Idle workers are reused
  // last-in first-out, so light traffic keeps only the most recent ones.
  absl::Duration idle_worker_timeout = absl::Seconds(10);
  // Open connections at once; one more goes to the triage thread (answered
  // by over_capacity, by default 503). Flag --http-max-connections.
  int max_connections = 512;
  // Open connections from one client IP address; one more goes to triage.
  int max_connections_per_client = 256;
  // Request line + headers + body of one request, and the idle gap between
  // requests on a kept-alive connection. Flag --http-request-deadline-s.
  absl::Duration request_deadline = absl::Seconds(20);
  // How long the triage thread waits for the head of a request on a
  // connection over a cap before answering it anyway (with method and path
  // empty); also the bound on writing its answer.
  absl::Duration triage_deadline = absl::Seconds(2);
  // Connections in triage at once; more are answered (best effort, without
  // reading their request) and closed at once.
  int max_triage_connections = 1024;
  // The answer over a cap; null = TooManyConnections(reason).
  OverCapacityHandler over_capacity;
  // False for a TLS server: triage then closes connections over a cap at
  // once (it cannot speak TLS).
  bool plaintext = true;
  // Label of the server in log lines ("http", "metrics").
  std::string name = "http";
  // How often the watchdog checks the deadlines.
  absl::Duration tick = absl::Milliseconds(200);
  // Example: ConnectionGuardOptions o; o.max_connections = 1024;
};

class ConnectionGuard {
 public:
  struct Stats {
    int64_t open = 0;             // connections open within the caps now
    int64_t refused = 0;          // connections over a cap, sent to triage (total)
    int64_t triaged_answered = 0; // of those, answered by over_capacity (total)
    int64_t timed_out = 0;        // shut down by the request deadline (total)
    int64_t threads = 0;          // worker threads running now
    int64_t threads_started = 0;  // worker threads started (total)
  };

  explicit ConnectionGuard(ConnectionGuardOptions options);
  ~ConnectionGuard();  // stops the watchdog
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  // The TCP port the server listens on (after bind): the guard recognises
  // the connections accepted on it.
  void set_port(int port);
  // A new task queue for httplib::Server::new_task_queue (owned by the
  // server, which deletes it when its listen loop ends; its shutdown()
  // finishes the connections in triage and joins every thread).
  httplib::TaskQueue* NewTaskQueue();
  // Shuts down every connection that is not in a handler (idle keep-alive
  // connections, slow clients): for the server's stop.
  void ShutdownIdle();

  // The calling connection thread's request reached its handler / its
  // response was written. No-ops on a thread the guard did not start.
  static void HandlerStarted();
  static void ResponseDone();

  Stats stats() const;
  const ConnectionGuardOptions& options() const { return options_; }

  struct State;  // shared with the task queues and connection threads

 private:
  ConnectionGuardOptions options_;
  std::shared_ptr<State> state_;
  std::thread watchdog_;  // Sweep() every options_.tick
};

}  // namespace lede::telemetry

#endif  // LEDE_SHARED_TELEMETRY_CONNECTION_GUARD_H_
