// File: services/coordinator/openai_server.h
//
// The OpenAI-compatible HTTP API of the coordinator (cpp-httplib, Debian's
// libcpp-httplib 0.11; docs/api.md says why not civetweb):
//
//   POST /v1/completions        text_completion, streaming (SSE) or not
//   POST /v1/chat/completions   chat.completion(.chunk), streaming or not
//   GET  /v1/models             {"object": "list", "data": [the served model]}
//   GET  /v1/models/{id}        the model, or 404
//   GET  /health                200 {"status": "ok"} when the verifier and the
//                               drafter are reachable, 503 otherwise
//   GET  /metrics               the coordinator's Prometheus metrics
//   anything else               404 in the error envelope
//
// With api_keys, /v1/* answers 401 without a valid `Authorization: Bearer`
// key; a body over max_body_bytes is 413 (both in the error envelope).
//
// Requests are translated by openai_api.h and run by
// GenerationService::GenerateInProcess(): the gRPC API's validation, loop,
// metrics and experience logging, once. Errors use OpenAI's envelope with
// the status ToApiError() gives: 400 naming `param`, 404, 429 (every KV slot
// busy), 503 (a model service down), 500. An error before the first token
// is an HTTP error response even when streaming (headers are sent only once
// the first token is there); a failure after it ends the stream with
// `data: {"error": {...}}` and no [DONE].
//
// Cancellation: a client that disconnects cancels its generation, which
// stops after the round in flight and closes its KV slot (status CANCELLED,
// lede_request_success_total{finished_reason="abort"}), as a gRPC cancel
// does. A stream notices at its next write; before the first token, and for
// a non-streaming request that writes nothing until the end, the
// connection's socket is polled for a hang-up (POLLRDHUP) at every delta.
// cpp-httplib 0.11 does not give handlers the socket, so it is found by its
// endpoints among the process's descriptors (Linux /proc/self/fd).
//
// Threads: a listener thread, the connection guard's watchdog and triage
// threads, and `threads` or more workers (one per open connection); each streaming request also runs its generation on a thread
// of its own that hands SSE events to the connection's worker through a
// small bounded queue. Thread-safety: Start/port/the destructor from one
// thread. Ownership: the GenerationService and the Registry are borrowed and
// must outlive the server.
#ifndef LEDE_SERVICES_COORDINATOR_OPENAI_SERVER_H_
#define LEDE_SERVICES_COORDINATOR_OPENAI_SERVER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "services/coordinator/chat_prompt.h"
#include "services/coordinator/coordinator.h"
#include "shared/status/status.h"
#include "shared/telemetry/connection_guard.h"
#include "shared/telemetry/metrics_server.h"

namespace prometheus {
class Registry;
}

namespace lede::coordinator {

struct OpenAiServerOptions {
  // "HOST:PORT"; port 0 picks a free port (read it back with port()).
  std::string listen_address = "127.0.0.1:8000";
  // The served model's name in /v1/models and in responses; requests naming
  // another model are 404 (an absent `model` means this one).
  std::string model_id = "lede";
  // Connection worker threads kept; more start on demand up to
  // max_connections (shared/telemetry/connection_guard.h), so slow clients
  // never stall others.
  int threads = 32;
  // A worker beyond `threads` with no connection for this long exits (the
  // pool shrinks back after a burst). Flag --http-idle-worker-s.
  absl::Duration idle_worker_timeout = absl::Seconds(10);
  // Pending connections the kernel queues before accept() (gRPC's 4096;
  // capped by net.core.somaxconn): a burst waits there instead of being
  // reset. Flag --http-listen-backlog.
  int listen_backlog = telemetry::kDefaultListenBacklog;
  // Open connections at once, in total and from one client IP address: one
  // more is answered by the guard's triage thread, after its request head
  // (or 2 s), with 503, Retry-After: 1 and code too_many_connections, then
  // closed without a reset.
  int max_connections = 512;
  int max_connections_per_client = 256;
  // A request's line, headers and body must arrive within this (and a
  // kept-alive connection may idle this long between requests); the
  // connection is shut down otherwise, however often the client sends a byte.
  absl::Duration request_deadline = absl::Seconds(20);
  // How long /health waits for the model services to accept a connection.
  absl::Duration health_timeout = absl::Seconds(1);
  // Largest request body, bytes: 413 (code request_too_large) above it,
  // before the body is buffered or parsed. main.cc sizes it to the context
  // window (request_validation.h MaxHttpBodyBytes).
  size_t max_body_bytes = 8 << 20;
  // TLS (cpp-httplib's SSLServer): PEM certificate chain and private key;
  // both empty = plain HTTP.
  std::string tls_cert_path;
  std::string tls_key_path;
  // API keys: every /v1/* request needs `Authorization: Bearer <key>` with
  // one of them, else 401 (code invalid_api_key) before its body is read;
  // /health and /metrics stay open. Empty = no authentication. Constant-time
  // comparison (shared/rpc/security.h); never logged.
  std::vector<std::string> api_keys;
};

class OpenAiServer {
 public:
  // Starts serving. `render_chat` turns chat messages into the prompt
  // (ChatRendererFor(model): the checkpoint's chat template, else the plain
  // format).
  // `registry` may be null (then /metrics is 404).
  // Errors: kInvalidArgument for a malformed address, threads < 1,
  // listen_backlog < 1, an empty
  // API key, or TLS files that are not a PEM certificate and key;
  // kUnavailable if the address cannot be bound (names it).
  static StatusOr<std::unique_ptr<OpenAiServer>> Start(GenerationService* service,
                                                       const prometheus::Registry* registry,
                                                       OpenAiServerOptions options,
                                                       ChatPromptRenderer render_chat);
  // Stops accepting, cancels the streams in flight (as a disconnect would),
  // and joins every thread.
  ~OpenAiServer();
  // Open connections, refusals and deadline cuts so far (connection_guard.h).
  telemetry::ConnectionGuard::Stats connection_stats() const;
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  int port() const;

  struct Impl;

 private:
  explicit OpenAiServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_OPENAI_SERVER_H_
