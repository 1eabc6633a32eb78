// The coordinator's OpenAI-compatible HTTP API against a real deployment
// (verifier, drafter, coordinator on loopback, lede-tiny) with real clients:
// the official `openai` npm package under node, curl (SSE framing and every
// error path) and Python's http.client (a disconnect mid-stream). Texts and
// token counts are checked against the gRPC API's for the same greedy
// request. ctest label `integration`: one cluster for the suite (a few
// seconds to start on 2 cores). Waits for eventual conditions are bounded;
// nothing asserts on timing.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/lede/v1/generation.grpc.pb.h"
#include "proto/lede/v1/model.grpc.pb.h"
#include "tests/shared/telemetry/telemetry_test_util.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace lede {
namespace {

using ::lede::testing::ClusterOptions;
using ::lede::testing::LedeCluster;
using ::testing::HasSubstr;
using nlohmann::json;
using telemetry::test_util::FileExecutable;
using telemetry::test_util::HttpGet;
using telemetry::test_util::RunShell;
using namespace std::chrono_literals;

constexpr int kLimit = 256;
constexpr char kModelId[] = "lede-tiny";

std::string SourceDir() { return LEDE_SOURCE_DIR; }

struct GrpcResult {
  grpc::Status status;
  std::string text;
  lede::v1::GenerationSummary summary;
};

struct HttpResult {
  int status = 0;
  std::string headers;
  std::string body;
  json Json() const { return json::parse(body, nullptr, false); }
};

class OpenAiE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions o;
    o.binaries = {LEDE_MODEL_BIN, LEDE_COORDINATOR_BIN, LEDE_POLICY_BIN};
    o.model_dir = SourceDir() + "/models/lede-tiny";
    o.slots = 2;
    o.experience_url = "none";
    o.model_args = {"--max-waiting", "0"};  // a full pool refuses (no queue)
    o.coordinator_args = {"--max-new-tokens-limit", std::to_string(kLimit), "--served-model-name", kModelId};
    cluster_ = new LedeCluster(o);
    Status s = cluster_->Start();
    if (!s.ok()) {
      start_error_ = new std::string(s.ToString());
      return;
    }
    auto m = cluster_->coordinator()->WaitForLog(R"re(event="?openai_api_listening"? port="?(\d+))re", 10s);
    if (!m.ok()) {
      start_error_ = new std::string(m.status().ToString());
      return;
    }
    port_ = std::atoi((*m)[1].c_str());
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_EQ(start_error_, nullptr) << *start_error_;
    ASSERT_GT(port_, 0);
  }

  static std::string Url(const std::string& path) { return "http://127.0.0.1:" + std::to_string(port_) + path; }

  // One request with curl; `body` goes through a file (no shell quoting).
  HttpResult Curl(const std::string& method, const std::string& path, const std::string& body = "",
                  const std::string& extra = "") {
    const std::string file = (tmp_.path() / "body.json").string();
    const std::string headers = (tmp_.path() / "headers.txt").string();
    std::ofstream(file, std::ios::binary) << body;
    std::string cmd = "curl -sS -N --max-time 60 -X " + method + " -D " + headers + " " + extra;
    if (!body.empty()) cmd += " -H 'Content-Type: application/json' --data-binary @" + file;
    cmd += " -w '\\n%{http_code}' '" + Url(path) + "'";
    auto [rc, out] = RunShell(cmd);
    HttpResult r;
    const size_t nl = out.rfind('\n');
    if (rc != 0 || nl == std::string::npos) return r;
    r.status = std::atoi(out.c_str() + nl + 1);
    r.body = out.substr(0, nl);
    r.headers = telemetry::test_util::ReadAll(headers);
    return r;
  }

  static GrpcResult Grpc(const lede::v1::GenerateRequest& request) {
    auto stub = cluster_->NewStub();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 60s);
    auto reader = stub->Generate(&ctx, request);
    GrpcResult r;
    lede::v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      if (resp.has_delta()) r.text += resp.delta().text();
      if (resp.has_summary()) r.summary = resp.summary();
    }
    r.status = reader->Finish();
    return r;
  }

  static lede::v1::GenerateRequest Greedy(const std::string& prompt, int max_new_tokens,
                                          lede::v1::SpeculationMethod method = lede::v1::SPECULATION_METHOD_LEDE) {
    lede::v1::GenerateRequest g;
    g.set_prompt(prompt);
    g.set_max_new_tokens(max_new_tokens);
    g.set_temperature(0);
    g.set_method(method);
    return g;
  }

  // The value of an unlabelled or labelled sample in a /metrics body, -1 if absent.
  static double Sample(const std::string& metrics, const std::string& series) {
    const size_t at = metrics.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::atof(metrics.c_str() + at + series.size() + 2);
  }

  static LedeCluster* cluster_;
  static std::string* start_error_;
  static int port_;
  lede::testing::TempDir tmp_;
};

LedeCluster* OpenAiE2eTest::cluster_ = nullptr;
std::string* OpenAiE2eTest::start_error_ = nullptr;
int OpenAiE2eTest::port_ = 0;

// The plain chat format (services/coordinator/chat_prompt.h) of one user turn.
std::string PlainChat(const std::string& user) { return "User: " + user + "\nAssistant:"; }

// The openai npm client streams a chat completion and a completion; the text
// equals the gRPC API's for the same greedy request, and usage / timings
// match the gRPC summary.
TEST_F(OpenAiE2eTest, NodeOpenAiClientMatchesGrpc) {
  const char* env = std::getenv("LEDE_OPENAI_NODE_MODULES");
  const std::string modules = env ? env : "/opt/lede-tools/openai-node/node_modules";
  if (!FileExecutable("/usr/bin/node") || !std::filesystem::exists(modules + "/openai/package.json")) {
    GTEST_SKIP() << "node or the openai package is missing (scripts/install_openai_node.sh)";
  }
  const std::string prompt = "Once upon a time";
  const std::string user = "Tell me a story about a cat.";
  constexpr int kTokens = 40;
  auto [rc, out] = RunShell("LEDE_OPENAI_NODE_MODULES='" + modules + "' /usr/bin/node " + SourceDir() +
                            "/tests/services/openai/openai_client.cjs '" + Url("/v1") + "' " + kModelId + " '" +
                            prompt + "' '" + user + "' " + std::to_string(kTokens) + " 2>&1");
  ASSERT_EQ(rc, 0) << out;
  json got = json::parse(out, nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << out;

  GrpcResult completion = Grpc(Greedy(prompt, kTokens));
  GrpcResult chat = Grpc(Greedy(PlainChat(user), kTokens));
  ASSERT_TRUE(completion.status.ok()) << completion.status.error_message();
  ASSERT_TRUE(chat.status.ok()) << chat.status.error_message();
  ASSERT_FALSE(completion.text.empty());

  const json& cs = got["completion_stream"];
  EXPECT_EQ(cs["text"], completion.text);
  EXPECT_EQ(cs["usage"]["prompt_tokens"], completion.summary.prompt_tokens());
  EXPECT_EQ(cs["usage"]["completion_tokens"], completion.summary.generated_tokens());
  EXPECT_EQ(cs["usage"]["total_tokens"], completion.summary.prompt_tokens() + completion.summary.generated_tokens());
  EXPECT_EQ(cs["finish_reason"], completion.summary.finish_reason() == lede::v1::FINISH_REASON_LENGTH ? "length" : "stop");

  const json& ch = got["chat_stream"];
  EXPECT_EQ(ch["text"], chat.text);
  EXPECT_EQ(ch["role"], "assistant");
  EXPECT_EQ(ch["usage"]["prompt_tokens"], chat.summary.prompt_tokens());
  EXPECT_EQ(ch["usage"]["completion_tokens"], chat.summary.generated_tokens());
  EXPECT_GT(ch["chunks"].get<int>(), 2);

  const json& whole = got["chat"];
  EXPECT_EQ(whole["text"], chat.text);
  EXPECT_EQ(whole["usage"]["completion_tokens"], chat.summary.generated_tokens());
  EXPECT_EQ(whole["timings"]["prompt_n"], chat.summary.prompt_tokens());
  EXPECT_EQ(whole["timings"]["predicted_n"], chat.summary.generated_tokens());
  EXPECT_EQ(whole["timings"].value("draft_n", 0), chat.summary.drafted_tokens());
  EXPECT_EQ(whole["timings"].value("draft_n_accepted", 0), chat.summary.accepted_tokens());
  EXPECT_EQ(whole["lede"]["rounds"], chat.summary.rounds());
  EXPECT_EQ(whole["lede"]["policy_version"], chat.summary.policy_version());

  EXPECT_EQ(got["error"]["status"], 400);
  EXPECT_EQ(got["error"]["param"], "max_tokens");
  EXPECT_EQ(got["error"]["type"], "invalid_request_error");
}

// curl sees OpenAI's SSE framing: data: events, text_completion chunks with
// finish_reason null until the last content chunk, the usage chunk with
// choices [], then data: [DONE]; text, usage and timings match gRPC.
TEST_F(OpenAiE2eTest, CurlSeesSseFraming) {
  constexpr int kTokens = 24;
  const std::string prompt = "The little dog";
  json body = {{"model", kModelId}, {"prompt", prompt}, {"max_tokens", kTokens}, {"temperature", 0},
               {"stream", true}, {"stream_options", {{"include_usage", true}}},
               {"speculation", {{"method", "static"}, {"exit_layer", 3}, {"draft_length", 3}}}};
  HttpResult r = Curl("POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.headers, HasSubstr("Content-Type: text/event-stream"));
  lede::v1::GenerateRequest same = Greedy(prompt, kTokens, lede::v1::SPECULATION_METHOD_STATIC);
  same.mutable_speculation()->set_exit_layer(3);
  same.mutable_speculation()->set_draft_length(3);
  GrpcResult g = Grpc(same);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();

  // Events are "data: ...\n\n", nothing else.
  std::vector<std::string> events;
  size_t pos = 0;
  while (pos < r.body.size()) {
    const size_t end = r.body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos) << "unterminated event at " << pos << ": " << r.body.substr(pos);
    const std::string e = r.body.substr(pos, end - pos);
    ASSERT_EQ(e.rfind("data: ", 0), 0u) << e;
    events.push_back(e.substr(6));
    pos = end + 2;
  }
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], g.summary.prompt_tokens());
  EXPECT_EQ(usage["usage"]["completion_tokens"], g.summary.generated_tokens());
  json last = json::parse(events[events.size() - 3]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], g.summary.finish_reason() == lede::v1::FINISH_REASON_LENGTH ? "length" : "stop");
  EXPECT_EQ(last["timings"]["draft_n"], g.summary.drafted_tokens());
  EXPECT_EQ(last["timings"]["draft_n_accepted"], g.summary.accepted_tokens());
  EXPECT_EQ(last["lede"]["method"], "static");
  EXPECT_DOUBLE_EQ(last["lede"]["acceptance_rate"].get<double>(), g.summary.acceptance_rate());
  std::string text;
  std::string id;
  for (size_t i = 0; i + 3 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null()) << events[i];
    EXPECT_TRUE(c.contains("usage") && c["usage"].is_null());
    if (id.empty()) id = c["id"];
    EXPECT_EQ(c["id"], id);
    text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, g.text);
  EXPECT_EQ(id.rfind("cmpl-", 0), 0u);
}

// Every validation error of the gRPC API has an HTTP 400 twin in OpenAI's
// envelope, naming the request's parameter.
TEST_F(OpenAiE2eTest, EveryGrpcValidationErrorIsAn400NamingTheParam) {
  struct Case {
    std::string path, body, param;
    std::function<void(lede::v1::GenerateRequest*)> grpc;  // the same mistake over gRPC
    std::string grpc_field;
  };
  const std::string chat = R"("messages": [{"role": "user", "content": "Hi"}])";
  auto spec = [](lede::v1::SpeculationMethod m, int e, int d, float t, float eps) {
    return [=](lede::v1::GenerateRequest* g) {
      g->set_method(m);
      g->mutable_speculation()->set_exit_layer(e);
      g->mutable_speculation()->set_draft_length(d);
      g->mutable_speculation()->set_threshold(t);
      g->mutable_speculation()->set_epsilon(eps);
    };
  };
  std::vector<Case> cases = {
      {"/v1/completions", R"({"prompt": ""})", "prompt", [](auto* g) { g->set_prompt(""); }, "prompt"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 0})", "max_tokens",
       [](auto* g) { g->set_max_new_tokens(0); }, "max_new_tokens"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 100000})", "max_tokens",
       [](auto* g) { g->set_max_new_tokens(100000); }, "max_new_tokens"},
      {"/v1/chat/completions", "{" + chat + R"(, "max_completion_tokens": 0})", "max_completion_tokens",
       [](auto* g) { g->set_max_new_tokens(0); }, "max_new_tokens"},
      {"/v1/completions", R"({"prompt": "a", "temperature": -1})", "temperature",
       [](auto* g) { g->set_temperature(-1); }, "temperature"},
      {"/v1/completions", R"({"prompt": "a", "top_p": 1.5})", "top_p", [](auto* g) { g->set_top_p(1.5); }, "top_p"},
      {"/v1/completions", R"({"prompt": "a", "stop": ["x", ""]})", "stop", [](auto* g) { g->add_stop(""); }, "stop"},
      {"/v1/completions", R"({"prompt": [1, 99999999]})", "prompt",
       [](auto* g) {
         g->clear_prompt();
         g->add_prompt_token_ids(1);
         g->add_prompt_token_ids(99999999);
       },
       "prompt_token_ids"},
      {"/v1/completions", R"({"prompt": "a", "speculation": {"method": "threshold", "threshold": 1.5}})",
       "speculation.threshold", spec(lede::v1::SPECULATION_METHOD_THRESHOLD, 0, 0, 1.5f, 0), "speculation.threshold"},
      {"/v1/completions", R"({"prompt": "a", "speculation": {"method": "lede", "epsilon": 2}})",
       "speculation.epsilon", spec(lede::v1::SPECULATION_METHOD_LEDE, 0, 0, 0, 2), "speculation.epsilon"},
      {"/v1/completions", R"({"prompt": "a", "speculation": {"method": "static", "exit_layer": 99, "draft_length": 2}})",
       "speculation.exit_layer", spec(lede::v1::SPECULATION_METHOD_STATIC, 99, 2, 0, 0), "speculation.exit_layer"},
      {"/v1/completions", R"({"prompt": "a", "speculation": {"method": "static", "exit_layer": 3, "draft_length": 99}})",
       "speculation.draft_length", spec(lede::v1::SPECULATION_METHOD_STATIC, 3, 99, 0, 0), "speculation.draft_length"},
      {"/v1/completions", R"({"prompt": "a", "speculation": {"method": "bogus"}})", "speculation.method",
       [](auto* g) { g->set_method(static_cast<lede::v1::SpeculationMethod>(42)); }, "method"},
      {"/v1/chat/completions", "{" + chat + R"(, "stop": [""]})", "stop", [](auto* g) { g->add_stop(""); }, "stop"},
  };
  for (const Case& c : cases) {
    HttpResult r = Curl("POST", c.path, c.body);
    EXPECT_EQ(r.status, 400) << c.body << " -> " << r.body;
    json j = r.Json();
    ASSERT_TRUE(j.is_object()) << r.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r.body;
    EXPECT_EQ(j["error"]["param"], c.param) << c.body << " -> " << r.body;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    EXPECT_TRUE(j["error"].contains("code"));

    lede::v1::GenerateRequest g = Greedy("a", 8);
    c.grpc(&g);
    GrpcResult twin = Grpc(g);
    EXPECT_EQ(twin.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.grpc_field;
    EXPECT_EQ(twin.status.error_message().rfind(c.grpc_field, 0), 0u) << twin.status.error_message();
  }
  // Invalid UTF-8 (the gRPC API's "prompt: invalid UTF-8") is not JSON at all.
  HttpResult utf8 = Curl("POST", "/v1/completions", std::string("{\"prompt\": \"a\xff\"}"));
  EXPECT_EQ(utf8.status, 400);
  EXPECT_EQ(utf8.Json()["error"]["type"], "invalid_request_error");
  // A prompt longer than the context window.
  json ids = json::array();
  for (int i = 0; i < 5000; ++i) ids.push_back(1);
  HttpResult ctx = Curl("POST", "/v1/completions", json{{"prompt", ids}, {"max_tokens", kLimit}}.dump());
  EXPECT_EQ(ctx.status, 400) << ctx.body;
  EXPECT_EQ(ctx.Json()["error"]["param"], "prompt") << ctx.body;
}

// /v1/models lists the served model; unknown models and routes are 404 in the
// envelope; /health is 200 while the model services are up; /metrics is served.
TEST_F(OpenAiE2eTest, ModelsNotFoundHealthAndMetrics) {
  HttpResult models = Curl("GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.Json()["object"], "list");
  EXPECT_EQ(models.Json()["data"][0]["id"], kModelId);
  EXPECT_EQ(models.Json()["data"][0]["object"], "model");
  EXPECT_EQ(Curl("GET", std::string("/v1/models/") + kModelId).status, 200);
  HttpResult nomodel = Curl("GET", "/v1/models/gpt-4");
  EXPECT_EQ(nomodel.status, 404);
  EXPECT_EQ(nomodel.Json()["error"]["code"], "model_not_found");
  HttpResult wrong = Curl("POST", "/v1/completions", R"({"model": "gpt-4", "prompt": "a"})");
  EXPECT_EQ(wrong.status, 404);
  EXPECT_EQ(wrong.Json()["error"]["param"], "model");
  HttpResult route = Curl("GET", "/v2/nothing");
  EXPECT_EQ(route.status, 404);
  EXPECT_EQ(route.Json()["error"]["type"], "not_found_error");
  HttpResult health = Curl("GET", "/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.Json()["status"], "ok");
  ASSERT_EQ(Curl("POST", "/v1/completions", R"({"prompt": "a", "max_tokens": 2})").status, 200);
  HttpResult metrics = Curl("GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_THAT(metrics.headers, HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(metrics.body, HasSubstr("# TYPE lede_request_success_total counter"));
  EXPECT_THAT(metrics.body, HasSubstr("lede_request_success_total{finished_reason=\"length\"}"));
}

// Every KV slot busy is 429 rate_limit_error (RESOURCE_EXHAUSTED over gRPC).
TEST_F(OpenAiE2eTest, FullSlotsAre429) {
  auto verifier = lede::v1::Verifier::NewStub(
      grpc::CreateChannel(cluster_->verifier_target(), grpc::InsecureChannelCredentials()));
  std::vector<lede::v1::OpenSessionResponse> held;
  for (int i = 0; i < 2; ++i) {  // the cluster's 2 slots
    grpc::ClientContext ctx;
    lede::v1::OpenSessionRequest req;
    req.add_prompt_token_ids(1);
    lede::v1::OpenSessionResponse resp;
    ASSERT_TRUE(verifier->OpenSession(&ctx, req, &resp).ok());
    held.push_back(resp);
  }
  HttpResult r = Curl("POST", "/v1/completions", R"({"prompt": "a", "max_tokens": 4})");
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.Json()["error"]["type"], "rate_limit_error");
  for (const auto& s : held) {
    grpc::ClientContext ctx;
    lede::v1::CloseSessionRequest req;
    req.set_slot(s.slot());
    req.set_pool_epoch(s.pool_epoch());
    req.set_session_id(s.session_id());
    lede::v1::CloseSessionResponse resp;
    EXPECT_TRUE(verifier->CloseSession(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(Curl("POST", "/v1/completions", R"({"prompt": "a", "max_tokens": 4})").status, 200);
}

// Runs disconnect_client.py (Python's http.client) with `n_events` (0 = a
// non-streamed request) and checks that the request ended as an abort, its
// KV slot is free, and the next request runs.
void ExpectDisconnectCancels(int http_port, LedeCluster* cluster, int n_events, int limit) {
  const std::string prompt = "Once upon a time";
  const int mport = cluster->coordinator()->metrics_port();
  const std::string abort_series = "lede_request_success_total{finished_reason=\"abort\"}";
  const std::string cancelled_series = "lede_requests_total{method=\"autoregressive\",status=\"CANCELLED\"}";
  auto sample = [](const std::string& metrics, const std::string& series) {
    const size_t at = metrics.find("\n" + series + " ");
    return at == std::string::npos ? 0.0 : std::atof(metrics.c_str() + at + series.size() + 2);
  };
  const std::string before = HttpGet(mport, "/metrics").body;
  const double aborts_before = sample(before, abort_series);
  const double cancelled_before = sample(before, cancelled_series);

  auto [rc, out] = RunShell("/usr/bin/python3 " + SourceDir() + "/tests/services/openai/disconnect_client.py " +
                            std::to_string(http_port) + " '" + prompt + "' " + std::to_string(limit) + " " +
                            std::to_string(n_events) + " 2>&1");
  ASSERT_EQ(rc, 0) << out;
  json got = json::parse(out, nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << out;
  if (n_events > 0) {
    EXPECT_EQ(got["status"], 200);
    EXPECT_EQ(got["events"].size(), static_cast<size_t>(n_events));
  }
  double aborts = aborts_before, cancelled = cancelled_before, in_use = -1;
  lede::testing::WaitUntil(
      [&] {
        const std::string now = HttpGet(mport, "/metrics").body;
        aborts = sample(now, abort_series);
        cancelled = sample(now, cancelled_series);
        const std::string verifier = HttpGet(cluster->verifier()->metrics_port(), "/metrics").body;
        in_use = verifier.find("\nlede_kv_slots_in_use ") == std::string::npos
                     ? -1
                     : sample(verifier, "lede_kv_slots_in_use");
        // All three series are awaited: the coordinator records the abort
        // and the CANCELLED request separately, and a scrape between the
        // two saw one without the other.
        return aborts >= aborts_before + 1 && cancelled >= cancelled_before + 1 && in_use == 0;
      },
      30s, 50ms);
  EXPECT_EQ(aborts, aborts_before + 1);
  EXPECT_EQ(cancelled, cancelled_before + 1);
  EXPECT_EQ(in_use, 0);
}

// A client that hangs up mid-stream cancels the generation: the request
// ends as an abort, the KV slot is freed, and the next request runs. The
// same for a non-streamed request hung up while it generates.
TEST_F(OpenAiE2eTest, DisconnectCancelsAndFreesTheSlot) {
  // The full greedy generation runs to the limit (no early EOS), so only a
  // cancel can end it as an abort.
  GrpcResult full = Grpc(Greedy("Once upon a time", kLimit, lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE));
  ASSERT_TRUE(full.status.ok());
  ASSERT_EQ(full.summary.finish_reason(), lede::v1::FINISH_REASON_LENGTH);
  {
    SCOPED_TRACE("streamed");
    ExpectDisconnectCancels(port_, cluster_, /*n_events=*/3, kLimit);
  }
  {
    SCOPED_TRACE("not streamed");
    ExpectDisconnectCancels(port_, cluster_, /*n_events=*/0, kLimit);
  }
  EXPECT_EQ(Curl("POST", "/v1/completions", R"({"prompt": "a", "max_tokens": 4})").status, 200);
}

// A model service that dies mid-stream ends the stream with an error event
// (no [DONE]); /health then says 503. Runs last: it kills the drafter.
TEST_F(OpenAiE2eTest, ZzMidStreamFailureIsAnErrorEventAndHealthIs503) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", kLimit}, {"temperature", 0},
                                {"stream", true}}.dump();
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {  // the first event
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0) << got;
    got.append(buf, n);
  }
  cluster_->drafter()->Kill();
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) got.append(buf, n);
  ::close(fd);
  EXPECT_THAT(got, HasSubstr("HTTP/1.1 200"));
  EXPECT_THAT(got, HasSubstr("data: {\"error\":{"));
  EXPECT_THAT(got, HasSubstr("\"type\":\"unavailable_error\""));
  EXPECT_EQ(got.find("[DONE]"), std::string::npos) << got;

  HttpResult health = Curl("GET", "/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.Json()["error"]["type"], "unavailable_error");
  HttpResult down = Curl("POST", "/v1/completions", R"({"prompt": "a", "max_tokens": 4})");
  EXPECT_EQ(down.status, 503) << down.body;
}

}  // namespace
}  // namespace lede
