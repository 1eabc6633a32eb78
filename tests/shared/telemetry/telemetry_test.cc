// Tests for shared/telemetry: the metrics registry and its text exposition,
// the civetweb /metrics server, SpecDecodeMetrics and promtool's linter.
// A real Prometheus scraping us is telemetry_integration_test.cc.
#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/telemetry/lede_metrics.h"
#include "shared/telemetry/metrics.h"
#include "shared/telemetry/metrics_server.h"
#include "tests/shared/telemetry/telemetry_test_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::telemetry {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using test_util::FileExecutable;
using test_util::HttpGet;
using test_util::HttpRequest;
using test_util::HttpResponse;
using test_util::RunShell;

// --- Registry and exposition ---------------------------------------------------

// The exposition of a small registry is exactly the 0.0.4 text format:
// families by name, HELP/TYPE, labels in declaration order, cumulative
// buckets ending in +Inf, _sum and _count.
TEST(TelemetryRegistryTest, SerializesGoldenText) {
  Registry r;
  auto& requests = r.AddCounter("lede_requests_total", "Finished requests.", {"method", "status"});
  requests.Add({{"status", "OK"}, {"method", "Generate"}}).Increment(3);
  requests.Add({{"method", "Generate"}, {"status", "INVALID_ARGUMENT"}}).Increment();
  r.AddGauge("lede_kv_slots_in_use", "Slots in use.").Add({}).Set(2.5);
  auto& h = r.AddHistogram("lede_round_latency_seconds", "Round latency (seconds).", {},
                           {0.005, 0.01, 1});
  h.Add({}).Observe(0.004);
  h.Add({}).Observe(0.01);
  h.Add({}).Observe(3);
  r.AddCounter("lede_unused_total", "Never used: no child, not emitted.");

  EXPECT_EQ(r.Serialize(),
            "# HELP lede_kv_slots_in_use Slots in use.\n"
            "# TYPE lede_kv_slots_in_use gauge\n"
            "lede_kv_slots_in_use 2.5\n"
            "# HELP lede_requests_total Finished requests.\n"
            "# TYPE lede_requests_total counter\n"
            "lede_requests_total{method=\"Generate\",status=\"INVALID_ARGUMENT\"} 1\n"
            "lede_requests_total{method=\"Generate\",status=\"OK\"} 3\n"
            "# HELP lede_round_latency_seconds Round latency (seconds).\n"
            "# TYPE lede_round_latency_seconds histogram\n"
            "lede_round_latency_seconds_bucket{le=\"0.005\"} 1\n"
            "lede_round_latency_seconds_bucket{le=\"0.01\"} 2\n"
            "lede_round_latency_seconds_bucket{le=\"1\"} 2\n"
            "lede_round_latency_seconds_bucket{le=\"+Inf\"} 3\n"
            "lede_round_latency_seconds_sum 3.014\n"
            "lede_round_latency_seconds_count 3\n");
}

// Label values escape \, " and newline; HELP escapes \ and newline only.
TEST(TelemetryRegistryTest, EscapesLabelValuesAndHelp) {
  Registry r;
  r.AddCounter("x_total", "a \\ b\nc \"q\"", {"path"})
      .Add({{"path", "C:\\dir \"x\"\nnext"}})
      .Increment();
  EXPECT_EQ(r.Serialize(),
            "# HELP x_total a \\\\ b\\nc \"q\"\n"
            "# TYPE x_total counter\n"
            "x_total{path=\"C:\\\\dir \\\"x\\\"\\nnext\"} 1\n");
}

// Histogram buckets are cumulative with inclusive upper bounds; a labelled
// histogram puts `le` last.
TEST(TelemetryRegistryTest, HistogramBucketsAreCumulative) {
  Registry r;
  Histogram& h = r.AddHistogram("h", "help", {"k"}, {1, 2, 5}).Add({{"k", "v"}});
  for (double v : {0.5, 1.0, 1.5, 3.0, 10.0, std::nan("")}) h.Observe(v);
  Histogram::Snapshot s = h.Collect();
  EXPECT_THAT(s.cumulative, ElementsAre(2, 3, 4, 5));
  EXPECT_EQ(s.count, 5u);  // NaN dropped
  EXPECT_DOUBLE_EQ(s.sum, 16.0);
  EXPECT_THAT(r.Serialize(), HasSubstr("h_bucket{k=\"v\",le=\"2\"} 3\n"
                                       "h_bucket{k=\"v\",le=\"5\"} 4\n"
                                       "h_bucket{k=\"v\",le=\"+Inf\"} 5\n"
                                       "h_sum{k=\"v\"} 16\n"
                                       "h_count{k=\"v\"} 5\n"));
}

// Numbers print in shortest round-trip form with Prometheus' spellings.
TEST(TelemetryRegistryTest, FormatsValues) {
  EXPECT_EQ(internal::FormatValue(0), "0");
  EXPECT_EQ(internal::FormatValue(3), "3");
  EXPECT_EQ(internal::FormatValue(0.1), "0.1");
  EXPECT_EQ(internal::FormatValue(-2.5), "-2.5");
  EXPECT_EQ(internal::FormatValue(1e-5), "1e-05");
  EXPECT_EQ(internal::FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(internal::FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(internal::FormatValue(std::nan("")), "NaN");
}

// Counters ignore negative and NaN increments; gauges go both ways.
TEST(TelemetryRegistryTest, CounterAndGaugeSemantics) {
  Registry r;
  Counter& c = r.AddCounter("c_total", "help").Add({});
  c.Increment();
  c.Increment(2.5);
  c.Increment(-1);
  c.Increment(std::nan(""));
  EXPECT_DOUBLE_EQ(c.Value(), 3.5);
  Gauge& g = r.AddGauge("g", "help").Add({});
  g.Set(10);
  g.Increment(2);
  g.Decrement(5);
  g.Decrement();
  EXPECT_DOUBLE_EQ(g.Value(), 6);
}

// The same labels give the same object; registering the same family twice
// returns the first one.
TEST(TelemetryRegistryTest, AddIsIdempotent) {
  Registry r;
  auto& f1 = r.AddCounter("c_total", "help", {"a"});
  auto& f2 = r.AddCounter("c_total", "help", {"a"});
  EXPECT_EQ(&f1, &f2);
  EXPECT_EQ(&f1.Add({{"a", "x"}}), &f2.Add({{"a", "x"}}));
  EXPECT_NE(&f1.Add({{"a", "x"}}), &f1.Add({{"a", "y"}}));
}

TEST(TelemetryRegistryTest, BucketHelpers) {
  EXPECT_THAT(LinearBuckets(0, 1, 4), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(LinearBuckets(0.1, 0.1, 3), ElementsAre(0.1, 0.2, 0.1 + 2 * 0.1));
  EXPECT_THAT(ExponentialBuckets(0.001, 2, 4), ElementsAre(0.001, 0.002, 0.004, 0.008));
  EXPECT_TRUE(LinearBuckets(0, 1, 0).empty());
}

TEST(TelemetryRegistryTest, ValidatesNames) {
  EXPECT_TRUE(IsValidMetricName("lede_requests_total"));
  EXPECT_TRUE(IsValidMetricName("job:rate5m"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("1abc"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_TRUE(IsValidLabelName("status"));
  EXPECT_TRUE(IsValidLabelName("_x1"));
  EXPECT_FALSE(IsValidLabelName("__name__"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
  EXPECT_FALSE(IsValidLabelName("9"));
}

// Invalid names and mismatched labels are programmer errors: they abort with
// a message naming the culprit.
TEST(TelemetryRegistryDeathTest, ProgrammerErrorsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH({ Registry r; r.AddCounter("bad-name", "h"); }, "invalid metric name \"bad-name\"");
  EXPECT_DEATH({ Registry r; r.AddGauge("g", "h", {"__x"}); }, "invalid label name");
  EXPECT_DEATH({ Registry r; r.AddHistogram("h", "h", {"le"}, {1}); }, "reserved");
  EXPECT_DEATH({ Registry r; r.AddHistogram("h", "h", {}, {2, 1}); }, "strictly increasing");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddCounter("c_total", "h");
        r.AddGauge("c_total", "h");
      },
      "registered twice");
  EXPECT_DEATH({ Registry r; r.AddCounter("c_total", "h", {"a"}).Add({}); }, "missing label");
  EXPECT_DEATH(
      { Registry r; r.AddCounter("c_total", "h", {"a"}).Add({{"a", "1"}, {"b", "2"}}); },
      "unknown label");
}

// Concurrent updates from many threads lose nothing (CAS loops, atomics).
TEST(TelemetryRegistryTest, ConcurrentUpdatesSumCorrectly) {
  Registry r;
  Counter& c = r.AddCounter("c_total", "h").Add({});
  Gauge& g = r.AddGauge("g", "h").Add({});
  Histogram& h = r.AddHistogram("h", "h", {}, {0.5}).Add({});
  auto& labelled = r.AddCounter("l_total", "h", {"t"});
  constexpr int kThreads = 8;
  constexpr int kIters = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter& mine = labelled.Add({{"t", std::to_string(t % 2)}});
      for (int i = 0; i < kIters; ++i) {
        c.Increment(0.5);
        g.Increment();
        g.Decrement(0.25);
        h.Observe(i % 2);  // 0 or 1
        mine.Increment();
        if (i % 1000 == 0) (void)r.Serialize();  // scrapes race with updates
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_DOUBLE_EQ(c.Value(), 0.5 * kThreads * kIters);
  EXPECT_DOUBLE_EQ(g.Value(), 0.75 * kThreads * kIters);
  Histogram::Snapshot s = h.Collect();
  EXPECT_EQ(s.count, static_cast<uint64_t>(kThreads) * kIters);
  EXPECT_EQ(s.cumulative[0], s.count / 2);
  EXPECT_DOUBLE_EQ(s.sum, kThreads * kIters / 2.0);
  EXPECT_DOUBLE_EQ(labelled.Add({{"t", "0"}}).Value() + labelled.Add({{"t", "1"}}).Value(),
                   static_cast<double>(kThreads) * kIters);
}

// --- MetricsServer -------------------------------------------------------------

// /metrics serves Serialize() with the 0.0.4 content type; /healthz says ok;
// other paths are 404 and other methods 405.
TEST(TelemetryServerTest, ServesMetricsAndHealthz) {
  Registry r;
  r.AddCounter("lede_x_total", "help", {"a"}).Add({{"a", "b"}}).Increment(7);
  auto server = MetricsServer::Start(r, "127.0.0.1:0");
  ASSERT_THAT(server, IsOk());
  const int port = (*server)->port();
  EXPECT_GT(port, 0);
  EXPECT_EQ((*server)->listen_address(), "127.0.0.1:0");

  HttpResponse m = HttpGet(port, "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_THAT(m.headers, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8"));
  EXPECT_EQ(m.body, r.Serialize());
  EXPECT_THAT(m.body, HasSubstr("lede_x_total{a=\"b\"} 7\n"));

  HttpResponse h = HttpGet(port, "/healthz");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body, "ok\n");

  EXPECT_EQ(HttpGet(port, "/nope").status, 404);
  EXPECT_EQ(HttpGet(port, "/metrics/extra").status, 404);
  EXPECT_EQ(HttpRequest(port, "POST", "/metrics").status, 405);
  HttpResponse head = HttpRequest(port, "HEAD", "/metrics");
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.body.empty());
}

// Malformed addresses are kInvalidArgument; a port already taken is
// kUnavailable; both messages name the address.
TEST(TelemetryServerTest, BadAddressesFailClearly) {
  Registry r;
  for (const char* bad : {"", "nonsense", "127.0.0.1", "127.0.0.1:", ":9090", "127.0.0.1:70000",
                          "127.0.0.1:9x", "[::1]:0", "127.0.0.1:0,127.0.0.1:0"}) {
    auto s = MetricsServer::Start(r, bad);
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument)) << bad;
    if (!s.ok()) {
      EXPECT_THAT(std::string(s.status().message()), HasSubstr(bad));
    }
  }
  auto first = MetricsServer::Start(r, "127.0.0.1:0");
  ASSERT_THAT(first, IsOk());
  const std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = MetricsServer::Start(r, taken);
  EXPECT_THAT(second, StatusIs(StatusCode::kUnavailable));
  if (!second.ok()) {
    EXPECT_THAT(std::string(second.status().message()), HasSubstr(taken));
  }
  EXPECT_THAT(MetricsServer::Start(r, "no-such-host.invalid:0"),
              StatusIs(StatusCode::kUnavailable));
}

// Destroying the server stops it: the port no longer answers.
TEST(TelemetryServerTest, DestructorStops) {
  Registry r;
  int port = 0;
  {
    auto server = MetricsServer::Start(r, "localhost:0");
    ASSERT_THAT(server, IsOk());
    port = (*server)->port();
    EXPECT_EQ(HttpGet(port, "/healthz").status, 200);
  }
  EXPECT_EQ(HttpGet(port, "/healthz").status, 0);
}

// --- SpecDecodeMetrics ----------------------------------------------------------

// A speculation round updates drafts, tokens and the three histograms; an
// autoregressive step only emits one token.
TEST(TelemetrySpecDecodeMetricsTest, RecordRoundIsConsistent) {
  Registry r;
  SpecDecodeMetrics m(r);
  m.RecordRound(/*exit_layer=*/4, /*n_drafted=*/5, /*n_accepted=*/3, 0.01);
  m.RecordRound(6, 2, 2, 0.02);
  m.RecordRound(/*exit_layer=*/0, /*n_drafted=*/0, /*n_accepted=*/0, 0.005);  // AR step
  m.RecordRound(4, 3, 9, 0.01);  // n_accepted clamped to 3
  EXPECT_EQ(m.num_drafts.Value(), 3);
  EXPECT_EQ(m.num_draft_tokens.Value(), 10);
  EXPECT_EQ(m.num_accepted_tokens.Value(), 8);
  EXPECT_EQ(m.num_emitted_tokens.Value(), (3 + 1) + (2 + 1) + 1 + (3 + 1));
  EXPECT_EQ(m.acceptance_length.Collect().count, 3u);
  EXPECT_EQ(m.draft_length.Collect().sum, 10);
  EXPECT_EQ(m.exit_layer.Collect().sum, 14);
  EXPECT_EQ(m.round_latency.Collect().count, 4u);
  EXPECT_EQ(m.acceptance_length.bounds().size(), 17u);
  EXPECT_EQ(m.exit_layer.bounds().front(), 1);
  EXPECT_EQ(m.exit_layer.bounds().back(), 32);
}

// Requests are counted by method and gRPC code name; the policy version is an
// info gauge with the old version set back to 0.
TEST(TelemetrySpecDecodeMetricsTest, RequestsAndPolicyVersion) {
  Registry r;
  SpecDecodeMetrics m(r);
  SpecDecodeMetrics again(r);  // same registry: shares the metrics
  m.RecordRequest("Generate", StatusCode::kOk, 0.5);
  again.RecordRequest("Generate", StatusCode::kOk, 0.5);
  m.RecordRequest("Generate", StatusCode::kInvalidArgument, 0.001);
  m.SetPolicyVersion("v2", PolicyVersionNumber("v2"));
  m.SetPolicyVersion("v3", PolicyVersionNumber("v3"));
  m.RecordPolicyReload(true);
  m.RecordPolicyReload(false);
  const std::string text = r.Serialize();
  EXPECT_THAT(text, HasSubstr("lede_requests_total{method=\"Generate\",status=\"OK\"} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("lede_requests_total{method=\"Generate\",status=\"INVALID_ARGUMENT\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_policy_version{version=\"v2\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("lede_policy_version{version=\"v3\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_policy_version_number 3\n"));
  EXPECT_THAT(text, HasSubstr("lede_policy_reloads_total{outcome=\"ok\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_policy_reloads_total{outcome=\"rejected\"} 1\n"));
  EXPECT_EQ(m.request_latency.Collect().count, 3u);
  EXPECT_EQ(PolicyVersionNumber("20250101-1200"), 202501011200.0);
  EXPECT_EQ(PolicyVersionNumber("latest"), 0);
  EXPECT_EQ(GrpcCodeName(StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
}

// promtool's linter accepts what the server serves for every project metric.
TEST(TelemetrySpecDecodeMetricsTest, PromtoolAcceptsServedMetrics) {
  constexpr char kPromtool[] = "/usr/bin/promtool";
  if (!FileExecutable(kPromtool)) GTEST_SKIP() << kPromtool << " not installed";
  Registry r;
  SpecDecodeMetrics m(r);
  m.RecordRound(4, 5, 3, 0.01);
  m.RecordRound(0, 0, 0, 0.004);
  m.RecordRequest("Generate", StatusCode::kOk, 0.8);
  m.RecordRequest("Generate", StatusCode::kDeadlineExceeded, 30);
  m.generated_tokens.Increment(6);
  m.prompt_tokens.Increment(12);
  m.time_to_first_token.Observe(0.05);
  m.inter_token_latency.Observe(0.01);
  m.SetPolicyVersion("v1", 1);
  m.RecordPolicyReload(true);
  m.kv_slots_capacity.Set(8);
  m.kv_slots_in_use.Set(3);
  m.experience_records_written.Increment(5);
  m.experience_records_dropped.Increment();
  m.experience_shards_written.Increment();
  r.AddCounter("lede_escape_check_total", "help", {"v"}).Add({{"v", "a\"b\\c\nd"}}).Increment();

  auto server = MetricsServer::Start(r, "127.0.0.1:0");
  ASSERT_THAT(server, IsOk());
  HttpResponse resp = HttpGet((*server)->port(), "/metrics");
  ASSERT_EQ(resp.status, 200);
  for (const char* name :
       {"lede_spec_decode_num_drafts_total", "lede_spec_decode_num_draft_tokens_total",
        "lede_spec_decode_num_accepted_tokens_total", "lede_spec_decode_num_emitted_tokens_total",
        "lede_requests_total", "lede_generated_tokens_total", "lede_prompt_tokens_total",
        "lede_spec_decode_acceptance_length", "lede_spec_decode_exit_layer",
        "lede_spec_decode_draft_length", "lede_round_latency_seconds",
        "lede_time_to_first_token_seconds", "lede_inter_token_latency_seconds",
        "lede_request_latency_seconds", "lede_policy_version", "lede_policy_version_number",
        "lede_kv_slots_in_use", "lede_kv_slots_capacity", "lede_experience_records_written_total",
        "lede_experience_records_dropped_total", "lede_experience_shards_written_total",
        "lede_policy_reloads_total"}) {
    EXPECT_THAT(resp.body, HasSubstr(std::string("# TYPE ") + name + " ")) << name;
  }

  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const auto file = tmp.path() / "metrics.txt";
  std::ofstream(file) << resp.body;
  auto [rc, out] = RunShell(std::string(kPromtool) + " check metrics < " + file.string() + " 2>&1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "") << out;
}

}  // namespace
}  // namespace lede::telemetry
