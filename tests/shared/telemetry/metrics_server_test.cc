// Tests of the defences of shared/telemetry/metrics_server.h and
// connection_guard.h: the metrics/health port keeps answering /healthz and
// /metrics while slow clients trickle header lines or a readiness check
// blocks, cuts the slow clients, queues bursts in a large listen backlog and
// shrinks its worker pool back after a burst. Deadlines in these tests only
// detect a hang; none asserts a latency.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/telemetry/connection_guard.h"
#include "shared/telemetry/metrics.h"
#include "shared/telemetry/metrics_server.h"
#include "tests/shared/telemetry/telemetry_test_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace lede::telemetry {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using test_util::HttpGet;
using test_util::HttpResponse;
using test_util::RunShell;

// A blocking TCP connection to 127.0.0.1:port, -1 on failure.
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Connections that send the start of a request, then one more header line
// every `every` and never finish their headers (the probe's slow client).
// Records, per connection, what the server sent and whether it closed it.
class Tricklers {
 public:
  Tricklers(int port, int n, std::chrono::milliseconds every) : every_(every) {
    for (int i = 0; i < n; ++i) {
      const int fd = Connect(port);
      if (fd >= 0) {
        const std::string start = "GET /metrics HTTP/1.1\r\nHost: slow\r\n";
        (void)::send(fd, start.data(), start.size(), MSG_NOSIGNAL);
      }
      fds_.push_back(fd);
    }
    closed_ = std::vector<std::atomic<bool>>(fds_.size());
    answers_.resize(fds_.size());
    thread_ = std::thread([this] { Run(); });
  }
  ~Tricklers() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  int opened() const {
    int n = 0;
    for (int fd : fds_) n += fd >= 0 ? 1 : 0;
    return n;
  }
  int closed() const {
    int n = 0;
    for (const auto& c : closed_) n += c.load() ? 1 : 0;
    return n;
  }
  // Connections that were answered with `text` in the first bytes the
  // server sent (read once they are closed).
  int answered_with(const std::string& text) const {
    int n = 0;
    for (size_t i = 0; i < fds_.size(); ++i) {
      if (closed_[i].load() && answers_[i].find(text) != std::string::npos) ++n;
    }
    return n;
  }

 private:
  void Run() {
    while (!stop_) {
      for (size_t i = 0; i < fds_.size(); ++i) {
        if (fds_[i] < 0 || closed_[i]) continue;
        char buf[1024];
        ssize_t n;
        while ((n = ::recv(fds_[i], buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
          answers_[i].append(buf, static_cast<size_t>(n));
        }
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
          closed_[i] = true;
          continue;
        }
        const std::string line = "X-Slow: 1\r\n";
        if (::send(fds_[i], line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN) {
          closed_[i] = true;
        }
      }
      std::this_thread::sleep_for(every_);
    }
  }

  const std::chrono::milliseconds every_;
  std::vector<int> fds_;
  std::vector<std::atomic<bool>> closed_;
  std::vector<std::string> answers_;  // only the trickling thread writes, before closed_
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

int ThreadsOfThisProcess() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

// A short-deadline configuration, so slow clients are cut within the test.
MetricsServerOptions FastOptions() {
  MetricsServerOptions o;
  o.request_deadline = absl::Milliseconds(800);
  o.triage_deadline = absl::Milliseconds(400);
  return o;
}

// 50 connections trickling a header line every 100 ms (the probe froze the
// port with 4): /healthz and /metrics keep answering 200 throughout, the
// connections over the caps get a 503 with Retry-After, and every slow
// connection is closed in the end.
TEST(MetricsServerDefenceTest, SlowClientsDoNotFreezeHealthOrMetrics) {
  Registry r;
  prometheus::BuildCounter().Name("lede_x_total").Help("help").Register(r).Add({}).Increment(3);
  auto server = MetricsServer::Start(r, "127.0.0.1:0", nullptr, FastOptions());
  ASSERT_THAT(server, IsOk());
  const int port = (*server)->port();
  Tricklers slow(port, 50, std::chrono::milliseconds(100));
  ASSERT_EQ(slow.opened(), 50);
  for (int i = 0; i < 6; ++i) {
    HttpResponse health = HttpGet(port, "/healthz");
    ASSERT_EQ(health.status, 200) << "probe " << i << " with 50 slow clients";
    EXPECT_EQ(health.body, "ok\n");
    HttpResponse metrics = HttpGet(port, "/metrics");
    ASSERT_EQ(metrics.status, 200) << "scrape " << i << " with 50 slow clients";
    EXPECT_THAT(metrics.body, HasSubstr("lede_x_total 3\n"));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(lede::testing::WaitUntil([&] { return slow.closed() == 50; }))
      << slow.closed() << " of 50 slow connections closed";
  EXPECT_GE(slow.answered_with("503 Service Unavailable"), 1);
  EXPECT_GE(slow.answered_with("Retry-After: 1"), 1);
  const ConnectionGuard::Stats stats = (*server)->connection_stats();
  EXPECT_GE(stats.timed_out, 1);  // the slow clients within the caps
  EXPECT_GE(stats.refused, 50 - MetricsServerOptions().max_connections_per_client);
}

// A readiness check that blocks holds only the workers of its own /readyz
// requests: over the caps /readyz is 503 at once, and /healthz and /metrics
// are 200.
TEST(MetricsServerDefenceTest, BlockedReadinessDoesNotBlockHealthz) {
  Registry r;
  absl::Notification release;
  std::atomic<int> in_check{0};
  MetricsServerOptions o = FastOptions();
  o.max_connections = o.max_connections_per_client = 4;
  o.min_threads = 1;
  auto server = MetricsServer::Start(
      r, "127.0.0.1:0",
      [&] {
        ++in_check;
        release.WaitForNotification();
        return OkStatus();
      },
      o);
  ASSERT_THAT(server, IsOk());
  const int port = (*server)->port();
  std::vector<std::thread> readers;
  std::vector<int> ready_status(4);
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&, i] { ready_status[i] = HttpGet(port, "/readyz").status; });
  }
  ASSERT_TRUE(lede::testing::WaitUntil([&] { return in_check.load() == 4; }));
  EXPECT_EQ(HttpGet(port, "/healthz").status, 200);
  EXPECT_EQ(HttpGet(port, "/metrics").status, 200);
  HttpResponse busy = HttpGet(port, "/readyz");
  EXPECT_EQ(busy.status, 503);
  EXPECT_THAT(busy.body, HasSubstr("not ready"));
  EXPECT_EQ(HttpGet(port, "/nope").status, 404);
  release.Notify();
  for (std::thread& t : readers) t.join();
  for (int s : ready_status) EXPECT_EQ(s, 200);
}

// The listening socket's backlog is 4096 (capped by net.core.somaxconn), not
// cpp-httplib's 5: `ss` reports a listener's backlog as its Send-Q.
TEST(MetricsServerDefenceTest, ListenBacklogIsLikeGrpcs) {
  if (!test_util::FileExecutable("/usr/bin/ss") && !test_util::FileExecutable("/bin/ss")) {
    GTEST_SKIP() << "no ss (iproute2) to read the backlog";
  }
  int somaxconn = 4096;
  std::ifstream("/proc/sys/net/core/somaxconn") >> somaxconn;
  Registry r;
  auto server = MetricsServer::Start(r, "127.0.0.1:0");
  ASSERT_THAT(server, IsOk());
  auto [rc, out] = RunShell("ss -Hltn 'sport = :" + std::to_string((*server)->port()) + "'");
  ASSERT_EQ(rc, 0) << out;
  std::istringstream fields(out);
  std::string state;
  long recv_q = -1, send_q = -1;
  fields >> state >> recv_q >> send_q;
  EXPECT_EQ(send_q, std::min(4096, somaxconn)) << out;

  MetricsServerOptions bad;
  bad.listen_backlog = 0;
  EXPECT_THAT(MetricsServer::Start(r, "127.0.0.1:0", nullptr, bad), StatusIs(StatusCode::kInvalidArgument));
  bad = MetricsServerOptions();
  bad.max_connections = 0;
  EXPECT_THAT(MetricsServer::Start(r, "127.0.0.1:0", nullptr, bad), StatusIs(StatusCode::kInvalidArgument));
}

// After a burst of 30 open connections the workers beyond min_threads exit,
// even while a request arrives every 20 ms (each one used to restart every
// idle worker's timer, so a trickle of traffic kept the burst's threads).
TEST(MetricsServerDefenceTest, WorkersShrinkBackUnderATrickle) {
  Registry r;
  MetricsServerOptions o;
  o.min_threads = 2;
  o.idle_worker_timeout = absl::Milliseconds(300);
  o.max_connections = o.max_connections_per_client = 64;
  o.request_deadline = absl::Seconds(60);
  auto server = MetricsServer::Start(r, "127.0.0.1:0", nullptr, o);
  ASSERT_THAT(server, IsOk());
  const int port = (*server)->port();
  const int before = ThreadsOfThisProcess();
  {
    Tricklers burst(port, 30, std::chrono::milliseconds(100));
    ASSERT_TRUE(lede::testing::WaitUntil([&] { return (*server)->connection_stats().open == 30; }));
    // A connection counts as open before the pool has started its worker:
    // wait for the workers too (an instant check failed under ctest -j2).
    EXPECT_TRUE(lede::testing::WaitUntil([&] { return (*server)->connection_stats().threads >= 30; }))
        << (*server)->connection_stats().threads << " workers for 30 open connections";
  }
  EXPECT_TRUE(lede::testing::WaitUntil(
      [&] {
        EXPECT_EQ(HttpGet(port, "/healthz").status, 200);
        return (*server)->connection_stats().threads <= 3;
      },
      lede::testing::kWaitBound, std::chrono::milliseconds(20)))
      << (*server)->connection_stats().threads << " workers still running";
  EXPECT_LE(ThreadsOfThisProcess(), before + 1);
}

// A connection over the caps that sends its request and its body gets the
// triage's answer and a clean close (EOF), not a reset, even though the
// server never reads its body through a handler.
TEST(MetricsServerDefenceTest, OverCapacityConnectionsCloseCleanly) {
  Registry r;
  MetricsServerOptions o = FastOptions();
  o.max_connections = o.max_connections_per_client = 1;
  o.request_deadline = absl::Seconds(60);
  auto server = MetricsServer::Start(r, "127.0.0.1:0", nullptr, o);
  ASSERT_THAT(server, IsOk());
  const int port = (*server)->port();
  Tricklers holder(port, 1, std::chrono::milliseconds(100));
  ASSERT_TRUE(lede::testing::WaitUntil([&] { return (*server)->connection_stats().open == 1; }));
  for (int i = 0; i < 20; ++i) {
    const int fd = Connect(port);
    ASSERT_GE(fd, 0);
    timeval tv{30, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const std::string body(4000, 'x');
    const std::string request = "POST /other HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
                                "\r\n\r\n" + body;
    ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
    std::string answer;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) answer.append(buf, static_cast<size_t>(n));
    EXPECT_EQ(n, 0) << "connection " << i << ": " << std::strerror(errno);
    EXPECT_THAT(answer, HasSubstr("HTTP/1.1 404 Not Found\r\n"));
    ::close(fd);
  }
  EXPECT_GE((*server)->connection_stats().triaged_answered, 20);
}

}  // namespace
}  // namespace lede::telemetry
