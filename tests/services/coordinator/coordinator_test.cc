// Unit tests of the coordinator (services/coordinator/coordinator.h) run
// in-process: GenerationService::GenerateInProcess against a scripted
// verifier (a lede.v1.Verifier service on 127.0.0.1:0 in this process that
// answers autoregressive steps from a token script), so request
// validation, prompt resolution and stop-string filtering are checked
// without starting any model process.
#include "services/coordinator/coordinator.h"
#include "services/coordinator/remote_backend.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/server_context.h>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/lede/v1/model.grpc.pb.h"
#include "shared/rpc/server.h"
#include "shared/telemetry/metrics.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/shared/telemetry/telemetry_test_util.h"
#include "tests/testing/status_matchers.h"

namespace lede::coordinator {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int32_t kEos = 2;

// A verifier whose OpenSession answers script[0] and each Verify (an
// autoregressive step: no drafts) the next script token; records the
// prompt it was given and the sessions closed.
class ScriptedVerifier final : public lede::v1::Verifier::Service {
 public:
  explicit ScriptedVerifier(int32_t vocab_size) : vocab_size_(vocab_size) {}

  grpc::Status Describe(grpc::ServerContext*, const lede::v1::DescribeRequest*,
                        lede::v1::ModelInfo* info) override {
    info->set_n_layers(4);
    info->set_vocab_size(vocab_size_);
    info->set_capacity(256);
    info->set_n_slots(1);
    info->set_max_draft_length(4);
    info->add_eos_ids(kEos);
    info->set_bos_id(1);
    return grpc::Status::OK;
  }
  grpc::Status OpenSession(grpc::ServerContext*, const lede::v1::OpenSessionRequest* request,
                           lede::v1::OpenSessionResponse* response) override {
    opens_.fetch_add(1);
    std::lock_guard<std::mutex> lock(mu_);
    prompt_.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
    next_ = 0;
    response->set_slot(0);
    response->set_first_token(Next());
    return grpc::Status::OK;
  }
  grpc::Status Verify(grpc::ServerContext*, const lede::v1::VerifyRequest* request,
                      lede::v1::VerifyResponse* response) override {
    if (request->draft_tokens_size() != 0) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "scripted: steps only");
    }
    std::lock_guard<std::mutex> lock(mu_);
    response->add_tokens(Next());
    return grpc::Status::OK;
  }
  grpc::Status CloseSession(grpc::ServerContext*, const lede::v1::CloseSessionRequest*,
                            lede::v1::CloseSessionResponse*) override {
    closes_.fetch_add(1);
    return grpc::Status::OK;
  }

  void set_script(std::vector<int32_t> script) {
    std::lock_guard<std::mutex> lock(mu_);
    script_ = std::move(script);
  }
  std::vector<int32_t> prompt() {
    std::lock_guard<std::mutex> lock(mu_);
    return prompt_;
  }
  int n_opens() const { return opens_.load(); }
  int n_closes() const { return closes_.load(); }

 private:
  int32_t Next() {  // EOS once the script is out
    return next_ < script_.size() ? script_[next_++] : kEos;
  }

  const int32_t vocab_size_;
  std::mutex mu_;
  std::vector<int32_t> script_;
  size_t next_ = 0;
  std::vector<int32_t> prompt_;
  std::atomic<int> opens_{0};
  std::atomic<int> closes_{0};
};

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto path = tokenizer::FindTokenizerFile(std::string(LEDE_SOURCE_DIR) + "/models/lede-tiny");
    ASSERT_THAT(path, IsOk());
    tokenizer_path_ = *path;
    auto tok = tokenizer::LoadTokenizer(tokenizer_path_);
    ASSERT_THAT(tok, IsOk());
    tokenizer_ = std::move(*tok);
    verifier_ = std::make_unique<ScriptedVerifier>(tokenizer_->vocab_size());
    runner_ = std::make_unique<rpc::ServerRunner>("coordinator-test");
    runner_->AddService(verifier_.get());
    rpc::ServerOptions so;
    so.metrics_address = "";
    so.shutdown_grace = absl::Milliseconds(100);
    ASSERT_THAT(runner_->Start(so, nullptr), IsOk());

    ASSERT_NO_FATAL_FAILURE(StartService([](CoordinatorOptions&) {}));
  }
  // (Re)creates the coordinator under test with options edited by `edit`.
  void StartService(const std::function<void(CoordinatorOptions&)>& edit) {
    service_.reset();
    CoordinatorOptions o;
    o.tokenizer_path = tokenizer_path_;
    o.verifier_target = "127.0.0.1:" + std::to_string(runner_->port());
    // No drafter: autoregressive requests never call it.
    o.drafter_target = "127.0.0.1:" + std::to_string(telemetry::test_util::FreePort());
    o.rpc_timeout = absl::Seconds(5);
    o.max_new_tokens_limit = 64;
    edit(o);
    auto service = GenerationService::Create(o, &registry_);
    ASSERT_THAT(service, IsOk());
    service_ = std::move(*service);
  }
  void TearDown() override {
    service_.reset();
    if (runner_) runner_->Shutdown();
  }

  static lede::v1::GenerateRequest Request(const std::string& prompt, int32_t max_new_tokens) {
    lede::v1::GenerateRequest r;
    r.set_prompt(prompt);
    r.set_max_new_tokens(max_new_tokens);
    r.set_method(lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE);
    return r;
  }

  // Runs `request`; the text and ids of every delta, and the summary.
  struct Outcome {
    Status status;
    std::string text;
    std::vector<int32_t> ids;
    int n_summaries = 0;
    lede::v1::GenerationSummary summary;
  };
  Outcome Run(const lede::v1::GenerateRequest& request) {
    Outcome out;
    out.status = service_->GenerateInProcess(request, [&out](const lede::v1::GenerateResponse& r) {
      if (r.has_delta()) {
        out.text += r.delta().text();
        out.ids.insert(out.ids.end(), r.delta().token_ids().begin(), r.delta().token_ids().end());
      } else if (r.has_summary()) {
        ++out.n_summaries;
        out.summary = r.summary();
      }
      return true;
    });
    return out;
  }

  // The ids of `text` without BOS (SentencePiece adds the word-start space
  // itself): what the scripted verifier will emit.
  std::vector<int32_t> Ids(const std::string& text) {
    auto ids = tokenizer_->Encode(text, /*add_bos=*/false, /*add_eos=*/false);
    EXPECT_THAT(ids, IsOk());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  std::string tokenizer_path_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<ScriptedVerifier> verifier_;
  std::unique_ptr<rpc::ServerRunner> runner_;
  telemetry::Registry registry_;
  std::unique_ptr<GenerationService> service_;
};

// A text prompt is tokenized with BOS; prompt_token_ids are used as given.
// Over several replicas, a replica that is down is skipped: every request
// opens on the live one, whichever the placement tried first (equal
// replicas take turns at the front).
TEST_F(CoordinatorTest, DeadReplicaIsSkipped) {
  CoordinatorOptions o;
  o.tokenizer_path = tokenizer_path_;
  const std::string dead = "127.0.0.1:" + std::to_string(telemetry::test_util::FreePort());
  const std::string live = "127.0.0.1:" + std::to_string(runner_->port());
  o.replicas = {ReplicaTarget{dead, dead}, ReplicaTarget{live, dead}};
  o.rpc_timeout = absl::Seconds(5);
  o.max_new_tokens_limit = 64;
  telemetry::Registry registry;
  auto service = GenerationService::Create(o, &registry);
  ASSERT_THAT(service, IsOk());
  service_ = std::move(*service);
  verifier_->set_script(Ids(" a cat"));
  for (int i = 0; i < 4; ++i) {
    Outcome out = Run(Request("x", 8));
    ASSERT_THAT(out.status, IsOk()) << i;
    EXPECT_EQ(out.ids, Ids(" a cat"));
  }
  EXPECT_EQ(verifier_->n_opens(), 4);
  EXPECT_EQ(verifier_->n_closes(), 4);
}

TEST_F(CoordinatorTest, ResolvesTextAndTokenPrompts) {
  verifier_->set_script(Ids("once"));
  Outcome text = Run(Request("Lily went", 4));
  ASSERT_THAT(text.status, IsOk());
  auto expected = tokenizer_->Encode("Lily went", /*add_bos=*/true, /*add_eos=*/false);
  ASSERT_THAT(expected, IsOk());
  EXPECT_EQ(verifier_->prompt(), *expected);
  EXPECT_EQ(text.summary.prompt_tokens(), static_cast<int64_t>(expected->size()));

  lede::v1::GenerateRequest ids = Request("", 4);
  for (int32_t id : {1, 5, 6, 7}) ids.add_prompt_token_ids(id);
  ASSERT_THAT(Run(ids).status, IsOk());
  EXPECT_EQ(verifier_->prompt(), std::vector<int32_t>({1, 5, 6, 7}));
}

// The generation streams the script's text, ends at EOS (not emitted) and
// closes the session; the summary accounts for every token.
TEST_F(CoordinatorTest, StreamsUntilEos) {
  const std::vector<int32_t> story = Ids("there was a cat");
  verifier_->set_script(story);
  Outcome out = Run(Request("Once upon a time,", 32));
  ASSERT_THAT(out.status, IsOk());
  EXPECT_EQ(out.text, " there was a cat");
  EXPECT_THAT(out.ids, ElementsAreArray(story));
  EXPECT_EQ(out.n_summaries, 1);
  EXPECT_EQ(out.summary.finish_reason(), lede::v1::FINISH_REASON_EOS);
  EXPECT_EQ(out.summary.generated_tokens(), static_cast<int64_t>(story.size()));
  EXPECT_EQ(out.summary.drafted_tokens(), 0);
  EXPECT_EQ(verifier_->n_closes(), 1);
}

// A stop string ends the generation with FINISH_REASON_STOP, and neither it
// nor anything after it reaches the client, even when it spans tokens.
TEST_F(CoordinatorTest, StopStringIsCutFromTheOutput) {
  verifier_->set_script(Ids("there was a big cat and a dog"));
  lede::v1::GenerateRequest r = Request("Once upon a time,", 32);
  r.add_stop("big cat");
  r.add_stop("zebra");
  Outcome out = Run(r);
  ASSERT_THAT(out.status, IsOk());
  EXPECT_EQ(out.text, " there was a ");
  EXPECT_EQ(out.summary.finish_reason(), lede::v1::FINISH_REASON_STOP);
  EXPECT_EQ(verifier_->n_closes(), 1);
}

// Text held back as a possible stop-string start is released when it turns
// out not to be one, and at the end of the generation.
TEST_F(CoordinatorTest, HeldBackTextIsReleased) {
  verifier_->set_script(Ids("a big dog ran"));
  lede::v1::GenerateRequest r = Request("Once upon a time,", 32);
  r.add_stop("big cat");
  Outcome out = Run(r);
  ASSERT_THAT(out.status, IsOk());
  EXPECT_EQ(out.text, " a big dog ran");
  EXPECT_EQ(out.summary.finish_reason(), lede::v1::FINISH_REASON_EOS);
}

// Invalid requests are INVALID_ARGUMENT naming the GenerateRequest field,
// and no response is sent.
TEST_F(CoordinatorTest, InvalidRequestsNameTheField) {
  struct Case {
    std::string field;
    lede::v1::GenerateRequest request;
  };
  std::vector<Case> cases;
  cases.push_back({"max_new_tokens", Request("hi", 0)});
  cases.push_back({"max_new_tokens", Request("hi", 65)});  // over the limit
  lede::v1::GenerateRequest both = Request("hi", 4);
  both.add_prompt_token_ids(1);
  cases.push_back({"prompt", both});
  cases.push_back({"prompt", Request("", 4)});
  lede::v1::GenerateRequest bad_id = Request("", 4);
  bad_id.add_prompt_token_ids(1);
  bad_id.add_prompt_token_ids(tokenizer_->vocab_size());
  cases.push_back({"prompt_token_ids[1]", bad_id});
  lede::v1::GenerateRequest hot = Request("hi", 4);
  hot.set_temperature(-1);
  cases.push_back({"temperature", hot});
  lede::v1::GenerateRequest stop = Request("hi", 4);
  stop.add_stop("");
  cases.push_back({"stop[0]", stop});
  lede::v1::GenerateRequest layer = Request("hi", 4);
  layer.set_method(lede::v1::SPECULATION_METHOD_STATIC);
  layer.mutable_speculation()->set_exit_layer(9);
  layer.mutable_speculation()->set_draft_length(2);
  cases.push_back({"speculation.exit_layer", layer});
  lede::v1::GenerateRequest length = Request("hi", 4);
  length.set_method(lede::v1::SPECULATION_METHOD_STATIC);
  length.mutable_speculation()->set_exit_layer(2);
  length.mutable_speculation()->set_draft_length(5);
  cases.push_back({"speculation.draft_length", length});
  lede::v1::GenerateRequest threshold = Request("hi", 4);
  threshold.set_method(lede::v1::SPECULATION_METHOD_THRESHOLD);
  threshold.mutable_speculation()->set_threshold(1.5f);
  cases.push_back({"speculation.threshold", threshold});
  for (const Case& c : cases) {
    Outcome out = Run(c.request);
    EXPECT_THAT(out.status, StatusIs(StatusCode::kInvalidArgument)) << c.field;
    EXPECT_THAT(std::string(out.status.message()), StartsWith(c.field + ":")) << out.status;
    EXPECT_EQ(out.n_summaries, 0) << c.field;
    EXPECT_TRUE(out.text.empty()) << c.field;
  }
  EXPECT_EQ(verifier_->n_opens(), 0);  // nothing reached a session
}

// Above speculation_max_load a speculative request decodes autoregressively,
// round by round: with one request in flight (held in its sink) and the limit
// at 1, a static request sees a load of 2 and never calls the drafter (there
// is none here: a speculation round would fail UNAVAILABLE), and each of its
// steps counts in lede_spec_decode_load_disabled_rounds_total. Alone (load
// 1), the same request speculates, so it reaches the missing drafter.
TEST_F(CoordinatorTest, AboveTheSpeculationMaxLoadRoundsAreAutoregressive) {
  ASSERT_NO_FATAL_FAILURE(StartService([](CoordinatorOptions& o) { o.speculation_max_load = 1; }));
  verifier_->set_script(Ids("a b c d e f g h i j k l"));
  lede::v1::GenerateRequest held = Request("held", 4);
  lede::v1::GenerateRequest spec = Request("static", 5);
  spec.set_method(lede::v1::SPECULATION_METHOD_STATIC);
  spec.mutable_speculation()->set_exit_layer(2);
  spec.mutable_speculation()->set_draft_length(2);

  absl::Notification held_streaming, release;
  std::thread holder([&] {
    bool first = true;
    EXPECT_THAT(service_->GenerateInProcess(held, [&](const lede::v1::GenerateResponse& r) {
      if (r.has_delta() && first) {
        first = false;
        held_streaming.Notify();
        release.WaitForNotification();
      }
      return true;
    }), IsOk());
  });
  held_streaming.WaitForNotification();
  Outcome under_load = Run(spec);
  release.Notify();
  holder.join();
  ASSERT_THAT(under_load.status, IsOk());
  EXPECT_EQ(under_load.summary.drafted_tokens(), 0);
  EXPECT_EQ(under_load.summary.generated_tokens(), 5);
  const std::string metrics = telemetry::SerializeText(registry_);
  // The prefill emits the first token and 4 steps the rest; the last of them had no budget
  // left to draft (one token to go), so 3 were steps for the load's sake.
  EXPECT_THAT(metrics, HasSubstr("\nlede_spec_decode_load_disabled_rounds_total 3\n"));

  Outcome alone = Run(spec);  // load 1: speculates, and there is no drafter
  EXPECT_THAT(alone.status, StatusIs(StatusCode::kUnavailable));
}

// Create() refuses options it cannot serve, naming the option.
// With an experience store, Create opens the experience log and the request
// log beside it: a greedy request lands in a request-log shard under
// request_log_prefix once flushed; a store URL that cannot be opened is
// refused naming experience_url.
TEST_F(CoordinatorTest, ExperienceStoreGetsTheRequestLog) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("coordinator_test_experience_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_NO_FATAL_FAILURE(StartService([&](CoordinatorOptions& o) {
    o.experience_url = "file://" + dir.string();
    o.request_log_prefix = "reqlog";
  }));
  verifier_->set_script(Ids("there was a cat"));
  const Outcome out = Run(Request("Once upon a time,", 32));
  ASSERT_THAT(out.status, IsOk());
  ASSERT_THAT(service_->FlushExperience(), IsOk());
  int n_shards = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir / "reqlog")) {
    if (e.path().extension() == ".lreq") ++n_shards;
  }
  EXPECT_EQ(n_shards, 1);
  service_.reset();
  std::filesystem::remove_all(dir);

  CoordinatorOptions o;
  o.tokenizer_path = tokenizer_path_;
  o.verifier_target = "127.0.0.1:" + std::to_string(runner_->port());
  o.experience_url = "nosuchscheme://bucket";
  telemetry::Registry registry;
  auto bad = GenerationService::Create(o, &registry);
  EXPECT_THAT(bad.status(), StatusIs(StatusCode::kInvalidArgument, HasSubstr("experience_url")));
}

TEST(CoordinatorOptionsTest, CreateNamesTheBadOption) {
  telemetry::Registry registry;
  CoordinatorOptions o;
  EXPECT_THAT(GenerationService::Create(o, &registry).status(), StatusIs(StatusCode::kInvalidArgument));
  o.tokenizer_path = "/nonexistent/tokenizer.model";
  EXPECT_THAT(GenerationService::Create(o, &registry).status(), StatusIs(StatusCode::kNotFound));
  auto path = tokenizer::FindTokenizerFile(std::string(LEDE_SOURCE_DIR) + "/models/lede-tiny");
  ASSERT_THAT(path, IsOk());
  o.tokenizer_path = *path;
  o.reward = "speed";
  auto bad_reward = GenerationService::Create(o, &registry);
  EXPECT_THAT(bad_reward.status(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(bad_reward.status().message()), HasSubstr("reward"));
  o.reward = "throughput";
  o.max_new_tokens_limit = 0;
  EXPECT_THAT(GenerationService::Create(o, &registry).status(), StatusIs(StatusCode::kInvalidArgument));
  o.max_new_tokens_limit = 64;
  o.speculation_max_load = -1;
  auto bad_load = GenerationService::Create(o, &registry);
  EXPECT_THAT(bad_load.status(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(bad_load.status().message()), HasSubstr("speculation_max_load"));
}

// What a client sees when a model process died or restarted (the chaos
// test's contract: OK or UNAVAILABLE): a session whose pool epoch or slot
// is gone (FAILED_PRECONDITION from the verifier or drafter) is UNAVAILABLE
// like a process that is down, naming the call; a bad request keeps its code.
TEST(FromModelCallTest, LostSessionsAreUnavailableOthersKeepTheirCode) {
  const Status gone = FromModelCall(
      grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "pool_epoch: session of KV pool epoch 7 is gone"),
      "verifier Verify");
  EXPECT_THAT(gone, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(std::string(gone.message()), HasSubstr("verifier Verify"));
  EXPECT_THAT(FromModelCall(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "slot: 3 has no open session"),
                            "verifier Verify"),
              StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(FromModelCall(grpc::Status(grpc::StatusCode::UNAVAILABLE, "Connection refused"), "drafter Draft"),
              StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(FromModelCall(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "prompt: too long"), "OpenSession"),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(FromModelCall(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "every slot busy"), "OpenSession"),
              StatusIs(StatusCode::kResourceExhausted));
}

}  // namespace
}  // namespace lede::coordinator
