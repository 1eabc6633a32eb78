#include "services/coordinator/openai_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <ctime>
#include <deque>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include <httplib.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "shared/telemetry/connection_guard.h"
#include "services/coordinator/openai_api.h"
#include "shared/rpc/security.h"
#include "shared/rpc/server.h"
#include "shared/telemetry/metrics.h"
#include "shared/telemetry/metrics_server.h"

namespace lede::coordinator {
namespace {

using nlohmann::json;
using telemetry::ConnectionGuard;
using telemetry::ConnectionGuardOptions;
using openai::ApiError;

constexpr char kJson[] = "application/json";

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(openai::Dump(e.ToJson()), kJson);
}

// One streaming request: the generation thread produces SSE events, the
// connection's worker writes them. Guarded by mu; a change wakes the
// Await()s on the lock's release.
struct SseStream {
  absl::Mutex mu;
  std::deque<std::string> events ABSL_GUARDED_BY(mu);
  bool started ABSL_GUARDED_BY(mu) = false;  // the first token (or the summary) is queued
  bool done ABSL_GUARDED_BY(mu) = false;     // the generation returned `status`
  bool gone ABSL_GUARDED_BY(mu) = false;     // the client hung up, or the server is stopping
  Status status ABSL_GUARDED_BY(mu);
  static constexpr size_t kMaxQueued = 16;
};

// "ADDRESS" and port of a socket address (IPv4 or IPv6).
bool AddressOf(const sockaddr_storage& a, std::string* ip, int* port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    if (inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf)) == nullptr) return false;
    *port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf)) == nullptr) return false;
    *port = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  *ip = buf;
  return true;
}

// The descriptor of the connection `req` arrived on, or -1. cpp-httplib 0.11
// does not hand it to handlers, so it is found among the process's open
// sockets by its two endpoints (req.remote_addr:remote_port and
// req.local_port); the connection stays open while the handler runs, so
// the number cannot be reused meanwhile.
int ConnectionFd(const httplib::Request& req) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* e = ::readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2) continue;
    sockaddr_storage peer{}, local{};
    socklen_t pl = sizeof(peer), ll = sizeof(local);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    std::string pip, lip;
    int pport = 0, lport = 0;
    if (!AddressOf(peer, &pip, &pport) || !AddressOf(local, &lip, &lport)) continue;
    if (pport == req.remote_port && lport == req.local_port && pip == req.remote_addr) {
      found = fd;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

// True once the client closed its side (or the connection broke): a client
// gone mid-request, since HTTP clients do not half-close while waiting.
bool PeerClosed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// The SSE events of one response of a streamed generation: the first chunk
// (`first`: before the first response only), the text delta, and with the
// summary the final chunk and, with include_usage, the usage chunk.
std::vector<std::string> StreamEvents(const openai::Request& r, const openai::ResponseMeta& meta,
                                      const lede::v1::GenerateResponse& g, bool first) {
  std::vector<std::string> out;
  if (first) {
    json head = openai::FirstChunk(r, meta);
    if (!head.is_null()) out.push_back(openai::SseEvent(head));
  }
  if (g.has_delta() && !g.delta().text().empty()) {
    out.push_back(openai::SseEvent(openai::TextChunk(r, meta, g.delta().text())));
  }
  if (g.has_summary()) {
    out.push_back(openai::SseEvent(openai::FinalChunk(r, meta, g.summary())));
    if (r.include_usage) out.push_back(openai::SseEvent(openai::UsageChunk(r, meta, g.summary())));
  }
  return out;
}

// Queues `events` for the connection's worker (the generation thread's
// side), waiting while SseStream::kMaxQueued events wait. Returns false,
// which cancels the generation, once the client is gone; before the first
// event that is seen by polling `fd` (the worker is still in the handler).
bool QueueEvents(SseStream& stream, int fd, std::vector<std::string> events) {
  absl::MutexLock lock(&stream.mu);
  // Before the first event the connection's worker is still in the
  // handler (fd open): a hang-up during the prefill is seen here.
  if (!stream.started && PeerClosed(fd)) stream.gone = true;
  const auto room = [&stream] { return stream.events.size() < SseStream::kMaxQueued || stream.gone; };
  stream.mu.Await(absl::Condition(&room));
  if (stream.gone) return false;
  for (std::string& e : events) stream.events.push_back(std::move(e));
  stream.started = true;
  return true;
}

// One call of the chunked content provider (the connection's worker side):
// waits for events, writes every queued one with the lock released, and
// once the generation is done writes the tail ([DONE], or the error as an
// event) and ends the response. Returns false when the client hung up
// (which cancels the generation) or the stream is gone.
bool WriteQueuedEvents(SseStream& stream, const openai::Request& request, httplib::DataSink& sink) {
  stream.mu.Lock();
  const auto ready = [&stream] { return !stream.events.empty() || stream.done || stream.gone; };
  stream.mu.Await(absl::Condition(&ready));
  while (!stream.events.empty()) {
    std::string e = std::move(stream.events.front());
    stream.events.pop_front();
    stream.mu.Unlock();  // the write may block; the generation queues meanwhile
    const bool ok = sink.write(e.data(), e.size());
    stream.mu.Lock();
    if (!ok) {
      stream.gone = true;  // the client hung up: cancel the generation
      stream.mu.Unlock();
      return false;
    }
  }
  if (stream.done) {
    const std::string tail = stream.status.ok()
                                 ? std::string(openai::kSseDone)
                                 : openai::SseEvent(openai::ToApiError(stream.status, &request).ToJson());
    stream.mu.Unlock();
    sink.write(tail.data(), tail.size());
    sink.done();
    return true;
  }
  const bool alive = !stream.gone;
  stream.mu.Unlock();
  return alive;
}

}  // namespace

struct OpenAiServer::Impl {
  GenerationService* service = nullptr;
  const prometheus::Registry* registry = nullptr;
  OpenAiServerOptions options;
  ChatPromptRenderer render_chat;
  std::unique_ptr<ConnectionGuard> guard;  // workers, connection caps, request deadline
  std::unique_ptr<httplib::Server> http;  // an httplib::SSLServer with TLS
  rpc::ApiKeys api_keys;
  std::thread listener;
  int port = 0;
  int64_t created = static_cast<int64_t>(std::time(nullptr));

  absl::Mutex mu;
  int generation_threads ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;  // new streams start cancelled
  std::set<std::shared_ptr<SseStream>> streams ABSL_GUARDED_BY(mu);
  std::mt19937_64 rng ABSL_GUARDED_BY(mu){std::random_device{}()};

  uint64_t Random() {
    absl::MutexLock lock(&mu);
    return rng();
  }

  json ModelJson() const {
    return {{"id", options.model_id}, {"object", "model"}, {"created", created}, {"owned_by", "lede"}};
  }

  // The routes, the API-key check before them, and the error envelopes of
  // the OpenAI HTTP API on `http` (this Impl outlives the server).
  void RegisterRoutes(httplib::Server& http);
  void HandleGenerate(openai::Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  // `fd`: the connection's descriptor (-1 if unknown), polled for a hang-up
  // until the first token; writes notice it afterwards.
  void StartStream(openai::Request request, const openai::ResponseMeta& meta, int fd, httplib::Response& res);
  // A new stream, counted as a generation thread (the destructor waits for
  // them) and cancelled at once if the server is stopping.
  std::shared_ptr<SseStream> OpenStream();
  // The generation thread of `stream`: runs `r`, queueing its events, then
  // marks the stream done with the generation's status and forgets it.
  void RunStreamGeneration(const std::shared_ptr<SseStream>& stream, const openai::Request& r,
                           const openai::ResponseMeta& meta, int fd);
};

void OpenAiServer::Impl::HandleGenerate(openai::Endpoint endpoint, const httplib::Request& req,
                                        httplib::Response& res) {
  StatusOr<openai::Request> parsed = openai::ParseRequest(endpoint, req.body, render_chat, Random());
  if (!parsed.ok()) return SendError(res, openai::ToApiError(parsed.status(), nullptr));
  openai::Request& r = *parsed;
  if (!r.ignored_fields.empty()) {
    rpc::LogEvent("info", "openai_ignored_fields",
                  {{"path", req.path}, {"fields", absl::StrJoin(r.ignored_fields, ",")}});
  }
  if (!r.model.empty() && r.model != options.model_id) return SendError(res, openai::ModelNotFound(r.model));
  char id[32];
  snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(Random()));
  r.generate.set_request_id(std::string("req-") + id);
  openai::ResponseMeta meta;
  meta.id = (endpoint == openai::Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-") + std::string(id);
  meta.created = static_cast<int64_t>(std::time(nullptr));
  meta.model = options.model_id;
  const int fd = ConnectionFd(req);
  if (r.stream) return StartStream(std::move(r), meta, fd, res);

  // Nothing is written before the end, so a client that hangs up is noticed
  // by polling its socket at every delta.
  std::string text;
  lede::v1::GenerationSummary summary;
  Status s = service->GenerateInProcess(
      r.generate,
      [&](const lede::v1::GenerateResponse& g) {
        if (g.has_delta()) text += g.delta().text();
        if (g.has_summary()) summary = g.summary();
        return !PeerClosed(fd);
      },
      r.fill_max_tokens);
  if (s.code() == StatusCode::kCancelled) return;  // the client is gone
  if (!s.ok()) return SendError(res, openai::ToApiError(s, &r));
  res.status = 200;
  res.set_content(openai::Dump(openai::CompleteResponse(r, meta, text, summary)), kJson);
}

std::shared_ptr<SseStream> OpenAiServer::Impl::OpenStream() {
  auto stream = std::make_shared<SseStream>();
  absl::MutexLock lock(&mu);
  ++generation_threads;
  streams.insert(stream);
  if (stopping) {
    absl::MutexLock slock(&stream->mu);  // not yet shared: never contended
    stream->gone = true;
  }
  return stream;
}

void OpenAiServer::Impl::RunStreamGeneration(const std::shared_ptr<SseStream>& stream, const openai::Request& r,
                                             const openai::ResponseMeta& meta, int fd) {
  bool first = true;
  Status s = service->GenerateInProcess(
      r.generate,
      [&](const lede::v1::GenerateResponse& g) {
        std::vector<std::string> events = StreamEvents(r, meta, g, first);
        first = false;
        return QueueEvents(*stream, fd, std::move(events));
      },
      r.fill_max_tokens);
  {
    absl::MutexLock lock(&stream->mu);
    stream->done = true;
    stream->status = s;
  }
  absl::MutexLock lock(&mu);
  streams.erase(stream);
  --generation_threads;
}

void OpenAiServer::Impl::StartStream(openai::Request request, const openai::ResponseMeta& meta, int fd,
                                     httplib::Response& res) {
  std::shared_ptr<SseStream> stream = OpenStream();
  auto shared_request = std::make_shared<openai::Request>(std::move(request));
  std::thread([this, stream, shared_request, meta, fd] {
    RunStreamGeneration(stream, *shared_request, meta, fd);
  }).detach();

  // Headers wait for the first token: an error before it is a plain HTTP error.
  {
    absl::MutexLock lock(&stream->mu);
    const auto first = [&stream] { return stream->started || stream->done; };
    stream->mu.Await(absl::Condition(&first));
    if (!stream->started) {
      if (stream->gone) return;  // the client hung up before the first token
      return SendError(res, openai::ToApiError(stream->status, shared_request.get()));
    }
  }
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [stream, shared_request](size_t /*offset*/, httplib::DataSink& sink) {
        return WriteQueuedEvents(*stream, *shared_request, sink);
      },
      [stream](bool success) {
        absl::MutexLock lock(&stream->mu);
        if (!success) stream->gone = true;
      });
}

OpenAiServer::OpenAiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OpenAiServer::~OpenAiServer() {
  Impl& impl = *impl_;
  {
    absl::MutexLock lock(&impl.mu);
    impl.stopping = true;
    for (const std::shared_ptr<SseStream>& s : impl.streams) {
      absl::MutexLock slock(&s->mu);
      s->gone = true;
    }
  }
  impl.http->stop();
  impl.guard->ShutdownIdle();  // slow and idle clients release their workers now
  if (impl.listener.joinable()) impl.listener.join();
  absl::MutexLock lock(&impl.mu);
  const auto finished = [&impl] { return impl.generation_threads == 0; };
  impl.mu.Await(absl::Condition(&finished));
}

int OpenAiServer::port() const { return impl_->port; }

telemetry::ConnectionGuard::Stats OpenAiServer::connection_stats() const { return impl_->guard->stats(); }

void OpenAiServer::Impl::RegisterRoutes(httplib::Server& http) {
  Impl* p = this;
  // API keys guard /v1/* before the body is read; /health and /metrics stay
  // open (probes and Prometheus carry no key). The key is never logged.
  http.set_pre_routing_handler([p](const httplib::Request& req, httplib::Response& res) {
    if (p->api_keys.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (p->api_keys.Allows(req.get_header_value("Authorization"))) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.http_status = 401;
    e.type = "invalid_request_error";
    e.code = "invalid_api_key";
    e.message = req.has_header("Authorization")
                    ? "Incorrect API key provided (Authorization: Bearer <key>)"
                    : "You didn't provide an API key: send it in an Authorization header (Bearer <key>)";
    SendError(res, e);
    return httplib::Server::HandlerResponse::Handled;
  });
  http.Post("/v1/completions", [p](const httplib::Request& req, httplib::Response& res) {
    ConnectionGuard::HandlerStarted();
    p->HandleGenerate(openai::Endpoint::kCompletions, req, res);
  });
  http.Post("/v1/chat/completions", [p](const httplib::Request& req, httplib::Response& res) {
    ConnectionGuard::HandlerStarted();
    p->HandleGenerate(openai::Endpoint::kChatCompletions, req, res);
  });
  http.Get("/v1/models", [p](const httplib::Request&, httplib::Response& res) {
    ConnectionGuard::HandlerStarted();
    res.set_content(openai::Dump(json{{"object", "list"}, {"data", json::array({p->ModelJson()})}}), kJson);
  });
  http.Get(R"(/v1/models/(.+))", [p](const httplib::Request& req, httplib::Response& res) {
    ConnectionGuard::HandlerStarted();
    const std::string id = req.matches[1];
    if (id != p->options.model_id) return SendError(res, openai::ModelNotFound(id));
    res.set_content(openai::Dump(p->ModelJson()), kJson);
  });
  http.Get("/health", [p](const httplib::Request&, httplib::Response& res) {
    ConnectionGuard::HandlerStarted();
    Status s = p->service->CheckModelServices(p->options.health_timeout);
    if (!s.ok()) return SendError(res, openai::ToApiError(s, nullptr));
    res.set_content(R"({"status":"ok"})", kJson);
  });
  http.Get("/metrics", [p](const httplib::Request& req, httplib::Response& res) {
    ConnectionGuard::HandlerStarted();
    if (p->registry == nullptr) return SendError(res, openai::RouteNotFound(req.method, req.path));
    res.set_content(telemetry::SerializeText(*p->registry), telemetry::kTextContentType);
  });
  // Every error response without a body of ours (no route, 413, ...) gets the envelope.
  http.set_error_handler(httplib::Server::HandlerWithResponse([p](const httplib::Request& req,
                                                                   httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e = openai::RouteNotFound(req.method, req.path);
    if (res.status == 413) {
      // Before JSON parsing: the body was skipped, never buffered.
      e.http_status = 413;
      e.type = "invalid_request_error";
      e.code = "request_too_large";
      e.message = "request body larger than " + std::to_string(p->options.max_body_bytes) +
                  " bytes: the prompt cannot fit the model's context window";
    } else if (res.status != 404) {
      e.http_status = res.status;
      e.type = res.status < 500 ? "invalid_request_error" : "server_error";
      e.message = "HTTP " + std::to_string(res.status) + " for " + req.method + " " + req.path;
    }
    SendError(res, e);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    ApiError e;
    e.message = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      e.message = std::string("internal error: ") + ex.what();
    } catch (...) {
    }
    SendError(res, e);
  });
}

StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(GenerationService* service,
                                                             const prometheus::Registry* registry,
                                                             OpenAiServerOptions options,
                                                             ChatPromptRenderer render_chat) {
  if (options.threads < 1) return InvalidArgumentError("http threads: must be >= 1");
  if (options.listen_backlog < 1) return InvalidArgumentError("http listen_backlog: must be >= 1");
  auto impl = std::make_unique<Impl>();
  impl->service = service;
  impl->registry = registry;
  impl->options = std::move(options);
  impl->render_chat = render_chat ? std::move(render_chat) : ChatPromptRenderer(RenderPlainChatPrompt);
  if (impl->options.tls_cert_path.empty() != impl->options.tls_key_path.empty()) {
    return InvalidArgumentError("http tls: give both tls-cert and tls-key");
  }
  for (const std::string& key : impl->options.api_keys) {
    if (key.empty()) return InvalidArgumentError("api_keys: an empty key");
  }
  impl->api_keys = rpc::ApiKeys(impl->options.api_keys);
  if (impl->options.tls_cert_path.empty()) {
    impl->http = std::make_unique<httplib::Server>();
  } else {
    auto ssl = std::make_unique<httplib::SSLServer>(impl->options.tls_cert_path.c_str(),
                                                    impl->options.tls_key_path.c_str());
    if (!ssl->is_valid()) {
      return InvalidArgumentError("tls-cert, tls-key: cannot load " + impl->options.tls_cert_path + " and " +
                                  impl->options.tls_key_path + " as a PEM certificate and its key");
    }
    impl->http = std::move(ssl);
  }
  Impl* p = impl.get();
  httplib::Server& http = *impl->http;
  ConnectionGuardOptions go;
  go.min_threads = impl->options.threads;
  go.max_connections = impl->options.max_connections;
  go.max_connections_per_client = impl->options.max_connections_per_client;
  go.request_deadline = impl->options.request_deadline;
  go.idle_worker_timeout = impl->options.idle_worker_timeout;
  go.plaintext = impl->options.tls_cert_path.empty();
  go.name = "http";
  impl->guard = std::make_unique<ConnectionGuard>(go);
  http.new_task_queue = [p] { return p->guard->NewTaskQueue(); };
  http.set_logger([](const httplib::Request&, const httplib::Response&) { ConnectionGuard::ResponseDone(); });
  http.set_payload_max_length(impl->options.max_body_bytes);
  http.set_keep_alive_max_count(100);  // SDKs keep a connection pool; idle ones close after 5 s
  http.set_read_timeout(30);
  http.set_write_timeout(30);

  impl->RegisterRoutes(http);

  StatusOr<int> port = telemetry::BindHttpServer(&http, impl->options.listen_address, impl->options.listen_backlog);
  if (!port.ok()) {
    return Status(port.status().code(), "OpenAI HTTP API: " + std::string(port.status().message()));
  }
  impl->port = *port;
  impl->guard->set_port(*port);
  impl->listener = std::thread([p] { p->http->listen_after_bind(); });
  telemetry::WaitUntilListening(http);
  return std::unique_ptr<OpenAiServer>(new OpenAiServer(std::move(impl)));
}

}  // namespace lede::coordinator
