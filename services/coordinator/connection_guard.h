// File: services/coordinator/connection_guard.h
//
// ConnectionGuard: keeps the OpenAI HTTP API (cpp-httplib 0.11) serving
// while slow or idle clients hold connections. cpp-httplib
// runs each connection on a worker from a fixed pool and times out each read
// on its own, so 32 clients sending one byte a second held all 32 workers and
// stalled every other request. The guard adds, around the library's accept
// loop and without patching it:
//   - an elastic worker pool (httplib::TaskQueue): a connection never waits
//     for a worker while fewer than max_connections are open, so slow clients
//     hold only their own threads; workers beyond min_threads exit after
//     idle_worker_timeout, so the pool shrinks back after a burst;
//   - caps on open connections, in total and per client address: the excess
//     gets a 503 JSON error and is closed at once, before its request is read;
//   - a deadline for each request as a whole (request line, headers and
//     body) and for the idle time between keep-alive requests: a connection
//     that has not reached a handler within request_deadline is shut down by
//     a watchdog thread, however often it sends a byte.
// The guard learns each connection's socket when the listener hands the
// accepted connection to the pool (the one socket on the HTTP port it has
// not seen before; only the listener thread accepts) and keeps a dup() of
// it, so the watchdog's shutdown() always reaches the right connection even
// after the library closed its descriptor.
//
// Route handlers call HandlerStarted() first and the server's logger calls
// ResponseDone() after each response is written (SSE streams included), so
// a request in a handler or streaming is never cut by the deadline.
//
// Thread-safety: NewTaskQueue() is for the server's new_task_queue (once per
// listen); HandlerStarted()/ResponseDone() from connection threads; stats()
// from any thread. The guard must outlive the server's listen loop.
#ifndef LEDE_SERVICES_COORDINATOR_CONNECTION_GUARD_H_
#define LEDE_SERVICES_COORDINATOR_CONNECTION_GUARD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/time.h"

namespace httplib {
class TaskQueue;
}

namespace lede::coordinator {

struct ConnectionGuardOptions {
  // Workers started with the pool (more are started on demand, up to
  // max_connections).
  int min_threads = 32;
  // A worker beyond min_threads idle this long exits (the pool shrinks back
  // after a burst).
  absl::Duration idle_worker_timeout = absl::Seconds(30);
  // Open connections at once; one more is refused with 503. Flag --http-max-connections.
  int max_connections = 512;
  // Open connections from one client IP address; one more is refused with 503.
  int max_connections_per_client = 256;
  // Request line + headers + body of one request, and the idle gap between
  // requests on a kept-alive connection. Flag --http-request-deadline-s.
  absl::Duration request_deadline = absl::Seconds(20);
  // How often the watchdog checks the deadlines.
  absl::Duration tick = absl::Milliseconds(200);
  // Example: ConnectionGuardOptions o; o.max_connections = 1024;
};

class ConnectionGuard {
 public:
  struct Stats {
    int64_t open = 0;       // connections open now
    int64_t refused = 0;    // refused by a cap (total)
    int64_t timed_out = 0;  // shut down by the request deadline (total)
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
  // server, which deletes it when its listen loop ends).
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

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_CONNECTION_GUARD_H_
