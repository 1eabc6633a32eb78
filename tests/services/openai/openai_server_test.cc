// Tests of services/coordinator/openai_server.h in-process, with model
// services that are down (nothing listens on their ports): routing, the
// error envelope for errors before and without a model, /health's 503, and
// /metrics. The deployment with real clients is openai_e2e_test.cc.
#include "services/coordinator/openai_server.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "shared/telemetry/metrics.h"
#include "shared/tokenizer/model_files.h"
#include "tests/shared/telemetry/telemetry_test_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace lede::coordinator {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;
using nlohmann::json;

class OpenAiServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = tokenizer::FindTokenizerFile(std::string(LEDE_SOURCE_DIR) + "/models/lede-tiny");
    ASSERT_THAT(tokenizer, IsOk());
    CoordinatorOptions o;
    o.tokenizer_path = *tokenizer;
    const int dead = telemetry::test_util::FreePort();  // nothing listens there
    o.verifier_target = o.drafter_target = "127.0.0.1:" + std::to_string(dead);
    o.rpc_timeout = absl::Seconds(2);
    o.max_new_tokens_limit = 64;
    auto service = GenerationService::Create(o, &registry_);
    ASSERT_THAT(service, IsOk());
    service_ = std::move(*service);
    OpenAiServerOptions so;
    so.listen_address = "127.0.0.1:0";
    so.model_id = "m";
    so.threads = 4;
    so.health_timeout = absl::Milliseconds(200);
    auto server = OpenAiServer::Start(service_.get(), &registry_, so, RenderPlainChatPrompt);
    ASSERT_THAT(server, IsOk());
    server_ = std::move(*server);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(10);
  }

  // {status, parsed body}.
  std::pair<int, json> Post(const std::string& path, const std::string& body) {
    auto r = client_->Post(path.c_str(), body, "application/json");
    if (!r) return {0, nullptr};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::pair<int, json> Get(const std::string& path) {
    auto r = client_->Get(path.c_str());
    if (!r) return {0, nullptr};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  telemetry::Registry registry_;
  std::unique_ptr<GenerationService> service_;
  std::unique_ptr<OpenAiServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

// /v1/models and /v1/models/{id} list the served model; others are 404.
TEST_F(OpenAiServerTest, ListsTheServedModel) {
  auto [status, body] = Get("/v1/models");
  EXPECT_EQ(status, 200);
  EXPECT_EQ(body["object"], "list");
  ASSERT_EQ(body["data"].size(), 1u);
  EXPECT_EQ(body["data"][0]["id"], "m");
  EXPECT_EQ(body["data"][0]["owned_by"], "lede");
  EXPECT_EQ(Get("/v1/models/m").first, 200);
  auto [missing, err] = Get("/v1/models/other");
  EXPECT_EQ(missing, 404);
  EXPECT_EQ(err["error"]["code"], "model_not_found");
}

// Validation that needs no model answers 400 even with the model services
// down; a request that needs them is 503, streamed or not (no 200 first).
TEST_F(OpenAiServerTest, ErrorsBeforeTheModelAreHttpErrors) {
  auto [bad, e1] = Post("/v1/completions", R"({"prompt": "a", "max_tokens": 0})");
  EXPECT_EQ(bad, 400);
  EXPECT_EQ(e1["error"]["param"], "max_tokens");
  auto [bad_chat, e2] = Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}], "temperature": -2})");
  EXPECT_EQ(bad_chat, 400);
  EXPECT_EQ(e2["error"]["param"], "temperature");
  auto [down, e3] = Post("/v1/completions", R"({"prompt": "a", "max_tokens": 4})");
  EXPECT_EQ(down, 503);
  EXPECT_EQ(e3["error"]["type"], "unavailable_error");
  auto [down_stream, e4] = Post("/v1/chat/completions",
                                R"({"messages": [{"role": "user", "content": "a"}], "stream": true})");
  EXPECT_EQ(down_stream, 503);
  EXPECT_EQ(e4["error"]["type"], "unavailable_error");
  auto [wrong_model, e5] = Post("/v1/completions", R"({"model": "gpt-4", "prompt": "a"})");
  EXPECT_EQ(wrong_model, 404);
  EXPECT_EQ(e5["error"]["param"], "model");
  auto [not_json, e6] = Post("/v1/completions", "{");
  EXPECT_EQ(not_json, 400);
  EXPECT_TRUE(e6["error"]["param"].is_null());
}

// Unknown routes and methods are 404 in the envelope; /health is 503 while
// the model services are down; /metrics counts the failed requests.
TEST_F(OpenAiServerTest, RoutesHealthAndMetrics) {
  auto [route, e1] = Get("/v1/engines");
  EXPECT_EQ(route, 404);
  EXPECT_EQ(e1["error"]["type"], "not_found_error");
  auto [method, e2] = Get("/v1/completions");
  EXPECT_EQ(method, 404);
  EXPECT_EQ(e2["error"]["type"], "not_found_error");
  auto [health, e3] = Get("/health");
  EXPECT_EQ(health, 503);
  EXPECT_THAT(e3["error"]["message"].get<std::string>(), HasSubstr("verifier"));
  Post("/v1/completions", R"({"prompt": "a", "max_tokens": 4})");
  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("lede_requests_total{method=\"lede\",status=\"UNAVAILABLE\"} 1"));
}

// A taken port fails to start, naming the address.
TEST_F(OpenAiServerTest, PortInUseIsUnavailable) {
  OpenAiServerOptions so;
  so.listen_address = "127.0.0.1:" + std::to_string(server_->port());
  auto second = OpenAiServer::Start(service_.get(), &registry_, so, RenderPlainChatPrompt);
  EXPECT_THAT(second, StatusIs(StatusCode::kUnavailable));
  if (!second.ok()) {
    EXPECT_THAT(std::string(second.status().message()), HasSubstr(so.listen_address));
  }
  so.listen_address = "nonsense";
  EXPECT_THAT(OpenAiServer::Start(service_.get(), &registry_, so, RenderPlainChatPrompt),
              StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lede::coordinator

namespace lede::coordinator {
namespace {

// A raw TCP connection to 127.0.0.1:port (-1 on failure).
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{0, 200000};  // reads wait at most 0.2 s
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Slow clients (headers that never end), idle
// connections and floods of connections.
class OpenAiConnectionTest : public OpenAiServerTest {
 protected:
  void Restart(OpenAiServerOptions so) {
    server_.reset();
    so.listen_address = "127.0.0.1:0";
    so.model_id = "m";
    auto server = OpenAiServer::Start(service_.get(), &registry_, so, RenderPlainChatPrompt);
    ASSERT_THAT(server, IsOk());
    server_ = std::move(*server);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(10);
  }
  void TearDown() override {
    for (int fd : raw_) ::close(fd);
  }
  // Opens n connections that send the start of a request and never finish
  // its headers.
  void OpenSlowClients(int n) {
    for (int i = 0; i < n; ++i) {
      const int fd = Connect(server_->port());
      ASSERT_GE(fd, 0);
      const std::string start = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
      ASSERT_EQ(::send(fd, start.data(), start.size(), MSG_NOSIGNAL), static_cast<ssize_t>(start.size()));
      raw_.push_back(fd);
    }
  }
  std::vector<int> raw_;
};

// More slow clients than worker threads: every other request is still
// served (with a fixed pool of 2 workers it waited for the slow ones' read
// timeouts, longer than this client's 10 s).
TEST_F(OpenAiConnectionTest, SlowClientsDoNotHoldOtherRequests) {
  OpenAiServerOptions so;
  so.threads = 2;
  so.request_deadline = absl::Seconds(120);
  Restart(so);
  OpenSlowClients(24);
  ASSERT_TRUE(lede::testing::WaitUntil([&] { return server_->connection_stats().open == 24; }));
  for (int i = 0; i < 5; ++i) {
    auto [status, body] = Get("/v1/models");
    EXPECT_EQ(status, 200) << "request " << i << " with 24 slow clients open";
  }
  EXPECT_EQ(server_->connection_stats().timed_out, 0);
  EXPECT_GE(server_->connection_stats().threads, 25);
}

// After a burst, the workers beyond `threads` exit once idle: the pool
// shrinks back to its floor and still serves.
TEST_F(OpenAiConnectionTest, WorkerPoolShrinksAfterABurst) {
  OpenAiServerOptions so;
  so.threads = 2;
  so.request_deadline = absl::Seconds(120);
  so.idle_worker_timeout = absl::Milliseconds(200);
  Restart(so);
  OpenSlowClients(12);
  // A connection counts as open when accepted, a moment before its worker
  // starts (measured under load: 11 workers with 12 open in 14 of 200
  // runs), so wait for both.
  ASSERT_TRUE(lede::testing::WaitUntil([&] {
    const auto stats = server_->connection_stats();
    return stats.open == 12 && stats.threads >= 12;
  })) << "workers: " << server_->connection_stats().threads;
  for (int fd : raw_) ::close(fd);
  raw_.clear();
  ASSERT_TRUE(lede::testing::WaitUntil([&] { return server_->connection_stats().threads == 2; }))
      << "workers still running: " << server_->connection_stats().threads;
  EXPECT_GE(server_->connection_stats().threads_started, 12);
  EXPECT_EQ(Get("/v1/models").first, 200);
  EXPECT_EQ(Get("/v1/models").first, 200);
}

// A request whose headers do not arrive within the deadline is cut, even
// though its client sends a byte every 100 ms; a request in its handler or
// streaming is not.
TEST_F(OpenAiConnectionTest, RequestDeadlineCutsTricklingClients) {
  OpenAiServerOptions so;
  so.threads = 2;
  so.request_deadline = absl::Milliseconds(500);
  Restart(so);
  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  raw_.push_back(fd);
  const std::string request = "GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
  bool closed = false;
  for (int i = 0; i < 400 && !closed; ++i) {  // at most 40 s of trickling (a broken build)
    const char byte = i < static_cast<int>(request.size()) ? request[i] : 'a';
    if (::send(fd, &byte, 1, MSG_NOSIGNAL) != 1) closed = true;
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) closed = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(closed) << "the trickling client was never cut";
  EXPECT_GE(server_->connection_stats().timed_out, 1);
  // A normal request on a kept-alive connection is served.
  EXPECT_EQ(Get("/v1/models").first, 200);
  EXPECT_EQ(Get("/v1/models").first, 200);
}

// A connection over the per-client cap gets a 503 from the triage thread as
// soon as its request head is there, and a clean close; when one closes,
// requests are served again.
TEST_F(OpenAiConnectionTest, ConnectionCapsRefuseTheExcessAtOnce) {
  OpenAiServerOptions so;
  so.threads = 2;
  so.max_connections_per_client = 3;
  so.request_deadline = absl::Seconds(120);
  Restart(so);
  OpenSlowClients(3);
  ASSERT_TRUE(lede::testing::WaitUntil([&] { return server_->connection_stats().open == 3; }));
  const int extra = Connect(server_->port());
  ASSERT_GE(extra, 0);
  raw_.push_back(extra);
  const std::string request = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(extra, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  std::string answer;
  ASSERT_TRUE(lede::testing::WaitUntil([&] {
    char buf[512];
    const ssize_t n = ::recv(extra, buf, sizeof(buf), 0);
    if (n > 0) answer.append(buf, static_cast<size_t>(n));
    return n == 0;  // the server closed it after its answer
  }));
  EXPECT_THAT(answer, HasSubstr("503"));
  EXPECT_THAT(answer, HasSubstr("too_many_connections"));
  EXPECT_EQ(server_->connection_stats().refused, 1);
  ::close(raw_[0]);
  raw_.erase(raw_.begin());
  ASSERT_TRUE(lede::testing::WaitUntil([&] { return server_->connection_stats().open == 2; }));
  EXPECT_EQ(Get("/v1/models").first, 200);
}


// A burst of 300 concurrent completions against a server with room for 32
// connections: every connection gets an HTTP answer, 200, 429 or 503 with a
// JSON error (503 + Retry-After for those over the cap), and none is reset
// (the listen backlog was 5 and refused connections were closed unread).
TEST_F(OpenAiConnectionTest, BurstIsAnsweredNeverReset) {
  OpenAiServerOptions so;
  so.threads = 2;
  so.max_connections = so.max_connections_per_client = 32;
  Restart(so);
  const int port = server_->port();
  constexpr int kClients = 300;
  std::vector<std::string> answers(kClients);
  std::vector<std::string> failures(kClients);
  std::atomic<bool> go{false};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      timeval tv{30, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        failures[i] = std::string("connect: ") + std::strerror(errno);
        ::close(fd);
        return;
      }
      const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 4})";
      const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  "Connection: close\r\nContent-Length: " +
                                  std::to_string(body.size()) + "\r\n\r\n" + body;
      if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
        failures[i] = std::string("send: ") + std::strerror(errno);
      }
      char buf[4096];
      ssize_t n;
      while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) answers[i].append(buf, static_cast<size_t>(n));
      if (n < 0 && failures[i].empty()) failures[i] = std::string("recv: ") + std::strerror(errno);
      ::close(fd);
    });
  }
  go = true;
  for (std::thread& t : clients) t.join();
  int over_capacity = 0;
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(failures[i], "") << "client " << i;
    const std::string& a = answers[i];
    ASSERT_EQ(a.compare(0, 9, "HTTP/1.1 "), 0) << "client " << i << " got: " << a;
    const int status = std::atoi(a.c_str() + 9);
    EXPECT_THAT(status, ::testing::AnyOf(200, 429, 503)) << a;
    const size_t split = a.find("\r\n\r\n");
    ASSERT_NE(split, std::string::npos);
    const json body = json::parse(a.substr(split + 4), nullptr, false);
    if (status != 200) {
      EXPECT_TRUE(body.contains("error")) << a;
    }
    if (a.find("too_many_connections") != std::string::npos) {
      ++over_capacity;
      EXPECT_THAT(a, HasSubstr("Retry-After: 1\r\n"));
    }
  }
  EXPECT_EQ(server_->connection_stats().refused, over_capacity);
}

}  // namespace
}  // namespace lede::coordinator
