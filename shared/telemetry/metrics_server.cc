#include "shared/telemetry/metrics_server.h"

#include <signal.h>
#include <sys/socket.h>

#include <chrono>
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

StatusOr<int> BindHttpServer(httplib::Server* server, const std::string& listen_address) {
  StatusOr<std::pair<std::string, int>> hp = ParseListenAddress(listen_address);
  if (!hp.ok()) return hp.status();
  ::signal(SIGPIPE, SIG_IGN);
  server->set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
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
  return port;
}

MetricsServer::MetricsServer(const Registry& registry, std::string listen_address)
    : registry_(registry), listen_address_(std::move(listen_address)),
      http_(std::make_unique<httplib::Server>()) {}

MetricsServer::~MetricsServer() {
  http_->stop();
  if (listener_.joinable()) listener_.join();
}

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const Registry& registry,
                                                              std::string listen_address,
                                                              std::function<Status()> readiness) {
  std::unique_ptr<MetricsServer> server(new MetricsServer(registry, std::move(listen_address)));
  server->readiness_ = std::move(readiness);
  httplib::Server& http = *server->http_;
  http.new_task_queue = [] { return new httplib::ThreadPool(kServerThreads); };
  http.set_keep_alive_max_count(1);  // a slow client holds a worker for one request only
  http.set_read_timeout(10);
  http.set_write_timeout(10);
  const Registry* reg = &server->registry_;
  http.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
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
  StatusOr<int> port = BindHttpServer(&http, server->listen_address_);
  if (!port.ok()) {
    return Status(port.status().code(), "cannot serve metrics: " + std::string(port.status().message()));
  }
  server->port_ = *port;
  server->listener_ = std::thread([&http] { http.listen_after_bind(); });
  WaitUntilListening(http);
  return server;
}

}  // namespace lede::telemetry
