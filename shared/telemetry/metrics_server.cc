#include "shared/telemetry/metrics_server.h"

#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include <httplib.h>

namespace lede::telemetry {
namespace {

void SendText(const httplib::Request& req, httplib::Response& res, const char* content_type,
              std::string body) {
  res.status = 200;
  // cpp-httplib answers HEAD through the GET handler and drops the body.
  res.set_content(std::move(body), content_type);
}

}  // namespace

void WaitUntilListening(httplib::Server& server) {
  // stop() is a no-op until listen_after_bind() has marked the server
  // running, so a destructor right after Start() would otherwise hang.
  for (int i = 0; i < 5000 && !server.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

StatusOr<std::pair<std::string, int>> ParseListenAddress(const std::string& address) {
  auto bad = [&] {
    return InvalidArgumentError("listen address \"" + address +
                                "\" is not HOST:PORT with PORT in [0, 65535]");
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return bad();
  std::string host = address.substr(0, colon);
  const std::string port_text = address.substr(colon + 1);
  if (host.find_first_of(":,[] ") != std::string::npos || port_text.size() > 5) return bad();
  int port = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9') return bad();
    port = port * 10 + (c - '0');
  }
  if (port > 65535) return bad();
  return std::make_pair(std::move(host), port);
}

StatusOr<int> BindHttpServer(httplib::Server* server, const std::string& listen_address, int listen_backlog) {
  StatusOr<std::pair<std::string, int>> hp = ParseListenAddress(listen_address);
  if (!hp.ok()) return hp.status();
  if (listen_backlog < 1) {
    return InvalidArgumentError("listen_backlog: " + std::to_string(listen_backlog) + " must be >= 1");
  }
  ::signal(SIGPIPE, SIG_IGN);
  // The library listens with a compiled-in backlog of 5; the socket it
  // creates passes through this callback, and listen() again on a listening
  // socket sets its backlog (Linux), so it is raised right after the bind.
  auto listen_fd = std::make_shared<int>(-1);
  server->set_socket_options([listen_fd](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    *listen_fd = sock;
  });
  int port = hp->second;
  if (port == 0) {
    port = server->bind_to_any_port(hp->first);
    if (port <= 0) port = -1;
  } else if (!server->bind_to_port(hp->first, port)) {
    port = -1;
  }
  if (port < 0) {
    return UnavailableError("cannot listen on " + listen_address +
                            " (port in use, address not local, or host unknown?)");
  }
  if (*listen_fd < 0 || ::listen(*listen_fd, listen_backlog) != 0) {
    server->stop();
    return UnavailableError("cannot set the listen backlog of " + listen_address + " to " +
                            std::to_string(listen_backlog));
  }
  return port;
}

namespace {

constexpr char kPlainText[] = "text/plain; charset=utf-8";

// The answers of the triage thread to connections over a cap: liveness and
// the exposition, which wait on nothing a handler holds; readiness (whose
// check may take its own timeout) is refused for now.
GuardResponse OverCapacity(const Registry* registry, const std::string& method, const std::string& path,
                           const std::string& reason) {
  GuardResponse r;
  r.content_type = kPlainText;
  const bool known = path == "/metrics" || path == "/healthz" || path == "/readyz";
  if (method.empty()) {
    r.body = "server busy: " + reason + "\n";
  } else if (!known) {
    r.status = 404;
    r.retry_after_s = 0;
    r.body = "not found\n";
  } else if (method != "GET" && method != "HEAD") {
    r.status = 405;
    r.retry_after_s = 0;
    r.body = "only GET and HEAD\n";
  } else if (path == "/healthz") {
    r.status = 200;
    r.retry_after_s = 0;
    r.body = "ok\n";
  } else if (path == "/metrics") {
    r.status = 200;
    r.retry_after_s = 0;
    r.content_type = kTextContentType;
    r.body = SerializeText(*registry);
  } else {
    r.body = "not ready: server busy: " + reason + "\n";
  }
  return r;
}

Status CheckOptions(const MetricsServerOptions& o) {
  if (o.min_threads < 1) return InvalidArgumentError("metrics min_threads: must be >= 1");
  if (o.max_connections < 1) return InvalidArgumentError("metrics max_connections: must be >= 1");
  if (o.max_connections_per_client < 1) {
    return InvalidArgumentError("metrics max_connections_per_client: must be >= 1");
  }
  if (o.request_deadline <= absl::ZeroDuration()) {
    return InvalidArgumentError("metrics request_deadline: must be positive");
  }
  if (o.idle_worker_timeout <= absl::ZeroDuration()) {
    return InvalidArgumentError("metrics idle_worker_timeout: must be positive");
  }
  if (o.triage_deadline <= absl::ZeroDuration()) {
    return InvalidArgumentError("metrics triage_deadline: must be positive");
  }
  return OkStatus();
}

}  // namespace

MetricsServer::MetricsServer(const Registry& registry, std::string listen_address)
    : registry_(registry), listen_address_(std::move(listen_address)),
      http_(std::make_unique<httplib::Server>()) {}

MetricsServer::~MetricsServer() {
  http_->stop();
  if (guard_) guard_->ShutdownIdle();  // slow clients release their workers now
  if (listener_.joinable()) listener_.join();
}

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const Registry& registry,
                                                              std::string listen_address,
                                                              std::function<Status()> readiness,
                                                              MetricsServerOptions options) {
  if (Status s = CheckOptions(options); !s.ok()) return s;
  std::unique_ptr<MetricsServer> server(new MetricsServer(registry, std::move(listen_address)));
  server->readiness_ = std::move(readiness);
  httplib::Server& http = *server->http_;
  ConnectionGuardOptions go;
  go.name = "metrics";
  go.min_threads = options.min_threads;
  go.idle_worker_timeout = options.idle_worker_timeout;
  go.max_connections = options.max_connections;
  go.max_connections_per_client = options.max_connections_per_client;
  go.request_deadline = options.request_deadline;
  go.triage_deadline = options.triage_deadline;
  const Registry* reg = &server->registry_;
  go.over_capacity = [reg](const std::string& method, const std::string& path, const std::string& reason) {
    return OverCapacity(reg, method, path, reason);
  };
  server->guard_ = std::make_unique<ConnectionGuard>(go);
  ConnectionGuard* guard = server->guard_.get();
  http.new_task_queue = [guard] { return guard->NewTaskQueue(); };
  http.set_logger([](const httplib::Request&, const httplib::Response&) { ConnectionGuard::ResponseDone(); });
  http.set_keep_alive_max_count(1);  // one request per connection: a scrape reconnects
  http.set_read_timeout(10);
  http.set_write_timeout(10);
  http.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    ConnectionGuard::HandlerStarted();
    const bool known = req.path == "/metrics" || req.path == "/healthz" || req.path == "/readyz";
    if (known && req.method != "GET" && req.method != "HEAD") {
      res.status = 405;
      res.set_content("only GET and HEAD\n", "text/plain; charset=utf-8");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!known) {
      res.status = 404;
      res.set_content("not found\n", "text/plain; charset=utf-8");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.Get("/metrics", [reg](const httplib::Request& req, httplib::Response& res) {
    SendText(req, res, kTextContentType, SerializeText(*reg));
  });
  http.Get("/healthz", [](const httplib::Request& req, httplib::Response& res) {
    SendText(req, res, "text/plain; charset=utf-8", "ok\n");
  });
  const std::function<Status()>* ready = &server->readiness_;
  http.Get("/readyz", [ready](const httplib::Request& req, httplib::Response& res) {
    const Status s = *ready ? (*ready)() : OkStatus();
    SendText(req, res, "text/plain; charset=utf-8",
             s.ok() ? std::string("ready\n") : "not ready: " + std::string(s.message()) + "\n");
    if (!s.ok()) res.status = 503;
  });
  StatusOr<int> port = BindHttpServer(&http, server->listen_address_, options.listen_backlog);
  if (!port.ok()) {
    return Status(port.status().code(), "cannot serve metrics: " + std::string(port.status().message()));
  }
  server->port_ = *port;
  guard->set_port(*port);
  server->listener_ = std::thread([&http] { http.listen_after_bind(); });
  WaitUntilListening(http);
  return server;
}

}  // namespace lede::telemetry
