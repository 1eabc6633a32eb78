// End-to-end test of shared/telemetry against a real Prometheus: it scrapes
// a MetricsServer and evaluates the acceptance-rate dashboard query.
// ctest label `integration`: it starts a process and waits for scrapes
// (about 5 s); skipped when /usr/bin/prometheus is absent.
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "shared/telemetry/lede_metrics.h"
#include "shared/telemetry/metrics.h"
#include "shared/telemetry/metrics_server.h"
#include "tests/shared/telemetry/telemetry_test_util.h"
#include "tests/testing/child_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace lede::telemetry {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::ChildProcess;
using ::lede::testing::WaitUntil;
using test_util::FileExecutable;
using test_util::FreePort;
using test_util::HttpGet;
using test_util::HttpResponse;
using test_util::ReadAll;
using test_util::UrlEncode;

// A real Prometheus scrapes the server every second and computes the
// acceptance-rate dashboard query; it converges to the known ratio 3/4.
// Integration: starts a process and waits for scrapes (about 5 s).
TEST(TelemetryIntegrationTest, PrometheusComputesAcceptanceRate) {
  constexpr char kPrometheus[] = "/usr/bin/prometheus";
  if (!FileExecutable(kPrometheus)) GTEST_SKIP() << kPrometheus << " not installed";
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());

  Registry r;
  SpecDecodeMetrics m(r);
  auto server = MetricsServer::Start(r, "127.0.0.1:0");
  ASSERT_THAT(server, IsOk());

  const int prom_port = FreePort();
  ASSERT_GT(prom_port, 0);
  std::ofstream(tmp.path() / "prometheus.yml")
      << "global:\n"
         "  scrape_interval: 1s\n"
         "  evaluation_interval: 1s\n"
         "scrape_configs:\n"
         "  - job_name: lede\n"
         "    static_configs:\n"
         "      - targets: ['127.0.0.1:"
      << (*server)->port() << "']\n";
  const std::string log = (tmp.path() / "prometheus.log").string();
  auto prometheus = ChildProcess::Start(
      {kPrometheus, "--config.file=" + (tmp.path() / "prometheus.yml").string(),
       "--storage.tsdb.path=" + (tmp.path() / "data").string(),
       "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
      log);
  ASSERT_THAT(prometheus, IsOk());

  // Drafting traffic: 4 drafted, 3 accepted per round.
  std::atomic<bool> stop{false};
  std::thread traffic([&] {
    while (!stop.load()) {
      m.RecordRound(4, 4, 3, 0.001);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  const std::string query =
      "/api/v1/query?query=" +
      UrlEncode("sum(rate(lede_spec_decode_num_accepted_tokens_total[5s]))"
                " / sum(rate(lede_spec_decode_num_draft_tokens_total[5s]))");
  double ratio = std::nan("");
  std::string last_body;
  WaitUntil(
      [&] {
        if (!(*prometheus)->Running()) return true;  // gone: fail below with its log
        HttpResponse resp = HttpGet(prom_port, query);
        if (resp.status != 200) return false;
        last_body = resp.body;
        auto json = nlohmann::json::parse(resp.body, nullptr, /*allow_exceptions=*/false);
        if (json.is_discarded() || json.value("status", "") != "success" ||
            !json["data"]["result"].is_array() || json["data"]["result"].empty()) {
          return false;
        }
        ratio = std::stod(json["data"]["result"][0]["value"][1].get<std::string>());
        return std::abs(ratio - 0.75) < 0.05;
      },
      std::chrono::seconds(30), std::chrono::milliseconds(250));
  stop = true;
  traffic.join();
  EXPECT_NEAR(ratio, 0.75, 0.05) << "last response: " << last_body
                                 << "\nprometheus log:\n" << ReadAll(log);
}

}  // namespace
}  // namespace lede::telemetry
