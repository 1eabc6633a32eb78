// Tests for shared/telemetry: the text exposition of prometheus-cpp's
// registry, the /metrics server, SpecDecodeMetrics and promtool's linter.
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

// --- prometheus-cpp glue ---------------------------------------------------------

// SerializeText() is prometheus-cpp's text format: HELP/TYPE, labels,
// cumulative buckets ending in +Inf, _sum and _count; escaping of label
// values is prometheus-cpp's.
TEST(TelemetryTextTest, SerializesPrometheusText) {
  Registry r;
  auto& requests = prometheus::BuildCounter().Name("lede_x_total").Help("Finished.").Register(r);
  requests.Add({{"status", "OK"}}).Increment(3);
  requests.Add({{"status", "a\"b\\c\nd"}}).Increment();
  auto& h = prometheus::BuildHistogram().Name("lede_h_seconds").Help("H.").Register(r);
  Histogram& hist = h.Add({}, Histogram::BucketBoundaries{0.005, 0.01, 1});
  hist.Observe(0.004);
  hist.Observe(0.01);
  hist.Observe(3);
  const std::string text = SerializeText(r);
  EXPECT_THAT(text, HasSubstr("# HELP lede_x_total Finished.\n# TYPE lede_x_total counter\n"));
  EXPECT_THAT(text, HasSubstr("lede_x_total{status=\"OK\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("lede_x_total{status=\"a\\\"b\\\\c\\nd\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_h_seconds_bucket{le=\"0.01\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("lede_h_seconds_bucket{le=\"1\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("lede_h_seconds_bucket{le=\"+Inf\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("lede_h_seconds_count 3\n"));
}

// --- MetricsServer -------------------------------------------------------------

// /metrics serves Serialize() with the 0.0.4 content type; /healthz says ok;
// other paths are 404 and other methods 405.
TEST(TelemetryServerTest, ServesMetricsAndHealthz) {
  Registry r;
  prometheus::BuildCounter().Name("lede_x_total").Help("help").Register(r).Add({{"a", "b"}}).Increment(7);
  auto server = MetricsServer::Start(r, "127.0.0.1:0");
  ASSERT_THAT(server, IsOk());
  const int port = (*server)->port();
  EXPECT_GT(port, 0);
  EXPECT_EQ((*server)->listen_address(), "127.0.0.1:0");

  HttpResponse m = HttpGet(port, "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_THAT(m.headers, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8"));
  EXPECT_EQ(m.body, SerializeText(r));
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

uint64_t Count(Histogram& h) { return h.Collect().histogram.sample_count; }
double Sum(Histogram& h) { return h.Collect().histogram.sample_sum; }
std::vector<double> Bounds(Histogram& h) {
  std::vector<double> b;
  for (const auto& bucket : h.Collect().histogram.bucket) b.push_back(bucket.upper_bound);
  b.pop_back();  // +Inf
  return b;
}

// A speculation round updates drafts, tokens, accepted-per-position and the
// three histograms; an autoregressive step only emits one token.
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
  EXPECT_EQ(m.AcceptedAtPosition(0).Value(), 3);
  EXPECT_EQ(m.AcceptedAtPosition(1).Value(), 3);
  EXPECT_EQ(m.AcceptedAtPosition(2).Value(), 2);
  EXPECT_EQ(m.AcceptedAtPosition(3).Value(), 0);
  EXPECT_EQ(Count(m.acceptance_length), 3u);
  EXPECT_EQ(Sum(m.draft_length), 10);
  EXPECT_EQ(Sum(m.exit_layer), 14);
  EXPECT_EQ(Count(m.round_latency), 4u);
  EXPECT_EQ(Bounds(m.acceptance_length).size(), 17u);
  EXPECT_EQ(Bounds(m.exit_layer).front(), 1);
  EXPECT_EQ(Bounds(m.exit_layer).back(), 32);
  EXPECT_THAT(SerializeText(r),
              HasSubstr("lede_spec_decode_num_accepted_tokens_per_pos_total{position=\"2\"} 2\n"));
}

// The latency histograms have vLLM's bucket boundaries.
TEST(TelemetrySpecDecodeMetricsTest, LatencyBucketsAreVllms) {
  Registry r;
  SpecDecodeMetrics m(r);
  EXPECT_THAT(Bounds(m.time_to_first_token),
              ElementsAre(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                          2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0));
  EXPECT_THAT(Bounds(m.inter_token_latency),
              ElementsAre(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                          5.0, 7.5, 10.0, 20.0, 40.0, 80.0));
  const std::vector<double> e2e = Bounds(m.e2e_request_latency);
  ASSERT_EQ(e2e.size(), 21u);
  EXPECT_EQ(e2e.front(), 0.3);
  EXPECT_EQ(e2e.back(), 7680.0);
  const std::vector<double> decision = Bounds(m.policy_decision_latency);
  EXPECT_EQ(decision.front(), 1e-6);
  EXPECT_DOUBLE_EQ(decision.back(), 1.0);
}

// Requests are counted by method and gRPC code name, completions by
// finished_reason; the policy version is an info gauge with the old version
// set back to 0.
TEST(TelemetrySpecDecodeMetricsTest, RequestsAndPolicyVersion) {
  Registry r;
  SpecDecodeMetrics m(r);
  SpecDecodeMetrics again(r);  // same registry: shares the metrics
  m.RecordRequest("Generate", StatusCode::kOk, 0.5);
  again.RecordRequest("Generate", StatusCode::kOk, 0.5);
  m.RecordRequest("Generate", StatusCode::kInvalidArgument, 0.001);
  m.RecordSuccess("stop");
  again.RecordSuccess("stop");
  m.RecordSuccess("length");
  m.SetPolicyVersion("v2", PolicyVersionNumber("v2"));
  m.SetPolicyVersion("v3", PolicyVersionNumber("v3"));
  m.RecordPolicyReload(true);
  m.RecordPolicyReload(false);
  const std::string text = SerializeText(r);
  EXPECT_THAT(text, HasSubstr("lede_requests_total{method=\"Generate\",status=\"OK\"} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("lede_requests_total{method=\"Generate\",status=\"INVALID_ARGUMENT\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_request_success_total{finished_reason=\"stop\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("lede_request_success_total{finished_reason=\"length\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_policy_version{version=\"v2\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("lede_policy_version{version=\"v3\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_policy_version_number 3\n"));
  EXPECT_THAT(text, HasSubstr("lede_policy_reloads_total{outcome=\"ok\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_policy_reloads_total{outcome=\"rejected\"} 1\n"));
  EXPECT_EQ(Count(m.e2e_request_latency), 3u);
  EXPECT_EQ(PolicyVersionNumber("20250101-1200"), 202501011200.0);
  EXPECT_EQ(PolicyVersionNumber("latest"), 0);
  EXPECT_EQ(GrpcCodeName(StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
}

// The measured step costs are gauges by exit layer, draft tokens and rows; a new median replaces the old.
TEST(TelemetrySpecDecodeMetricsTest, MeasuredStepCostsAreLabelledGauges) {
  Registry r;
  SpecDecodeMetrics m(r);
  m.SetDraftStepSeconds(2, 0.5);
  m.SetDraftStepSeconds(2, 0.25);
  m.SetVerifySeconds(0, 0.125);
  m.SetBatchStepSeconds(16, 2);
  const std::string text = SerializeText(r);
  EXPECT_THAT(text, HasSubstr("# TYPE lede_model_draft_step_seconds gauge\n"));
  EXPECT_THAT(text, HasSubstr("lede_model_draft_step_seconds{exit_layer=\"2\"} 0.25\n"));
  EXPECT_THAT(text, HasSubstr("lede_model_verify_seconds{draft_tokens=\"0\"} 0.125\n"));
  EXPECT_THAT(text, HasSubstr("lede_model_batch_step_seconds{rows=\"16\"} 2\n"));
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
  m.RecordSuccess("stop");
  m.generation_tokens.Increment(6);
  m.prompt_tokens.Increment(12);
  m.time_to_first_token.Observe(0.05);
  m.inter_token_latency.Observe(0.01);
  m.policy_decision_latency.Observe(4e-7);
  m.num_requests_running.Set(1);
  m.SetPolicyVersion("v1", 1);
  m.RecordPolicyReload(true);
  m.kv_slots_capacity.Set(8);
  m.kv_slots_in_use.Set(3);
  m.kv_cache_usage.Set(0.25);
  m.experience_records_written.Increment(5);
  m.experience_records_dropped.Increment();
  m.experience_shards_written.Increment();
  prometheus::BuildCounter().Name("lede_escape_check_total").Help("help").Register(r)
      .Add({{"v", "a\"b\\c\nd"}}).Increment();

  auto server = MetricsServer::Start(r, "127.0.0.1:0");
  ASSERT_THAT(server, IsOk());
  HttpResponse resp = HttpGet((*server)->port(), "/metrics");
  ASSERT_EQ(resp.status, 200);
  for (const char* name :
       {"lede_spec_decode_num_drafts_total", "lede_spec_decode_num_draft_tokens_total",
        "lede_spec_decode_num_accepted_tokens_total", "lede_spec_decode_num_emitted_tokens_total",
        "lede_spec_decode_num_accepted_tokens_per_pos_total", "lede_request_success_total",
        "lede_num_requests_running", "lede_num_requests_waiting",
        "lede_policy_decision_latency_seconds",
        "lede_requests_total", "lede_generation_tokens_total", "lede_prompt_tokens_total",
        "lede_spec_decode_acceptance_length", "lede_spec_decode_exit_layer",
        "lede_spec_decode_draft_length", "lede_round_latency_seconds",
        "lede_time_to_first_token_seconds", "lede_inter_token_latency_seconds",
        "lede_e2e_request_latency_seconds", "lede_policy_version", "lede_policy_version_number",
        "lede_kv_slots_in_use", "lede_kv_slots_capacity", "lede_kv_cache_usage_perc",
        "lede_experience_records_written_total",
        "lede_experience_records_dropped_total", "lede_experience_shards_written_total",
        "lede_policy_reloads_total", "lede_request_log_records_written_total",
        "lede_request_log_records_dropped_total"}) {
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
