// End-to-end tests of LEDE across real processes (docs/design.md §3-§6): the
// lede-model verifier and drafter (and a co-located `--role both`), the
// lede-policy service, the lede-coordinator, and, around them, a real
// Prometheus, promtool, s3rver, lede-train and the Python client.
//
// ctest label `integration`: every suite starts its own processes (one
// cluster per suite, shared by its tests; models load in about a second),
// about a minute in all on 2 cores. Token equality is checked against the
// in-process engine (shared/model/decoding.h Engine::Generate) with the same
// settings. Waits for eventual conditions are bounded; nothing asserts on
// timing.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "policy/controllers.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "proto/lede/v1/generation.grpc.pb.h"
#include "proto/lede/v1/model.grpc.pb.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/storage/object_store.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/shared/telemetry/telemetry_test_util.h"
#include "tests/testing/process.h"
#include "tests/testing/s3rver.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"
#include "shared/experience/experience.h"
#include "shared/experience/request_log.h"

namespace lede {
namespace {

using ::lede::testing::ChildProcess;
using ::lede::testing::ClusterOptions;
using ::lede::testing::IsOk;
using ::lede::testing::LedeBinaries;
using ::lede::testing::LedeCluster;
using ::lede::testing::TempDir;
using ::lede::v1::GenerateRequest;
using ::lede::v1::GenerateResponse;
using ::lede::v1::GenerationSummary;
using ::lede::v1::SpeculationMethod;
using ::testing::HasSubstr;
using ::testing::Not;
using telemetry::test_util::FreePort;
using telemetry::test_util::HttpGet;
using telemetry::test_util::RunShell;
using telemetry::test_util::UrlEncode;
using namespace std::chrono_literals;

constexpr int kMaxNewTokensLimit = 256;
constexpr int kPoolDraftLen = 16;  // --max-draft-len of every model process

std::string SourceDir() { return LEDE_SOURCE_DIR; }
std::string ModelDir() { return SourceDir() + "/models/lede-tiny"; }
LedeBinaries Binaries() { return {LEDE_MODEL_BIN, LEDE_COORDINATOR_BIN, LEDE_POLICY_BIN}; }

ClusterOptions BaseOptions() {
  ClusterOptions o;
  o.binaries = Binaries();
  o.model_dir = ModelDir();
  o.max_draft_len = kPoolDraftLen;
  o.coordinator_args = {"--max-new-tokens-limit", std::to_string(kMaxNewTokensLimit)};
  return o;
}

// ------------------------------------------------------------ requests

struct Method {
  std::string name;
  SpeculationMethod method = lede::v1::SPECULATION_METHOD_LEDE;
  int exit_layer = 0;
  int draft_length = 0;
  float threshold = 0;
};

Method Lede() { return {"lede", lede::v1::SPECULATION_METHOD_LEDE}; }
Method Static33() { return {"static E=3 D=3", lede::v1::SPECULATION_METHOD_STATIC, 3, 3}; }
Method Threshold05() { return {"threshold 0.5", lede::v1::SPECULATION_METHOD_THRESHOLD, 0, 0, 0.5f}; }
Method Autoregressive() { return {"autoregressive", lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE}; }

struct Sampling {
  float temperature = 0;
  float top_p = 1;
  uint64_t seed = 0;
};

GenerateRequest MakeRequest(const std::string& prompt, const Method& m, int max_new_tokens = 48,
                            const Sampling& s = {}) {
  GenerateRequest r;
  r.set_prompt(prompt);
  r.set_max_new_tokens(max_new_tokens);
  r.set_method(m.method);
  r.set_temperature(s.temperature);
  r.set_top_p(s.top_p);
  r.set_seed(s.seed);
  r.mutable_speculation()->set_exit_layer(m.exit_layer);
  r.mutable_speculation()->set_draft_length(m.draft_length);
  r.mutable_speculation()->set_threshold(m.threshold);
  return r;
}

struct CallResult {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::string text;
  int deltas = 0;
  std::optional<GenerationSummary> summary;
  bool ok() const { return status.ok(); }
  std::string Describe() const {
    return "code " + std::to_string(status.error_code()) + ": " + status.error_message();
  }
};

// One Generate call read to the end.
CallResult Generate(lede::v1::Generation::Stub& stub, const GenerateRequest& request,
                    std::chrono::milliseconds deadline = 60s) {
  CallResult r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  auto reader = stub.Generate(&ctx, request);
  GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_delta()) {
      ++r.deltas;
      r.text += resp.delta().text();
      r.ids.insert(r.ids.end(), resp.delta().token_ids().begin(), resp.delta().token_ids().end());
    } else if (resp.has_summary()) {
      r.summary = resp.summary();
    }
  }
  r.status = reader->Finish();
  return r;
}

// Retries `request` until it succeeds (each try with a 20 s deadline) or
// `bound` passes; returns the last result.
CallResult GenerateUntilOk(lede::v1::Generation::Stub& stub, const GenerateRequest& request,
                           std::chrono::seconds bound = 45s) {
  CallResult r;
  lede::testing::WaitUntil(
      [&] {
        r = Generate(stub, request, 20s);
        return r.ok();
      },
      bound, 200ms);
  return r;
}

// Sends every request at once, one client thread and stub each, and returns
// the results in request order.
std::vector<CallResult> GenerateConcurrently(LedeCluster& cluster, const std::vector<GenerateRequest>& requests,
                                             std::chrono::seconds deadline = 120s) {
  std::vector<CallResult> results(requests.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < requests.size(); ++i) {
    clients.emplace_back([&, i] {
      auto stub = cluster.NewStub();
      results[i] = Generate(*stub, requests[i], deadline);
    });
  }
  for (std::thread& t : clients) t.join();
  return results;
}

void ExpectConsistentSummary(const CallResult& r, const std::string& what) {
  ASSERT_TRUE(r.summary.has_value()) << what << ": no summary";
  const GenerationSummary& s = *r.summary;
  EXPECT_EQ(s.generated_tokens(), static_cast<int64_t>(r.ids.size())) << what;
  EXPECT_LE(s.accepted_tokens(), s.drafted_tokens()) << what;
  if (s.drafted_tokens() > 0) {
    EXPECT_DOUBLE_EQ(s.acceptance_rate(),
                     static_cast<double>(s.accepted_tokens()) / s.drafted_tokens())
        << what;
  } else {
    EXPECT_EQ(s.accepted_tokens(), 0) << what;
    EXPECT_EQ(s.acceptance_rate(), 0.0) << what;
  }
  EXPECT_GT(s.prompt_tokens(), 0) << what;
  EXPECT_NE(s.finish_reason(), lede::v1::FINISH_REASON_UNSPECIFIED) << what;
  if (s.finish_reason() == lede::v1::FINISH_REASON_LENGTH) {
    EXPECT_EQ(s.generated_tokens(), 48) << what;
  }
}

std::vector<std::string> ReadPrompts(const std::string& file, size_t n) {
  std::vector<std::string> prompts;
  std::ifstream in(file);
  std::string line;
  while (prompts.size() < n && std::getline(in, line)) {
    if (line.empty()) continue;
    prompts.push_back(nlohmann::json::parse(line).at("prompt").get<std::string>());
  }
  return prompts;
}

// --------------------------------------------------- in-process reference

// The in-process engine on the same model, policy, pool geometry and K/V
// dtype: the reference for token equality.
class Reference {
 public:
  static StatusOr<std::unique_ptr<Reference>> Load() {
    at::set_num_threads(1);  // the model processes run with --threads 1
    std::unique_ptr<Reference> r(new Reference());
    LEDE_ASSIGN_OR_RETURN(std::string tok_path, tokenizer::FindTokenizerFile(ModelDir()));
    LEDE_ASSIGN_OR_RETURN(r->tokenizer_, tokenizer::LoadTokenizer(tok_path));
    LEDE_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> m,
                          model::LlamaModel::Load(ModelDir(), model::ModelOptions()));
    r->model_ = std::shared_ptr<const model::LlamaModel>(std::move(m));
    LEDE_ASSIGN_OR_RETURN(policy::dqn::Artifact a,
                          policy::dqn::LoadServingArtifact(ModelDir() + "/policy",
                                                           r->model_->config().ArchitectureFingerprint()));
    r->artifact_ = std::make_shared<const policy::dqn::Artifact>(std::move(a));
    model::KvCacheOptions ko;
    ko.n_slots = 1;
    ko.max_draft_len = kPoolDraftLen;
    // lede-model's K/V dtype (its --kv-dtype default): sampled and greedy
    // tokens match where both read the same K/V.
    ko.kv_dtype = c10::kBFloat16;
    LEDE_ASSIGN_OR_RETURN(r->engine_, model::Engine::Create(r->model_, ko));
    return r;
  }

  std::vector<int32_t> Encode(const std::string& text) const {
    auto ids = tokenizer_->Encode(text, /*add_bos=*/true, /*add_eos=*/false);
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }
  const std::string& policy_version() const { return artifact_->metadata.version; }
  int64_t n_layers() const { return model_->n_layers(); }

  StatusOr<model::GenerationResult> Generate(const std::string& prompt, const Method& m,
                                             int max_new_tokens = 48, const Sampling& s = {}) {
    model::GenerateOptions go;
    go.max_new_tokens = max_new_tokens;
    go.sampling.temperature = s.temperature;
    go.sampling.top_p = s.top_p;
    go.sampling.seed = s.seed;
    std::unique_ptr<speculation::ExitController> controller;
    switch (m.method) {
      case lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE:
        go.mode = model::SpeculationMode::kAutoregressive;
        break;
      case lede::v1::SPECULATION_METHOD_STATIC:
        go.mode = model::SpeculationMode::kStatic;
        go.exit_layer = m.exit_layer;
        go.draft_len = m.draft_length;
        break;
      case lede::v1::SPECULATION_METHOD_THRESHOLD:  // as DrafterService::Draft builds it
        go.mode = model::SpeculationMode::kAdaptive;
        controller = std::make_unique<policy::ThresholdExitController>(m.threshold, m.threshold);
        for (int32_t l = 1; l < n_layers(); ++l) go.decision_spec.candidate_layers.push_back(l);
        go.decision_spec.max_draft_len = std::min(8, kPoolDraftLen);
        break;
      default:  // LEDE, as `lede generate --mode lede` and the drafter build it
        go.mode = model::SpeculationMode::kAdaptive;
        go.decision_spec = artifact_->metadata.decision;
        go.decision_spec.max_draft_len = std::min(go.decision_spec.max_draft_len, kPoolDraftLen);
        controller = std::make_unique<policy::dqn::DqnExitController>(
            std::shared_ptr<const policy::dqn::QNetwork>(artifact_, &artifact_->network),
            artifact_->metadata.version);
        break;
    }
    go.controller = controller.get();
    return engine_->Generate(Encode(prompt), go);
  }

 private:
  Reference() = default;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::shared_ptr<const model::LlamaModel> model_;
  std::shared_ptr<const policy::dqn::Artifact> artifact_;
  std::unique_ptr<model::Engine> engine_;
};

// --------------------------------------------------------- HTTP / metrics

std::string MetricsText(int port) {
  telemetry::test_util::HttpResponse r = HttpGet(port, "/metrics");
  return r.status == 200 ? r.body : "";
}

// The sum of every sample of `name` (any labels) in a Prometheus text
// exposition; nan if there is none.
double SumMetric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  double sum = 0;
  bool found = false;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t end = line.find_first_of("{ ");
    if (end == std::string::npos || line.compare(0, end, name) != 0 || end != name.size()) continue;
    const size_t sp = line.rfind(' ');
    sum += std::strtod(line.c_str() + sp + 1, nullptr);
    found = true;
  }
  return found ? sum : std::nan("");
}

// ------------------------------------------------- raw gRPC (generic stub)

std::string ToBytes(const grpc::ByteBuffer& bb) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!bb.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer FromBytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

bool Next(grpc::CompletionQueue& cq) {
  void* tag = nullptr;
  bool ok = false;
  return cq.Next(&tag, &ok) && ok;
}

void Drain(grpc::CompletionQueue& cq) {
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

struct RawResult {
  grpc::Status status;
  std::string bytes;  // the response message
};

// A unary call of `method` with raw request bytes (a server-streaming
// method answers at most one message this way: enough for errors).
RawResult RawCall(const std::string& target, const std::string& method, const std::string& request) {
  grpc::GenericStub stub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  grpc::ByteBuffer resp;
  RawResult r;
  auto call = stub.PrepareUnaryCall(&ctx, method, FromBytes(request), &cq);
  call->StartCall();
  call->Finish(&resp, &r.status, reinterpret_cast<void*>(1));
  Next(cq);
  Drain(cq);
  r.bytes = ToBytes(resp);
  return r;
}

// A unary call of `method` with raw request bytes; returns the response bytes.
StatusOr<std::string> RawUnary(const std::string& target, const std::string& method,
                               const std::string& request) {
  RawResult r = RawCall(target, method, request);
  if (!r.status.ok()) return UnavailableError(method + ": " + r.status.error_message());
  return r.bytes;
}

// A bidi call of `method`: writes one request, half-closes and returns every
// response's bytes concatenated.
StatusOr<std::string> RawBidiOnce(const std::string& target, const std::string& method,
                                  const std::string& request) {
  grpc::GenericStub stub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  auto call = stub.PrepareCall(&ctx, method, &cq);
  std::string all;
  call->StartCall(reinterpret_cast<void*>(1));
  if (Next(cq)) {
    call->Write(FromBytes(request), reinterpret_cast<void*>(2));
    if (Next(cq)) {
      call->WritesDone(reinterpret_cast<void*>(3));
      Next(cq);
      while (true) {
        grpc::ByteBuffer resp;
        call->Read(&resp, reinterpret_cast<void*>(4));
        if (!Next(cq)) break;
        all += ToBytes(resp);
      }
    }
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  Next(cq);
  Drain(cq);
  if (!status.ok()) return UnavailableError(method + ": " + status.error_message());
  return all;
}

// ==================================================================== suites

// One split cluster (policy service + verifier + drafter following it +
// coordinator) and one co-located cluster (`--role both` + coordinator),
// shared by the tests of the suite, and the in-process reference.
class E2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto ref = Reference::Load();
    if (!ref.ok()) {
      *setup_error_ = "reference: " + ref.status().ToString();
      return;
    }
    reference_ = ref->release();
    ClusterOptions split = BaseOptions();
    split.policy_service = true;
    split_ = new LedeCluster(split);
    if (Status s = split_->Start(); !s.ok()) {
      *setup_error_ = "split cluster: " + s.ToString();
      return;
    }
  }
  // The co-located cluster, started on first use (ctest runs each test in
  // its own process; most do not need it).
  static LedeCluster* Colocated() {
    if (colocated_ == nullptr) {
      ClusterOptions both = BaseOptions();
      both.colocated = true;
      both.experience_url = "none";
      colocated_ = new LedeCluster(both);
      if (Status s = colocated_->Start(); !s.ok()) {
        ADD_FAILURE() << "co-located cluster: " << s;
      }
    }
    return colocated_;
  }
  static void TearDownTestSuite() {
    delete colocated_;
    delete split_;
    delete reference_;
    colocated_ = nullptr;
    split_ = nullptr;
    reference_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(setup_error_->empty()) << *setup_error_;
    stub_ = split_->NewStub();
  }

  static std::vector<std::string> Prompts() {
    std::vector<std::string> p = ReadPrompts(ModelDir() + "/prompts/story.jsonl", 2);
    for (const std::string& c : ReadPrompts(ModelDir() + "/prompts/code.jsonl", 1)) p.push_back(c);
    return p;
  }

  static inline Reference* reference_ = nullptr;
  static inline LedeCluster* split_ = nullptr;
  static inline LedeCluster* colocated_ = nullptr;
  static inline std::string* setup_error_ = new std::string();
  std::unique_ptr<lede::v1::Generation::Stub> stub_;
};

// Every method, greedy, streams exactly the in-process engine's tokens, and
// the summary's counts agree with the stream.
TEST_F(E2eTest, EachMethodMatchesInProcessEngine) {
  const std::vector<std::string> prompts = Prompts();
  ASSERT_EQ(prompts.size(), 3u);
  for (const Method& m : {Lede(), Static33(), Threshold05(), Autoregressive()}) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::string what = m.name + ", prompt " + std::to_string(i);
      auto expected = reference_->Generate(prompts[i], m);
      ASSERT_THAT(expected, IsOk()) << what;
      CallResult got = Generate(*stub_, MakeRequest(prompts[i], m));
      ASSERT_TRUE(got.ok()) << what << ": " << got.Describe();
      EXPECT_EQ(got.ids, expected->tokens) << what;
      ExpectConsistentSummary(got, what);
      if (m.method == lede::v1::SPECULATION_METHOD_LEDE) {
        EXPECT_EQ(got.summary->policy_version(), reference_->policy_version()) << what;
      }
      if (m.method == lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE) {
        EXPECT_EQ(got.summary->drafted_tokens(), 0) << what;
      } else {
        EXPECT_EQ(got.summary->drafted_tokens(), expected->stats.n_drafted) << what;
        EXPECT_EQ(got.summary->accepted_tokens(), expected->stats.n_accepted) << what;
      }
    }
  }
}

// Seeded sampling (temperature 0.8, top_p 0.95, seed 7) draws the same
// tokens split as in-process: draws are keyed by position (RoundSeed).
TEST_F(E2eTest, SeededSamplingMatchesInProcessEngine) {
  const Sampling s{0.8f, 0.95f, 7};
  const std::string prompt = Prompts()[0];
  for (const Method& m : {Lede(), Static33(), Autoregressive()}) {
    auto expected = reference_->Generate(prompt, m, 48, s);
    ASSERT_THAT(expected, IsOk()) << m.name;
    CallResult got = Generate(*stub_, MakeRequest(prompt, m, 48, s));
    ASSERT_TRUE(got.ok()) << m.name << ": " << got.Describe();
    EXPECT_EQ(got.ids, expected->tokens) << m.name;
    ExpectConsistentSummary(got, m.name + " sampled");
  }
}

// A co-located deployment (`--role both`) returns the split deployment's tokens.
TEST_F(E2eTest, ColocatedMatchesSplit) {
  ASSERT_NE(Colocated()->coordinator(), nullptr);
  auto colocated = Colocated()->NewStub();
  const std::vector<std::string> prompts = Prompts();
  for (const Method& m : {Lede(), Static33(), Threshold05(), Autoregressive()}) {
    for (const Sampling& s : {Sampling{}, Sampling{0.8f, 0.95f, 7}}) {
      const std::string what = m.name + " T=" + std::to_string(s.temperature);
      CallResult split = Generate(*stub_, MakeRequest(prompts[2], m, 48, s));
      CallResult both = Generate(*colocated, MakeRequest(prompts[2], m, 48, s));
      ASSERT_TRUE(split.ok()) << what << ": " << split.Describe();
      ASSERT_TRUE(both.ok()) << what << ": " << both.Describe();
      EXPECT_EQ(both.ids, split.ids) << what;
      EXPECT_EQ(both.text, split.text) << what;
    }
  }
}

// Bad requests end with INVALID_ARGUMENT naming the field, and the
// coordinator keeps serving.
TEST_F(E2eTest, BadRequestsAreInvalidArgumentNamingTheField) {
  struct Case {
    std::string name;
    std::string field;  // expected in the message
    std::function<void(GenerateRequest&)> mutate;
  };
  const std::vector<Case> cases = {
      {"empty prompt", "prompt", [](GenerateRequest& r) { r.clear_prompt(); }},
      {"prompt and prompt_token_ids", "prompt", [](GenerateRequest& r) { r.add_prompt_token_ids(1); }},
      {"prompt beyond the context window", "prompt",
       [](GenerateRequest& r) {
         r.clear_prompt();
         for (int i = 0; i < 600; ++i) r.add_prompt_token_ids(100);
         r.set_max_new_tokens(1);
       }},
      {"max_new_tokens 0", "max_new_tokens", [](GenerateRequest& r) { r.set_max_new_tokens(0); }},
      {"max_new_tokens over the limit", "max_new_tokens",
       [](GenerateRequest& r) { r.set_max_new_tokens(kMaxNewTokensLimit + 1); }},
      {"temperature -1", "temperature", [](GenerateRequest& r) { r.set_temperature(-1); }},
      {"top_p 1.5", "top_p", [](GenerateRequest& r) { r.set_top_p(1.5f); }},
      {"unknown method 99", "method",
       [](GenerateRequest& r) { r.set_method(static_cast<SpeculationMethod>(99)); }},
      {"static exit_layer 0", "exit_layer",
       [](GenerateRequest& r) {
         r.set_method(lede::v1::SPECULATION_METHOD_STATIC);
         r.mutable_speculation()->set_exit_layer(0);
         r.mutable_speculation()->set_draft_length(3);
       }},
      {"static exit_layer 99", "exit_layer",
       [](GenerateRequest& r) {
         r.set_method(lede::v1::SPECULATION_METHOD_STATIC);
         r.mutable_speculation()->set_exit_layer(99);
         r.mutable_speculation()->set_draft_length(3);
       }},
      {"static draft_length 99", "draft_length",
       [](GenerateRequest& r) {
         r.set_method(lede::v1::SPECULATION_METHOD_STATIC);
         r.mutable_speculation()->set_exit_layer(3);
         r.mutable_speculation()->set_draft_length(99);
       }},
      {"prompt_token_ids above V", "prompt_token_ids",
       [](GenerateRequest& r) {
         r.clear_prompt();
         r.add_prompt_token_ids(1);
         r.add_prompt_token_ids(5000);
       }},
      {"prompt_token_ids negative", "prompt_token_ids",
       [](GenerateRequest& r) {
         r.clear_prompt();
         r.add_prompt_token_ids(-1);
       }},
  };
  for (const Case& c : cases) {
    GenerateRequest r = MakeRequest("Once upon a time", Lede(), 16);
    c.mutate(r);
    CallResult got = Generate(*stub_, r, 30s);
    EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name << ": " << got.Describe();
    EXPECT_THAT(got.status.error_message(), HasSubstr(c.field)) << c.name;
    EXPECT_TRUE(got.ids.empty()) << c.name;
  }
  CallResult after = Generate(*stub_, MakeRequest("Once upon a time", Lede(), 16));
  EXPECT_TRUE(after.ok()) << after.Describe();
  EXPECT_FALSE(after.ids.empty());
}

// A prompt of invalid UTF-8 (bytes ff fe on the wire) is INVALID_ARGUMENT
// naming `prompt`, and the coordinator keeps serving.
//
// KNOWN FAILURE (reported, not fixed): GenerateRequest.prompt is a proto3
// `string`, so gRPC's protobuf deserializer rejects the request before
// GenerationService::Generate runs and the client gets INTERNAL with an empty
// message; the coordinator's own IsValidUtf8 checks (prompt, request_id,
// stop in services/coordinator/coordinator.cc) are unreachable over gRPC.
// Fixing it needs `bytes` fields in proto/lede/v1/generation.proto (wire
// compatible; the Python client then sends encoded bytes) or a raw-buffer
// handler in the coordinator.
TEST_F(E2eTest, InvalidUtf8PromptIsInvalidArgumentNamingPrompt) {
  // Serialize a valid request, then swap its prompt's bytes on the wire.
  GenerateRequest r = MakeRequest("@@", Lede(), 16);
  std::string wire = r.SerializeAsString();
  const size_t at = wire.find("@@");
  ASSERT_NE(at, std::string::npos);
  wire.replace(at, 2, "\xff\xfe");
  RawResult got = RawCall(split_->coordinator_target(), "/lede.v1.Generation/Generate", wire);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << "got code " << got.status.error_code() << " \"" << got.status.error_message()
      << "\": the request never reached GenerationService::Generate (proto3 string fields are "
         "UTF-8-checked by protobuf's parser, which gRPC maps to INTERNAL)";
  EXPECT_THAT(got.status.error_message(), HasSubstr("prompt"));
  CallResult after = Generate(*stub_, MakeRequest("Once upon a time", Lede(), 16));
  EXPECT_TRUE(after.ok()) << after.Describe();
}

// /metrics of the coordinator counts drafted tokens after LEDE requests, and
// every process's /metrics passes `promtool check metrics`.
TEST_F(E2eTest, MetricsCountDraftsAndPassPromtool) {
  for (int i = 0; i < 2; ++i) {
    CallResult r = Generate(*stub_, MakeRequest(Prompts()[i], Lede()));
    ASSERT_TRUE(r.ok()) << r.Describe();
  }
  const std::string coordinator = MetricsText(split_->coordinator()->metrics_port());
  EXPECT_GT(SumMetric(coordinator, "lede_spec_decode_num_draft_tokens_total"), 0) << coordinator;
  EXPECT_GT(SumMetric(coordinator, "lede_spec_decode_num_accepted_tokens_total"), 0) << coordinator;
  // The model processes' measured step costs (seconds, medians of their served steps).
  const std::string verifier = MetricsText(split_->verifier()->metrics_port());
  const std::string drafter = MetricsText(split_->drafter()->metrics_port());
  EXPECT_GT(SumMetric(verifier, "lede_model_verify_seconds"), 0) << verifier;
  EXPECT_GT(SumMetric(drafter, "lede_model_draft_step_seconds"), 0) << drafter;

  constexpr char kPromtool[] = "/usr/bin/promtool";
  if (!telemetry::test_util::FileExecutable(kPromtool)) GTEST_SKIP() << kPromtool << " not installed";
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::vector<std::pair<std::string, ChildProcess*>> processes = {
      {"coordinator", split_->coordinator()},
      {"verifier", split_->verifier()},
      {"drafter", split_->drafter()},
      {"policy", split_->policy()},
      {"co-located model", Colocated()->verifier()},
      {"co-located coordinator", Colocated()->coordinator()}};
  for (const auto& [name, p] : processes) {
    ASSERT_NE(p, nullptr) << name;
    const std::string text = MetricsText(p->metrics_port());
    EXPECT_FALSE(text.empty()) << name << ": no /metrics on port " << p->metrics_port();
    const std::filesystem::path file = tmp.path() / "metrics.txt";
    std::ofstream(file) << text;
    auto [code, out] = RunShell(std::string(kPromtool) + " check metrics < " + file.string() + " 2>&1");
    EXPECT_EQ(code, 0) << name << ": promtool says:\n" << out << "\n/metrics:\n" << text.substr(0, 4000);
  }
}

// A real Prometheus scraping the coordinator answers the acceptance-ratio
// query with the ratio of the counters on /metrics.
TEST_F(E2eTest, PrometheusComputesAcceptanceRatio) {
  constexpr char kPrometheus[] = "/usr/bin/prometheus";
  if (!telemetry::test_util::FileExecutable(kPrometheus)) GTEST_SKIP() << kPrometheus << " not installed";
  CallResult r = Generate(*stub_, MakeRequest(Prompts()[1], Lede()));
  ASSERT_TRUE(r.ok()) << r.Describe();
  const std::string text = MetricsText(split_->coordinator()->metrics_port());
  const double expected = SumMetric(text, "lede_spec_decode_num_accepted_tokens_total") /
                          SumMetric(text, "lede_spec_decode_num_draft_tokens_total");
  ASSERT_GT(expected, 0) << text;
  ASSERT_LE(expected, 1) << text;

  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const int prom_port = FreePort();
  ASSERT_GT(prom_port, 0);
  std::ofstream(tmp.path() / "prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
         "scrape_configs:\n  - job_name: lede-coordinator\n    static_configs:\n"
         "      - targets: ['127.0.0.1:"
      << split_->coordinator()->metrics_port() << "']\n";
  auto prometheus = ChildProcess::Start(
      {kPrometheus, "--config.file=" + (tmp.path() / "prometheus.yml").string(),
       "--storage.tsdb.path=" + (tmp.path() / "data").string(),
       "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
      (tmp.path() / "prometheus.log").string());
  ASSERT_THAT(prometheus, IsOk());
  const std::string query =
      "/api/v1/query?query=" + UrlEncode("sum(lede_spec_decode_num_accepted_tokens_total)"
                                         " / sum(lede_spec_decode_num_draft_tokens_total)");
  double got = std::nan("");
  std::string last_body;
  lede::testing::WaitUntil(
      [&] {
        if (!(*prometheus)->Running()) return true;  // gone: fail below with its log
        telemetry::test_util::HttpResponse resp = HttpGet(prom_port, query);
        if (resp.status != 200) return false;
        last_body = resp.body;
        auto json = nlohmann::json::parse(resp.body, nullptr, /*allow_exceptions=*/false);
        if (json.is_discarded() || json.value("status", "") != "success" ||
            !json["data"]["result"].is_array() || json["data"]["result"].empty()) {
          return false;
        }
        got = std::stod(json["data"]["result"][0]["value"][1].get<std::string>());
        return std::abs(got - expected) <= 1e-6;
      },
      30s, 250ms);
  EXPECT_NEAR(got, expected, 1e-6) << "last response: " << last_body << "\nprometheus log:\n"
                                   << ChildProcess::Tail((*prometheus)->Log());
  EXPECT_GT(got, 0);
  EXPECT_LE(got, 1);
}

// The Python client (scripts/lede_client.py --json) receives the C++
// client's tokens for the same request.
TEST_F(E2eTest, PythonClientMatchesCppClient) {
  constexpr char kPython[] = "/usr/bin/python3";
  if (!telemetry::test_util::FileExecutable(kPython)) GTEST_SKIP() << kPython << " not installed";
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string err = (tmp.path() / "stderr.txt").string();
  // Stubs go to a private folder, not the shared build/python.
  auto [code, out] = RunShell("LEDE_PY_STUBS=" + (tmp.path() / "py").string() + " " + kPython + " " +
                              SourceDir() + "/scripts/lede_client.py --target " + split_->coordinator_target() +
                              " --json --max-new-tokens 32 \"Once upon a time\" 2>" + err);
  ASSERT_EQ(code, 0) << out << ChildProcess::Tail(telemetry::test_util::ReadAll(err));
  auto json = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(json.is_discarded()) << out;
  const std::vector<int32_t> py_ids = json.at("token_ids").get<std::vector<int32_t>>();
  CallResult cpp = Generate(*stub_, MakeRequest("Once upon a time", Lede(), 32));
  ASSERT_TRUE(cpp.ok()) << cpp.Describe();
  EXPECT_EQ(py_ids, cpp.ids);
  EXPECT_EQ(json.at("text").get<std::string>(), cpp.text);
  EXPECT_FALSE(py_ids.empty());
}

// Every process answers grpc.health.v1 Check with SERVING, and server
// reflection lists its services.
TEST_F(E2eTest, HealthCheckAndReflectionOnEveryProcess) {
  struct Target {
    std::string name;
    ChildProcess* process;
    std::string service;  // expected in the reflection listing
  };
  const std::vector<Target> targets = {
      {"coordinator", split_->coordinator(), "lede.v1.Generation"},
      {"verifier", split_->verifier(), "lede.v1.Verifier"},
      {"drafter", split_->drafter(), "lede.v1.Drafter"},
      {"policy", split_->policy(), "lede.v1.Policy"},
      {"co-located model", Colocated()->verifier(), "lede.v1.Drafter"},
      {"co-located coordinator", Colocated()->coordinator(), "lede.v1.Generation"}};
  for (const Target& t : targets) {
    ASSERT_NE(t.process, nullptr) << t.name;
    auto health = RawUnary(t.process->grpc_target(), "/grpc.health.v1.Health/Check", "");
    ASSERT_THAT(health, IsOk()) << t.name;
    // HealthCheckResponse{status: SERVING}: field 1, varint 1.
    EXPECT_EQ(*health, std::string("\x08\x01", 2)) << t.name;
    // ServerReflectionRequest{list_services: ""}: field 7, length 0.
    auto listing = RawBidiOnce(t.process->grpc_target(),
                               "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                               std::string("\x3a\x00", 2));
    ASSERT_THAT(listing, IsOk()) << t.name;
    EXPECT_THAT(*listing, HasSubstr(t.service)) << t.name;
    EXPECT_THAT(*listing, HasSubstr("grpc.health.v1.Health")) << t.name;
  }
}

// `binary` does not link libtorch: not in its dynamic section, not mapped in
// its running process `pid`.
void ExpectNoLibtorch(const std::string& binary, int pid) {
  auto [code, out] = RunShell("readelf -d " + binary + " 2>&1");
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("NEEDED"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("libtorch"))) << binary;
  EXPECT_THAT(out, ::testing::Not(HasSubstr("libc10"))) << binary;
  const std::string maps = telemetry::test_util::ReadAll("/proc/" + std::to_string(pid) + "/maps");
  ASSERT_FALSE(maps.empty());
  EXPECT_THAT(maps, ::testing::Not(HasSubstr("libtorch"))) << binary;
  EXPECT_THAT(maps, ::testing::Not(HasSubstr("libc10"))) << binary;
}

// The coordinator never links libtorch.
TEST_F(E2eTest, CoordinatorDoesNotLinkLibtorch) {
  ExpectNoLibtorch(LEDE_COORDINATOR_BIN, split_->coordinator()->pid());
}

// The policy service never links libtorch (its artifacts and the model
// config are read by the torch-free shared/checkpoint).
TEST_F(E2eTest, PolicyServiceDoesNotLinkLibtorch) {
  ExpectNoLibtorch(LEDE_POLICY_BIN, split_->policy()->pid());
}

// The model processes allocate with jemalloc (linked into lede-model ahead
// of libc, so its malloc is the one every library calls): glibc's arenas
// kept growing the verifier's RSS under a long soak.
TEST_F(E2eTest, ModelProcessesAllocateWithJemalloc) {
  auto [code, out] = RunShell(std::string("readelf -d ") + LEDE_MODEL_BIN + " 2>&1");
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("libjemalloc")) << LEDE_MODEL_BIN;
  for (ChildProcess* p : {split_->verifier(), split_->drafter()}) {
    const std::string maps = telemetry::test_util::ReadAll("/proc/" + std::to_string(p->pid()) + "/maps");
    ASSERT_FALSE(maps.empty());
    EXPECT_THAT(maps, HasSubstr("libjemalloc"));
  }
}

// Sends LEDE requests through an extra coordinator that logs experience to
// `store_url`, stops it with SIGTERM (it must exit 0, having flushed), and
// checks that the store holds whole shards under "experience", every
// transition tagged with the serving policy version.
void LogExperienceAndCheck(LedeCluster& cluster, const std::string& store_url,
                           const std::vector<std::string>& prompts) {
  auto coordinator = cluster.StartExtraCoordinator(false, store_url);
  ASSERT_THAT(coordinator, IsOk());
  auto stub = LedeCluster::NewStub((*coordinator)->grpc_target());
  std::vector<std::vector<int32_t>> outputs;
  for (const std::string& p : prompts) {
    CallResult r = Generate(*stub, MakeRequest(p, Lede()));
    ASSERT_TRUE(r.ok()) << r.Describe();
    outputs.push_back(r.ids);
  }
  // A sampling request: its transitions are logged, and it is in the request log with its settings.
  CallResult sampled = Generate(*stub, MakeRequest(prompts[0], Lede(), 16, Sampling{0.8f, 0.95f, 3}));
  ASSERT_TRUE(sampled.ok()) << sampled.Describe();
  (*coordinator)->Signal(SIGTERM);
  std::optional<int> code = (*coordinator)->Wait(30s);
  ASSERT_TRUE(code.has_value()) << "the coordinator did not exit after SIGTERM";
  EXPECT_EQ(*code, 0) << ChildProcess::Tail((*coordinator)->Log());

  auto store = storage::OpenObjectStore(store_url);
  ASSERT_THAT(store, IsOk());
  auto read = experience::ReadShardsFromStore(**store, "experience");
  ASSERT_THAT(read, IsOk());
  EXPECT_GT(read->transitions.size(), 0u);
  EXPECT_FALSE(read->shards.empty());
  for (const experience::ShardReport& s : read->shards) EXPECT_EQ(s.error, "") << s.path;
  auto serving = policy::dqn::ResolveServingVersion(ModelDir() + "/policy");
  ASSERT_THAT(serving, IsOk());
  for (const experience::Transition& t : read->transitions) ASSERT_EQ(t.policy_version, *serving);

  // The request log: one record per greedy request, beside the
  // experience shards, holding what the client received.
  auto requests = experience::ReadRequestLog(**store);
  ASSERT_THAT(requests, IsOk());
  EXPECT_EQ(requests->bad_shards(), 0);
  ASSERT_EQ(requests->records.size(), prompts.size() + 1);
  std::set<std::string> ids;
  int n_sampled = 0;
  for (const lede::v1::RequestRecord& r : requests->records) {
    if (!experience::IsGreedyRecord(r)) {
      ++n_sampled;
      EXPECT_FLOAT_EQ(r.temperature(), 0.8f);
      EXPECT_FLOAT_EQ(r.top_p(), 0.95f);
      EXPECT_EQ(r.seed(), 3u);
      EXPECT_EQ(r.output_token_ids_size(), static_cast<int>(sampled.ids.size()));
      continue;
    }
    ids.insert(r.request_id());
    EXPECT_GT(r.prompt_token_ids_size(), 0);
    EXPECT_EQ(r.method(), "lede");
    EXPECT_EQ(r.policy_version(), *serving);
    EXPECT_FALSE(r.model_fingerprint().empty());
    EXPECT_GE(r.load(), 1);
    EXPECT_EQ(r.max_new_tokens(), 48);
    EXPECT_GT(r.decode_us(), 0);
    // The deployment's own step costs, as the drafter and the verifier measured them (served_costs.h).
    ASSERT_TRUE(r.has_measured_costs()) << r.request_id();
    const lede::v1::CostProfile& costs = r.measured_costs();
    EXPECT_FALSE(costs.weight_format().empty());
    int64_t draft_samples = 0, verify_samples = 0;
    for (int64_t n : costs.draft_step_samples()) draft_samples += n;
    for (int64_t n : costs.verify_samples()) verify_samples += n;
    EXPECT_GT(draft_samples, 0) << r.request_id();
    EXPECT_GT(verify_samples, 0) << r.request_id();
    const std::vector<int32_t> out(r.output_token_ids().begin(), r.output_token_ids().end());
    EXPECT_NE(std::find(outputs.begin(), outputs.end(), out), outputs.end()) << r.request_id();
  }
  EXPECT_EQ(ids.size(), prompts.size());
  EXPECT_EQ(n_sampled, 1);
}

// Experience: LEDE requests through a coordinator logging to a directory
// store; after SIGTERM it exits 0 and its shards read back whole, every
// transition tagged with the serving policy version; lede-train trains a
// policy from them.
TEST_F(E2eTest, ExperienceShardsReadBackAndTrain) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = (tmp.path() / "store").string();
  std::filesystem::create_directories(dir);
  LogExperienceAndCheck(*split_, dir, Prompts());
  if (HasFatalFailure()) return;

  // lede-train on the logged store writes a policy artifact.
  const std::string out = (tmp.path() / "policies" / "v-test").string();
  auto train = ChildProcess::Start({LEDE_TRAIN_BIN, "--experience", "file://" + dir, "--out", out,
                                    "--version", "v-test", "--epochs", "2", "--threads", "1"},
                                   (tmp.path() / "train.log").string());
  ASSERT_THAT(train, IsOk());
  std::optional<int> trained = (*train)->Wait(120s);
  ASSERT_TRUE(trained.has_value()) << "lede-train still running";
  EXPECT_EQ(*trained, 0) << ChildProcess::Tail((*train)->Log());
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(out) / "policy.json"))
      << ChildProcess::Tail((*train)->Log());
}

// The same through an S3 store (s3rver): shards are complete objects.
TEST_F(E2eTest, ExperienceShardsReadBackFromS3) {
  lede::testing::S3rver s3;
  if (!s3.available()) GTEST_SKIP() << s3.skip_reason();
  ASSERT_THAT(s3.Start("lede-e2e"), IsOk());
  // s3rver's built-in credentials, inherited by the coordinator.
  ::setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
  ::unsetenv("AWS_SESSION_TOKEN");
  const std::string url = "s3://lede-e2e/run?endpoint=" + s3.endpoint() + "&region=us-east-1";
  LogExperienceAndCheck(*split_, url, Prompts());
}

// ------------------------------------------------------------ one KV slot

// One split cluster with kSlots KV slots and no experience, shared by the
// tests of a suite.
template <int kSlots>
class OneClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions o = BaseOptions();
    o.slots = kSlots;
    o.experience_url = "none";
    cluster_ = new LedeCluster(o);
    if (Status s = cluster_->Start(); !s.ok()) *setup_error_ = s.ToString();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(setup_error_->empty()) << *setup_error_;
    stub_ = cluster_->NewStub();
  }

  static inline LedeCluster* cluster_ = nullptr;
  static inline std::string* setup_error_ = new std::string();
  std::unique_ptr<lede::v1::Generation::Stub> stub_;
};

// A cluster with --slots 1: admission and freeing of the only KV slot.
class E2eSingleSlotTest : public OneClusterTest<1> {
 protected:

  // A channel with a tiny HTTP/2 receive window and no BDP probing: a
  // stream this client does not read stalls the server's writes after a
  // few hundred bytes, so its request holds the KV slot until read or
  // cancelled (however fast the model is).
  static std::unique_ptr<lede::v1::Generation::Stub> SlowReaderStub() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 256);
    args.SetInt("lede.e2e.unique", 1);  // its own connection
    return lede::v1::Generation::NewStub(
        grpc::CreateCustomChannel(cluster_->coordinator_target(), grpc::InsecureChannelCredentials(), args));
  }

  // A long request: sampled (so it is unlikely to end at EOS soon) and long.
  static GenerateRequest LongRequest() {
    return MakeRequest(ReadPrompts(ModelDir() + "/prompts/code.jsonl", 1)[0], Autoregressive(),
                       kMaxNewTokensLimit, Sampling{1.0f, 1.0f, 11});
  }

  // Waits until the verifier reports no slot in use (bounded).
  static double WaitForFreeSlots(std::chrono::seconds bound = 20s) {
    double in_use = std::nan("");
    lede::testing::WaitUntil(
        [&] {
          in_use = SumMetric(MetricsText(cluster_->verifier()->metrics_port()), "lede_kv_slots_in_use");
          return in_use == 0;
        },
        bound, 50ms);
    return in_use;
  }

  static std::string Logs() {
    return "\ncoordinator log:\n" + ChildProcess::Tail(cluster_->coordinator()->Log(), 1500) +
           "\nverifier log:\n" + ChildProcess::Tail(cluster_->verifier()->Log(), 1500);
  }
};

// While one request streams on the only slot, a second waits in the
// verifier's queue (it is not refused) and completes once the first is
// done, with the tokens of its solo run.
TEST_F(E2eSingleSlotTest, BusySlotQueuesTheNextRequestUntilReleased) {
  const GenerateRequest queued_request = MakeRequest("Once upon a time", Lede(), 8);
  CallResult solo = Generate(*stub_, queued_request, 30s);
  ASSERT_TRUE(solo.ok()) << solo.Describe();
  const int coordinator_metrics = cluster_->coordinator()->metrics_port();
  const double queued_before = SumMetric(MetricsText(cluster_->verifier()->metrics_port()),
                                         "lede_request_queue_time_seconds_count");

  auto slow = SlowReaderStub();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto first = slow->Generate(&ctx, LongRequest());
  GenerateResponse resp;
  ASSERT_TRUE(first->Read(&resp));
  ASSERT_TRUE(resp.has_delta());

  CallResult second;
  std::thread waiter([&] { second = Generate(*stub_, queued_request, 60s); });
  // The second is admitted and waits for the slot (not refused).
  EXPECT_TRUE(lede::testing::WaitUntil(
      [&] { return SumMetric(MetricsText(coordinator_metrics), "lede_num_requests_waiting") == 1; }, 20s, 20ms))
      << Logs();

  // Read the first to its end; the queued one runs then.
  bool summary = false;
  while (first->Read(&resp)) summary = summary || resp.has_summary();
  grpc::Status st = first->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_TRUE(summary);
  waiter.join();
  ASSERT_TRUE(second.ok()) << second.Describe() << Logs();
  EXPECT_EQ(second.ids, solo.ids);
  EXPECT_GT(SumMetric(MetricsText(cluster_->verifier()->metrics_port()), "lede_request_queue_time_seconds_count"),
            queued_before);
  EXPECT_EQ(WaitForFreeSlots(), 0) << Logs();
}

// A queued request whose deadline passes while it waits ends with
// DEADLINE_EXCEEDED, leaves the queue and takes no slot with it.
TEST_F(E2eSingleSlotTest, QueuedRequestDeadlineHolds) {
  auto slow = SlowReaderStub();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto first = slow->Generate(&ctx, LongRequest());
  GenerateResponse resp;
  ASSERT_TRUE(first->Read(&resp));

  CallResult queued = Generate(*stub_, MakeRequest("Once upon a time", Lede(), 8), 300ms);
  EXPECT_EQ(queued.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << queued.Describe();

  while (first->Read(&resp)) {
  }
  EXPECT_TRUE(first->Finish().ok());
  EXPECT_EQ(WaitForFreeSlots(), 0) << "the expired request left a slot or a queue entry behind" << Logs();
  CallResult next = Generate(*stub_, MakeRequest("Once upon a time", Lede(), 8), 30s);
  EXPECT_TRUE(next.ok()) << next.Describe();
}

// A caller that lost OpenSession's answer closes the session by its
// request id (CloseSession with slot < 0); without a request id that is
// INVALID_ARGUMENT naming the field.
TEST_F(E2eSingleSlotTest, SessionClosesByRequestId) {
  auto verifier = lede::v1::Verifier::NewStub(
      grpc::CreateChannel(cluster_->verifier_target(), grpc::InsecureChannelCredentials()));
  lede::v1::OpenSessionRequest open;
  open.add_prompt_token_ids(1);
  open.set_request_id("orphan-1");
  lede::v1::OpenSessionResponse opened;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(verifier->OpenSession(&ctx, open, &opened).ok());
  }
  ASSERT_EQ(SumMetric(MetricsText(cluster_->verifier()->metrics_port()), "lede_kv_slots_in_use"), 1);
  lede::v1::CloseSessionRequest close;
  close.set_slot(-1);
  lede::v1::CloseSessionResponse closed;
  {
    grpc::ClientContext ctx;
    grpc::Status s = verifier->CloseSession(&ctx, close, &closed);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("request_id"));
  }
  close.set_request_id("another-request");
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(verifier->CloseSession(&ctx, close, &closed).ok());  // not this one: nothing freed
  }
  EXPECT_EQ(SumMetric(MetricsText(cluster_->verifier()->metrics_port()), "lede_kv_slots_in_use"), 1);
  close.set_request_id("orphan-1");
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(verifier->CloseSession(&ctx, close, &closed).ok());
  }
  EXPECT_EQ(WaitForFreeSlots(), 0) << Logs();
}

// The drafter takes at most speculation::kNgramWindow context tokens: more is
// INVALID_ARGUMENT naming the field and drafts nothing; a LEDE round with a
// context drafts and reports each probe's n-gram signals in its records.
TEST_F(E2eSingleSlotTest, DraftContextIsBoundedAndFeedsTheNgramSignals) {
  auto verifier = lede::v1::Verifier::NewStub(
      grpc::CreateChannel(cluster_->verifier_target(), grpc::InsecureChannelCredentials()));
  auto drafter = lede::v1::Drafter::NewStub(
      grpc::CreateChannel(cluster_->drafter_target(), grpc::InsecureChannelCredentials()));
  lede::v1::OpenSessionRequest open;
  for (int32_t t : {1, 5, 6, 7, 8}) open.add_prompt_token_ids(t);
  lede::v1::OpenSessionResponse opened;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(verifier->OpenSession(&ctx, open, &opened).ok());
  }
  const int32_t pending = opened.first_token();
  lede::v1::DraftRequest req;
  req.set_slot(opened.slot());
  req.set_pool_epoch(opened.pool_epoch());
  req.set_session_id(opened.session_id());
  req.set_pending_token(pending);
  req.set_position(open.prompt_token_ids_size());
  req.set_budget(4);
  req.set_record_trace(true);
  req.set_method(lede::v1::SPECULATION_METHOD_LEDE);
  for (int i = 0; i <= speculation::kNgramWindow; ++i) req.add_context(5);
  lede::v1::DraftResponse resp;
  {
    grpc::ClientContext ctx;
    const grpc::Status s = drafter->Draft(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("context"));
  }
  // A negative load is refused naming the field (0, unset, is 1).
  req.clear_context();
  req.set_load(-2);
  {
    grpc::ClientContext ctx;
    const grpc::Status s = drafter->Draft(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("load"));
  }
  req.set_load(12);  // the policy's state carries the load from here on
  // The shipped policies decide phase 2 on the token just drafted (no
  // lookahead probe): a record at draft_pos p carries the signals of draft
  // p - 1 (greedy: the probe's top-1) after the context and drafts [0, p - 1).
  // Returns how many records had a match.
  auto check_records = [&](const std::vector<int32_t>& context) {
    int n_checked = 0, n_matched = 0;
    for (const lede::v1::DecisionRecord& r : resp.decisions()) {
      if (r.phase() != lede::v1::PHASE_DRAFT_LENGTH) {
        EXPECT_EQ(r.lookup_match() + r.trigram_seen(), 0.0f) << "no probe behind a phase-" << r.phase() << " state";
        continue;
      }
      if (r.draft_pos() < 1 || r.draft_pos() > resp.draft_tokens_size()) {
        ADD_FAILURE() << "draft_pos " << r.draft_pos() << " with " << resp.draft_tokens_size() << " drafts";
        continue;
      }
      std::vector<int32_t> before = context;
      before.insert(before.end(), resp.draft_tokens().begin(), resp.draft_tokens().begin() + r.draft_pos() - 1);
      const speculation::NgramSignals want = speculation::ContextNgram(before.data(), static_cast<int64_t>(before.size()),
                                                           resp.draft_tokens(r.draft_pos() - 1));
      EXPECT_EQ(r.lookup_match(), want.lookup_match) << "draft_pos " << r.draft_pos();
      EXPECT_EQ(r.trigram_seen(), want.trigram_seen) << "draft_pos " << r.draft_pos();
      ++n_checked;
      n_matched += want.lookup_match + want.trigram_seen > 0 ? 1 : 0;
    }
    EXPECT_GT(n_checked, 0) << "the round asked no phase-2 decision";
    return n_matched;
  };
  // The real context (prompt + pending token).
  req.clear_context();
  for (int32_t t : open.prompt_token_ids()) req.add_context(t);
  req.add_context(pending);
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(drafter->Draft(&ctx, req, &resp).ok());
  }
  check_records(std::vector<int32_t>(req.context().begin(), req.context().end()));
  ASSERT_GE(resp.draft_tokens_size(), 1);
  for (const lede::v1::DecisionRecord& r : resp.decisions()) {
    EXPECT_EQ(r.load(), 12);
    EXPECT_EQ(r.temperature(), 0.0f);  // greedy
  }
  // The same round again (nothing was committed; the exit layer is chosen
  // before any probe, so the first draft is the same) with a context in
  // which (9, pending) was once followed by that draft: its record matches.
  const int32_t first_draft = resp.draft_tokens(0);
  const std::vector<int32_t> crafted = {9, pending, first_draft, 3, 9, pending};
  req.clear_context();
  for (int32_t t : crafted) req.add_context(t);
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(drafter->Draft(&ctx, req, &resp).ok());
  }
  ASSERT_GE(resp.draft_tokens_size(), 1);
  EXPECT_EQ(resp.draft_tokens(0), first_draft);
  EXPECT_GT(check_records(crafted), 0) << "the crafted context's lookup and trigram did not reach the records";
  // A sampled round's records carry the request's temperature
  // (ExitState::temperature), read from its sampling settings.
  req.mutable_sampling()->set_temperature(0.8f);
  req.mutable_sampling()->set_top_p(1.0f);
  req.mutable_sampling()->set_seed(5);
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(drafter->Draft(&ctx, req, &resp).ok());
  }
  ASSERT_GT(resp.decisions_size(), 0);
  for (const lede::v1::DecisionRecord& r : resp.decisions()) EXPECT_FLOAT_EQ(r.temperature(), 0.8f);
  lede::v1::CloseSessionRequest close;
  close.set_slot(opened.slot());
  close.set_pool_epoch(opened.pool_epoch());
  close.set_session_id(opened.session_id());
  lede::v1::CloseSessionResponse closed;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(verifier->CloseSession(&ctx, close, &closed).ok());
  }
  EXPECT_EQ(WaitForFreeSlots(), 0) << Logs();
}

// A cancelled request's late calls, and a caller that
// never opened the session, name a slot its next owner now holds. Every
// call on a slot must name the slot's session id: a stale or foreign one is
// FAILED_PRECONDITION and leaves the live session exactly as it was (its
// committed length, its K/V: the next verification still accepts the
// continuation it would have accepted).
TEST_F(E2eSingleSlotTest, StaleAndForeignSessionHandlesTouchNothing) {
  auto verifier = lede::v1::Verifier::NewStub(
      grpc::CreateChannel(cluster_->verifier_target(), grpc::InsecureChannelCredentials()));
  auto drafter = lede::v1::Drafter::NewStub(
      grpc::CreateChannel(cluster_->drafter_target(), grpc::InsecureChannelCredentials()));
  lede::v1::OpenSessionRequest open;
  for (int32_t t : {1, 5, 6, 7, 8}) open.add_prompt_token_ids(t);
  auto open_session = [&] {
    lede::v1::OpenSessionResponse opened;
    grpc::ClientContext ctx;
    EXPECT_TRUE(verifier->OpenSession(&ctx, open, &opened).ok());
    return opened;
  };
  auto close_session = [&](const lede::v1::OpenSessionResponse& o, uint64_t id) {
    lede::v1::CloseSessionRequest close;
    close.set_slot(o.slot());
    close.set_pool_epoch(o.pool_epoch());
    close.set_session_id(id);
    lede::v1::CloseSessionResponse closed;
    grpc::ClientContext ctx;
    return verifier->CloseSession(&ctx, close, &closed);
  };
  auto draft = [&](const lede::v1::OpenSessionResponse& o, uint64_t id, lede::v1::DraftResponse* resp) {
    lede::v1::DraftRequest req;
    req.set_slot(o.slot());
    req.set_pool_epoch(o.pool_epoch());
    req.set_session_id(id);
    req.set_pending_token(o.first_token());
    req.set_position(open.prompt_token_ids_size());
    req.set_budget(3);
    req.set_method(lede::v1::SPECULATION_METHOD_STATIC);
    req.mutable_speculation()->set_exit_layer(1);
    req.mutable_speculation()->set_draft_length(3);
    grpc::ClientContext ctx;
    return drafter->Draft(&ctx, req, resp);
  };
  auto verify = [&](const lede::v1::OpenSessionResponse& o, uint64_t id, const lede::v1::DraftResponse& d,
                    lede::v1::VerifyResponse* resp) {
    lede::v1::VerifyRequest req;
    req.set_slot(o.slot());
    req.set_pool_epoch(o.pool_epoch());
    req.set_session_id(id);
    req.set_pending_token(o.first_token());
    req.set_position(open.prompt_token_ids_size());
    req.set_exit_layer(d.exit_layer());
    *req.mutable_draft_tokens() = d.draft_tokens();
    req.set_ready_layer(d.ready_layer());
    grpc::ClientContext ctx;
    return verifier->Verify(&ctx, req, resp);
  };

  const lede::v1::OpenSessionResponse stale = open_session();
  ASSERT_NE(stale.session_id(), 0u);
  ASSERT_TRUE(close_session(stale, stale.session_id()).ok());
  const lede::v1::OpenSessionResponse live = open_session();
  ASSERT_EQ(live.slot(), stale.slot()) << "one slot: the live session reuses the stale one's";
  ASSERT_NE(live.session_id(), stale.session_id());

  // Stale and foreign (0, and a guess) handles: refused, nothing touched.
  for (uint64_t id : {stale.session_id(), uint64_t{0}, live.session_id() ^ 1}) {
    lede::v1::DraftResponse d;
    grpc::Status s = draft(live, id, &d);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "Draft with id " << id;
    EXPECT_THAT(s.error_message(), HasSubstr("session_id"));
    EXPECT_EQ(d.draft_tokens_size(), 0);
    lede::v1::DraftResponse fake;
    fake.set_exit_layer(1);
    fake.add_draft_tokens(live.first_token());
    lede::v1::VerifyResponse v;
    s = verify(live, id, fake, &v);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "Verify with id " << id;
    EXPECT_THAT(s.error_message(), HasSubstr("session_id"));
    EXPECT_THAT(s.error_message(), Not(HasSubstr("holds 5"))) << "the slot's length leaked: " << s.error_message();
    s = close_session(live, id);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "CloseSession with id " << id;
  }
  EXPECT_EQ(SumMetric(MetricsText(cluster_->verifier()->metrics_port()), "lede_kv_slots_in_use"), 1)
      << "a stale close freed the live session";

  // The live session is intact: its own round drafts and verifies at the
  // prompt's length, and accepts what a fresh session of the same prompt
  // accepts.
  lede::v1::DraftResponse d;
  ASSERT_TRUE(draft(live, live.session_id(), &d).ok());
  lede::v1::VerifyResponse v;
  ASSERT_TRUE(verify(live, live.session_id(), d, &v).ok());
  ASSERT_TRUE(close_session(live, live.session_id()).ok());
  const lede::v1::OpenSessionResponse fresh = open_session();
  lede::v1::DraftResponse d2;
  ASSERT_TRUE(draft(fresh, fresh.session_id(), &d2).ok());
  lede::v1::VerifyResponse v2;
  ASSERT_TRUE(verify(fresh, fresh.session_id(), d2, &v2).ok());
  EXPECT_EQ(std::vector<int32_t>(v.tokens().begin(), v.tokens().end()),
            std::vector<int32_t>(v2.tokens().begin(), v2.tokens().end()));
  ASSERT_TRUE(close_session(fresh, fresh.session_id()).ok());
  EXPECT_EQ(WaitForFreeSlots(), 0) << Logs();
}

// A client cancel after the first delta frees the slot.
TEST_F(E2eSingleSlotTest, ClientCancelFreesTheSlot) {
  auto slow = SlowReaderStub();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto first = slow->Generate(&ctx, LongRequest());
  GenerateResponse resp;
  ASSERT_TRUE(first->Read(&resp));
  ctx.TryCancel();
  while (first->Read(&resp)) {
  }
  EXPECT_EQ(first->Finish().error_code(), grpc::StatusCode::CANCELLED);

  EXPECT_EQ(WaitForFreeSlots(), 0) << "the cancelled request still holds its KV slot" << Logs();
  CallResult next = GenerateUntilOk(*stub_, MakeRequest("Once upon a time", Lede(), 8), 20s);
  EXPECT_TRUE(next.ok()) << next.Describe();
}

// A 50 ms deadline on a long request ends it with DEADLINE_EXCEEDED and
// frees the slot.
TEST_F(E2eSingleSlotTest, DeadlineFreesTheSlot) {
  auto slow = SlowReaderStub();
  CallResult first = Generate(*slow, LongRequest(), 50ms);
  EXPECT_EQ(first.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << first.Describe();

  EXPECT_EQ(WaitForFreeSlots(), 0) << "the expired request still holds its KV slot" << Logs();
  CallResult next = GenerateUntilOk(*stub_, MakeRequest("Once upon a time", Lede(), 8), 20s);
  EXPECT_TRUE(next.ok()) << next.Describe();
}

// A deadline that expires while the verifier prefills a long prompt (the
// coordinator's OpenSession call in flight) frees the slot too. Regression:
// the OpenSession call carried the client's deadline, its response (the slot
// number) was lost, and the slot stayed in use until the idle reclaim.
TEST_F(E2eSingleSlotTest, DeadlineDuringPrefillFreesTheSlot) {
  GenerateRequest r = MakeRequest("", Autoregressive(), 50);
  r.clear_prompt();
  for (int i = 0; i < 450; ++i) r.add_prompt_token_ids(100 + i % 1000);
  for (auto deadline : {2ms, 5ms, 10ms, 20ms, 50ms}) {
    CallResult got = Generate(*stub_, r, deadline);
    EXPECT_FALSE(got.ok());
    ASSERT_EQ(WaitForFreeSlots(10s), 0) << "a request with a " << deadline.count()
                                     << " ms deadline still holds its KV slot" << Logs();
  }
  CallResult next = GenerateUntilOk(*stub_, MakeRequest("Once upon a time", Lede(), 8), 20s);
  EXPECT_TRUE(next.ok()) << next.Describe();
}

// ------------------------------------------------------------- admission

// A storm of sampled streams cancelled right after their
// first token (their sessions' cleanup racing the reuse of their KV slots)
// beside greedy clients: every greedy request succeeds and equals its solo
// run. Before session ids, a cancelled request's late Verify or Close could
// land on the slot's next session (failed requests, "slot named twice in one
// batch", and a changed greedy output).
class E2eCancelStormTest : public OneClusterTest<4> {};

TEST_F(E2eCancelStormTest, CancelStormNeverTouchesOtherSessions) {
  constexpr int kVictims = 4, kRounds = 3, kStormThreads = 8, kCancelsPerThread = 12;
  std::vector<std::string> prompts = ReadPrompts(ModelDir() + "/prompts/story.jsonl", 2);
  for (const std::string& c : ReadPrompts(ModelDir() + "/prompts/code.jsonl", 2)) prompts.push_back(c);
  const std::vector<Method> methods = {Lede(), Static33(), Lede(), Autoregressive()};
  std::vector<GenerateRequest> greedy;
  std::vector<CallResult> solo;
  for (int v = 0; v < kVictims; ++v) {
    greedy.push_back(MakeRequest(prompts[v % prompts.size()], methods[v], 24));
    solo.push_back(Generate(*stub_, greedy.back(), 60s));
    ASSERT_TRUE(solo.back().ok()) << solo.back().Describe();
  }
  std::atomic<bool> storming{true};
  std::atomic<int> cancelled{0};
  std::vector<std::thread> storm;
  for (int t = 0; t < kStormThreads; ++t) {
    storm.emplace_back([&, t] {
      auto stub = cluster_->NewStub();
      for (int i = 0; i < kCancelsPerThread && storming.load(); ++i) {
        GenerateRequest r = MakeRequest(prompts[(t + i) % prompts.size()], i % 2 ? Lede() : Static33(), 128,
                                        Sampling{1.0f, 1.0f, static_cast<uint64_t>(1000 * t + i)});
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 60s);
        auto reader = stub->Generate(&ctx, r);
        GenerateResponse resp;
        if (reader->Read(&resp)) ++cancelled;
        ctx.TryCancel();
        while (reader->Read(&resp)) {
        }
        (void)reader->Finish();
      }
    });
  }
  std::vector<std::vector<CallResult>> results(kVictims);
  std::vector<std::thread> victims;
  for (int v = 0; v < kVictims; ++v) {
    victims.emplace_back([&, v] {
      auto stub = cluster_->NewStub();
      for (int round = 0; round < kRounds; ++round) results[v].push_back(Generate(*stub, greedy[v], 120s));
    });
  }
  for (std::thread& t : victims) t.join();
  storming = false;
  for (std::thread& t : storm) t.join();
  EXPECT_GT(cancelled.load(), kStormThreads) << "the storm cancelled almost nothing";
  const std::string logs = "\ncoordinator log:\n" + ChildProcess::Tail(cluster_->coordinator()->Log(), 1500) +
                           "\nverifier log:\n" + ChildProcess::Tail(cluster_->verifier()->Log(), 1500);
  for (int v = 0; v < kVictims; ++v) {
    for (int round = 0; round < kRounds; ++round) {
      const CallResult& r = results[v][round];
      ASSERT_TRUE(r.ok()) << "greedy client " << v << " round " << round << ": " << r.Describe() << logs;
      EXPECT_EQ(r.ids, solo[v].ids) << "greedy client " << v << " (" << methods[v].name << ") round " << round
                                    << " differs from its solo run";
    }
  }
}

// More concurrent requests than KV slots: the ones that find the pool full
// wait in the verifier's queue; all complete, none is refused, and each
// gives the tokens of its solo run (methods mixed in one load).
class E2eQueueTest : public OneClusterTest<16> {};

TEST_F(E2eQueueTest, MoreRequestsThanSlotsAllCompleteWithSoloTokens) {
  constexpr int kRequests = 24;
  std::vector<std::string> prompts = ReadPrompts(ModelDir() + "/prompts/story.jsonl", 4);
  for (const std::string& c : ReadPrompts(ModelDir() + "/prompts/code.jsonl", 2)) prompts.push_back(c);
  const std::vector<Method> methods = {Lede(), Static33(), Autoregressive()};
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(MakeRequest(prompts[i % prompts.size()], methods[i % methods.size()], 12));
  }
  std::vector<CallResult> solo(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    solo[i] = Generate(*stub_, requests[i], 60s);
    ASSERT_TRUE(solo[i].ok()) << solo[i].Describe();
  }
  const std::vector<CallResult> loaded = GenerateConcurrently(*cluster_, requests);
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(loaded[i].ok()) << "request " << i << ": " << loaded[i].Describe();
    EXPECT_EQ(loaded[i].ids, solo[i].ids) << "request " << i << " (" << methods[i % methods.size()].name << ")";
  }
  EXPECT_TRUE(lede::testing::WaitUntil(
      [&] { return SumMetric(MetricsText(cluster_->verifier()->metrics_port()), "lede_kv_slots_in_use") == 0; },
      20s, 50ms));
}

// ------------------------------------------------------------- batching

// A split cluster with continuous batching at --max-batch 8 (8 KV slots) and
// the in-process engine as the solo reference.
class E2eBatchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto ref = Reference::Load();
    if (!ref.ok()) {
      *setup_error_ = ref.status().ToString();
      return;
    }
    reference_ = ref->release();
    ClusterOptions o = BaseOptions();
    o.slots = 8;
    o.experience_url = "none";
    o.model_args = {"--max-batch", "8", "--prefill-chunk", "16"};
    cluster_ = new LedeCluster(o);
    if (Status s = cluster_->Start(); !s.ok()) *setup_error_ = s.ToString();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete reference_;
    reference_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(setup_error_->empty()) << *setup_error_; }

  static inline LedeCluster* cluster_ = nullptr;
  static inline Reference* reference_ = nullptr;
  static inline std::string* setup_error_ = new std::string();
};

// Concurrent requests of every method (greedy and seeded sampling, prompts
// of different lengths, long ones prefilled in chunks beside running
// sessions) batched at --max-batch 8 each stream exactly the tokens of their
// solo run on the in-process engine; the verifier counted its batched steps,
// the drafter its draft steps, which went through its batch scheduler (how
// many sessions share a pass depends on timing, so it is not asserted here;
// DraftBatchTest holds batched drafting to solo drafting bitwise).
TEST_F(E2eBatchTest, ConcurrentRequestsMatchTheirSoloRuns) {
  std::vector<std::string> prompts = ReadPrompts(ModelDir() + "/prompts/story.jsonl", 4);
  for (const std::string& c : ReadPrompts(ModelDir() + "/prompts/code.jsonl", 2)) prompts.push_back(c);
  const std::vector<Method> methods = {Lede(), Static33(), Threshold05(), Autoregressive()};
  const std::vector<Sampling> samplings = {Sampling{}, Sampling{0.8f, 0.95f, 7}};
  constexpr int kRequests = 16;
  std::vector<GenerateRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < kRequests; ++i) {
    const Method& m = methods[i % methods.size()];
    const Sampling& s = samplings[(i / methods.size()) % samplings.size()];
    const std::string& prompt = prompts[i % prompts.size()];
    auto solo = reference_->Generate(prompt, m, 40, s);
    ASSERT_THAT(solo, IsOk()) << m.name;
    expected.push_back(solo->tokens);
    requests.push_back(MakeRequest(prompt, m, 40, s));
  }
  const double steps_before =
      SumMetric(MetricsText(cluster_->verifier()->metrics_port()), "lede_iteration_batch_size_count");
  const std::string drafter_before = MetricsText(cluster_->drafter()->metrics_port());
  const double draft_steps_before = SumMetric(drafter_before, "lede_draft_batch_size_count");
  const std::vector<CallResult> got = GenerateConcurrently(*cluster_, requests);
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(got[i].ok()) << "request " << i << ": " << got[i].Describe();
    EXPECT_EQ(got[i].ids, expected[i]) << "request " << i << " (" << methods[i % methods.size()].name << ")";
  }
  const std::string text = MetricsText(cluster_->verifier()->metrics_port());
  const double steps = SumMetric(text, "lede_iteration_batch_size_count") - steps_before;
  EXPECT_GT(steps, 0);
  // Every step holds at least one session: the sum of sizes is at least the count.
  EXPECT_GE(SumMetric(text, "lede_iteration_batch_size_sum"), SumMetric(text, "lede_iteration_batch_size_count"));
  const std::string drafter = MetricsText(cluster_->drafter()->metrics_port());
  EXPECT_GT(SumMetric(drafter, "lede_draft_batch_size_count") - draft_steps_before, 0);
  EXPECT_GE(SumMetric(drafter, "lede_draft_batch_size_sum"), SumMetric(drafter, "lede_draft_batch_size_count"));
  EXPECT_TRUE(lede::testing::WaitUntil(
      [&] { return SumMetric(MetricsText(cluster_->verifier()->metrics_port()), "lede_kv_slots_in_use") == 0; },
      20s, 50ms));
}

// A request alone on the verifier is prefilled in one step, not in
// --prefill-chunk (16) pieces: exactly one step of more than 16 rows, and
// its output is its solo run's.
TEST_F(E2eBatchTest, APromptAloneIsPrefilledInOneStep) {
  const std::string prompt = ReadPrompts(ModelDir() + "/prompts/code.jsonl", 1)[0];
  ASSERT_GT(reference_->Encode(prompt).size(), 32u) << "the test needs a prompt of several chunks";
  ASSERT_TRUE(lede::testing::WaitUntil(
      [&] { return SumMetric(MetricsText(cluster_->verifier()->metrics_port()), "lede_kv_slots_in_use") == 0; },
      20s, 50ms));
  auto wide_steps = [&] {  // steps of more than 16 rows
    const int port = cluster_->verifier()->metrics_port();
    return telemetry::test_util::MetricValue(port, "lede_iteration_tokens_count") -
           telemetry::test_util::MetricValue(port, "lede_iteration_tokens_bucket{le=\"16\"}");
  };
  const double before = wide_steps();
  ASSERT_FALSE(std::isnan(before));
  auto solo = reference_->Generate(prompt, Autoregressive(), 8, Sampling{});
  ASSERT_THAT(solo, IsOk());
  const std::vector<CallResult> got = GenerateConcurrently(*cluster_, {MakeRequest(prompt, Autoregressive(), 8)});
  ASSERT_TRUE(got[0].ok()) << got[0].Describe();
  EXPECT_EQ(got[0].ids, solo->tokens);
  EXPECT_EQ(wide_steps() - before, 1.0);
}

// ------------------------------------------------------------------ faults

// Kills and restarts model processes (the tests run in order and leave the
// cluster serving).
class E2eFaultTest : public OneClusterTest<2> {};

// With the drafter SIGKILLed a LEDE request fails fast with UNAVAILABLE; a
// coordinator with --autoregressive-fallback serves it with the
// autoregressive tokens; a restarted drafter serves LEDE again.
TEST_F(E2eFaultTest, KilledDrafterIsUnavailableFallsBackAndRecovers) {
  const std::string prompt = "Once upon a time, there was a little";
  CallResult ar = Generate(*stub_, MakeRequest(prompt, Autoregressive()));
  ASSERT_TRUE(ar.ok()) << ar.Describe();
  CallResult lede_before = Generate(*stub_, MakeRequest(prompt, Lede()));
  ASSERT_TRUE(lede_before.ok()) << lede_before.Describe();

  cluster_->drafter()->Kill();
  CallResult down = Generate(*stub_, MakeRequest(prompt, Lede()), 30s);
  EXPECT_EQ(down.status.error_code(), grpc::StatusCode::UNAVAILABLE) << down.Describe();

  auto fallback = cluster_->StartExtraCoordinator(/*autoregressive_fallback=*/true, "none");
  ASSERT_THAT(fallback, IsOk());
  auto fallback_stub = LedeCluster::NewStub((*fallback)->grpc_target());
  CallResult degraded = Generate(*fallback_stub, MakeRequest(prompt, Lede()), 30s);
  ASSERT_TRUE(degraded.ok()) << degraded.Describe() << "\n" << ChildProcess::Tail((*fallback)->Log());
  EXPECT_EQ(degraded.ids, ar.ids);
  EXPECT_EQ(degraded.summary->drafted_tokens(), 0);
  fallback->reset();

  ASSERT_THAT(cluster_->StartDrafter(), IsOk());  // same port, same pool
  CallResult again = GenerateUntilOk(*stub_, MakeRequest(prompt, Lede()));
  ASSERT_TRUE(again.ok()) << again.Describe();
  EXPECT_EQ(again.ids, lede_before.ids);
  EXPECT_GT(again.summary->drafted_tokens(), 0);
}

// A SIGKILLed verifier restarted on the same pool name makes a new pool
// epoch; the drafter re-attaches and requests succeed again; nothing hangs.
TEST_F(E2eFaultTest, RestartedVerifierMakesNewEpochAndDrafterReattaches) {
  const std::string prompt = "One day, a little girl named Lily";
  CallResult before = Generate(*stub_, MakeRequest(prompt, Lede()));
  ASSERT_TRUE(before.ok()) << before.Describe();

  auto verifier_stub = lede::v1::Verifier::NewStub(
      grpc::CreateChannel(cluster_->verifier_target(), grpc::InsecureChannelCredentials()));
  auto epoch = [&]() -> uint64_t {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    lede::v1::ModelInfo info;
    return verifier_stub->Describe(&ctx, lede::v1::DescribeRequest(), &info).ok() ? info.pool_epoch() : 0;
  };
  const uint64_t old_epoch = epoch();
  ASSERT_NE(old_epoch, 0u);

  cluster_->verifier()->Kill();
  CallResult down = Generate(*stub_, MakeRequest(prompt, Lede()), 30s);
  EXPECT_EQ(down.status.error_code(), grpc::StatusCode::UNAVAILABLE) << down.Describe();

  ASSERT_THAT(cluster_->StartVerifier(), IsOk());  // same port, same pool name
  CallResult again = GenerateUntilOk(*stub_, MakeRequest(prompt, Lede()));
  ASSERT_TRUE(again.ok()) << again.Describe() << "\ncoordinator log:\n"
                          << ChildProcess::Tail(cluster_->coordinator()->Log());
  EXPECT_EQ(again.ids, before.ids);
  EXPECT_GT(again.summary->drafted_tokens(), 0);
  const uint64_t new_epoch = epoch();
  EXPECT_NE(new_epoch, 0u);
  EXPECT_NE(new_epoch, old_epoch);
  // The drafter re-attached to the new pool.
  EXPECT_THAT(cluster_->drafter()->WaitForLog("event=\"?kv_pool_attached\"? epoch=\"?" +
                                                  std::to_string(new_epoch),
                                              5s),
              IsOk());
  CallResult ar = Generate(*stub_, MakeRequest(prompt, Autoregressive()), 30s);
  EXPECT_TRUE(ar.ok()) << ar.Describe();
}

}  // namespace
}  // namespace lede
