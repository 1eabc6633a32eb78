#include "shared/telemetry/metrics_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <dlfcn.h>
#include <pthread.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

// Debian's libcivetweb starts its threads with a compiled-in stack size
// (USE_STACK_SIZE, about 100 KiB). glibc carves a thread's static TLS out of
// its stack, and a process that loads libtorch has more static TLS than that,
// so pthread_create() fails with EINVAL ("Cannot create first worker
// thread") in the drafter and verifier. This definition interposes libc's
// for every caller in the process (libcivetweb calls it through its PLT) and
// raises requests below kMinThreadStackBytes to it; larger ones pass through.
namespace {
constexpr size_t kMinThreadStackBytes = size_t{2} << 20;
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stack_size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real(attr, std::max(stack_size, kMinThreadStackBytes));
}

namespace lede::telemetry {
namespace {

constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// Splits "HOST:PORT"; false unless HOST is non-empty, contains no ':' or ','
// (no IPv6, no civetweb port lists) and PORT is 1-5 digits <= 65535.
bool ParseHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
  *host = address.substr(0, colon);
  const std::string port_text = address.substr(colon + 1);
  if (host->find_first_of(":,[] ") != std::string::npos) return false;
  if (port_text.size() > 5) return false;
  int p = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9') return false;
    p = p * 10 + (c - '0');
  }
  if (p > 65535) return false;
  *port = p;
  return true;
}

// civetweb keeps process-wide state; initialise it once and never tear it
// down (mg_exit_library while another server runs would break it).
void InitCivetwebOnce() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

bool IsReadMethod(const mg_request_info* ri) {
  return std::strcmp(ri->request_method, "GET") == 0 ||
         std::strcmp(ri->request_method, "HEAD") == 0;
}

int SendBody(mg_connection* conn, const mg_request_info* ri, const char* content_type,
             const std::string& body) {
  mg_send_http_ok(conn, content_type, static_cast<long long>(body.size()));
  if (std::strcmp(ri->request_method, "HEAD") != 0) mg_write(conn, body.data(), body.size());
  return 200;
}

// Handlers return the HTTP status they sent (civetweb: non-zero = handled).
// "/metrics" also matches "/metrics/..." in civetweb, hence the exact check.
int HandleMetrics(mg_connection* conn, void* cbdata) {
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri->local_uri == nullptr || std::strcmp(ri->local_uri, "/metrics") != 0) {
    mg_send_http_error(conn, 404, "not found\n");
    return 404;
  }
  if (!IsReadMethod(ri)) {
    mg_send_http_error(conn, 405, "only GET and HEAD\n");
    return 405;
  }
  const auto* registry = static_cast<const Registry*>(cbdata);
  return SendBody(conn, ri, kMetricsContentType, registry->Serialize());
}

int HandleHealthz(mg_connection* conn, void* /*cbdata*/) {
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri->local_uri == nullptr || std::strcmp(ri->local_uri, "/healthz") != 0) {
    mg_send_http_error(conn, 404, "not found\n");
    return 404;
  }
  if (!IsReadMethod(ri)) {
    mg_send_http_error(conn, 405, "only GET and HEAD\n");
    return 405;
  }
  return SendBody(conn, ri, "text/plain; charset=utf-8", "ok\n");
}

// Everything else: 404 (there is no document_root, but say it explicitly).
int HandleOther(mg_connection* conn, void* /*cbdata*/) {
  mg_send_http_error(conn, 404, "not found\n");
  return 404;
}

// Keep civetweb quiet on stderr; failures to start come back through
// mg_start2's error text instead.
int LogMessage(const mg_connection* /*conn*/, const char* /*message*/) { return 1; }

// Opens and closes one TCP connection to host:port (IPv4), ignoring errors.
// A wildcard host is reached through the loopback address.
void PokeListener(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string target = (host == "0.0.0.0") ? "127.0.0.1" : host;
  if (getaddrinfo(target.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const bool connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
    if (connected) break;
  }
  freeaddrinfo(res);
}

}  // namespace

MetricsServer::MetricsServer(const Registry& registry, std::string listen_address)
    : registry_(registry), listen_address_(std::move(listen_address)) {}

// civetweb 1.15's listener thread re-checks its stop flag only between
// poll() calls of 2 s (SOCKET_TIMEOUT_QUANTUM, compiled in), so a bare
// mg_stop() takes ~2 s. While it runs, we connect to our own port every few
// milliseconds: each connection wakes poll() and the listener sees the flag.
MetricsServer::~MetricsServer() {
  if (ctx_ == nullptr) return;
  std::atomic<bool> stopped{false};
  std::thread stopper([this, &stopped] {
    mg_stop(ctx_);  // joins all civetweb threads
    stopped.store(true);
  });
  const std::string host = listen_address_.substr(0, listen_address_.rfind(':'));
  while (!stopped.load()) {
    if (port_ > 0) PokeListener(host, port_);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stopper.join();
}

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const Registry& registry,
                                                              std::string listen_address) {
  std::string host;
  int requested_port = 0;
  if (!ParseHostPort(listen_address, &host, &requested_port)) {
    return InvalidArgumentError("metrics listen address \"" + listen_address +
                                "\" is not HOST:PORT with PORT in [0, 65535]");
  }
  InitCivetwebOnce();

  std::unique_ptr<MetricsServer> server(new MetricsServer(registry, std::move(listen_address)));
  const std::string threads = std::to_string(kServerThreads);
  const char* options[] = {
      "listening_ports", server->listen_address_.c_str(),
      "num_threads", threads.c_str(),
      "enable_keep_alive", "no",
      "request_timeout_ms", "10000",
      nullptr,
  };
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = &LogMessage;
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.user_data = nullptr;
  init.configuration_options = options;
  unsigned error_code = 0;
  char error_text[256] = {0};
  mg_error_data error{};
  error.code = &error_code;
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);

  server->ctx_ = mg_start2(&init, &error);
  if (server->ctx_ == nullptr) {
    return UnavailableError("cannot serve metrics on " + server->listen_address_ + ": " +
                            (error_text[0] != '\0' ? error_text : "civetweb failed to start") +
                            " (port in use, address not local, or host unknown?)");
  }
  mg_set_request_handler(server->ctx_, "/metrics", &HandleMetrics,
                         const_cast<Registry*>(&server->registry_));
  mg_set_request_handler(server->ctx_, "/healthz", &HandleHealthz, nullptr);
  mg_set_request_handler(server->ctx_, "/", &HandleOther, nullptr);

  mg_server_port ports[2];
  std::memset(ports, 0, sizeof(ports));
  const int n = mg_get_server_ports(server->ctx_, 2, ports);
  if (n < 1 || ports[0].port <= 0) {
    // ~MetricsServer stops civetweb.
    return InternalError("metrics server on " + server->listen_address_ +
                         " started but reported no listening port");
  }
  server->port_ = ports[0].port;
  return server;
}

}  // namespace lede::telemetry
