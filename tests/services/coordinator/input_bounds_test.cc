// Bounded work per request: a 20 MiB prompt took the
// coordinator 17.6 s and 5 GB because it was accepted (64 MiB message
// limit) and tokenized whole before the context check. These tests send it
// to the public gRPC API and to the OpenAI HTTP API of an in-process
// coordinator (a scripted verifier of capacity 256 on loopback, no model
// process) and check that it is rejected with the right code naming the
// field, that no prompt byte reached the tokenizer
// (lede_prompt_tokenized_bytes_total), that no session was opened, and that
// the process's peak RSS grows by far less than the old gigabytes.
#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <httplib.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/lede/v1/generation.grpc.pb.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/openai_server.h"
#include "services/coordinator/request_validation.h"
#include "shared/checkpoint/gguf.h"
#include "shared/rpc/server.h"
#include "shared/telemetry/metrics.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/services/coordinator/eos_verifier.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::coordinator {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using nlohmann::json;
using test_util::EosVerifier;
using test_util::kCapacity;

constexpr size_t kHugePromptBytes = 20u << 20;  // the 20 MiB prompt
// The old code peaked at 5 GB for it; the client's own copies of the
// request (the string, its serialization, the transport's buffers) are a
// few times 20 MiB. Anything the server buffered or tokenized would show.
constexpr int64_t kMaxPeakGrowthBytes = 192 << 20;

std::string TokenizerPath() {
  auto path = tokenizer::FindTokenizerFile(std::string(LEDE_SOURCE_DIR) + "/models/lede-tiny");
  EXPECT_THAT(path, IsOk());
  return path.ok() ? *path : "";
}

// The counter the coordinator adds every prompt byte it tokenizes to.
double TokenizedBytes(const telemetry::Registry& registry) {
  const std::string text = telemetry::SerializeText(registry);
  const std::string name = "lede_prompt_tokenized_bytes_total ";
  const size_t at = text.find("\n" + name);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + 1 + name.size()));
}

class InputBoundsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = tokenizer::LoadTokenizer(TokenizerPath());
    ASSERT_THAT(tok, IsOk());
    tokenizer_ = std::move(*tok);
    verifier_ = std::make_unique<EosVerifier>(tokenizer_->vocab_size());
    model_ = std::make_unique<rpc::ServerRunner>("test-verifier");
    model_->AddService(verifier_.get());
    rpc::ServerOptions mo;
    mo.metrics_address = "";
    mo.shutdown_grace = absl::Milliseconds(100);
    ASSERT_THAT(model_->Start(mo, nullptr), IsOk());

    CoordinatorOptions o;
    o.tokenizer_path = TokenizerPath();
    o.verifier_target = o.drafter_target = "127.0.0.1:" + std::to_string(model_->port());
    o.rpc_timeout = absl::Seconds(5);
    o.max_queue_wait = absl::Seconds(7);
    o.max_new_tokens_limit = 16;
    auto service = GenerationService::Create(o, &registry_);
    ASSERT_THAT(service, IsOk());
    service_ = std::move(*service);
    bounds_ = RequestBounds{kCapacity, service_->max_token_bytes()};
  }
  void TearDown() override {
    http_.reset();
    if (public_) public_->Shutdown();
    service_.reset();
    if (model_) model_->Shutdown();
  }

  // The public gRPC API with a receive limit of `max_receive_bytes`.
  void StartGrpc(int64_t max_receive_bytes) {
    public_ = std::make_unique<rpc::ServerRunner>("test-coordinator");
    public_->AddService(service_.get());
    rpc::ServerOptions so;
    so.metrics_address = "";
    so.shutdown_grace = absl::Milliseconds(100);
    so.max_receive_message_bytes = static_cast<int>(max_receive_bytes);
    ASSERT_THAT(public_->Start(so, nullptr), IsOk());
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    stub_ = lede::v1::Generation::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(public_->port()), grpc::InsecureChannelCredentials(), args));
  }
  // The OpenAI HTTP API with a body limit of `max_body_bytes`.
  void StartHttp(int64_t max_body_bytes) {
    OpenAiServerOptions ho;
    ho.listen_address = "127.0.0.1:0";
    ho.model_id = "m";
    ho.threads = 2;
    ho.max_body_bytes = static_cast<size_t>(max_body_bytes);
    auto server = OpenAiServer::Start(service_.get(), &registry_, ho, RenderPlainChatPrompt);
    ASSERT_THAT(server, IsOk());
    http_ = std::move(*server);
  }

  // Calls Generate and drains the stream; the final status.
  grpc::Status Generate(const lede::v1::GenerateRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub_->Generate(&context, request);
    lede::v1::GenerateResponse response;
    while (reader->Read(&response)) {
    }
    return reader->Finish();
  }
  // POSTs /v1/completions; {status, parsed body}.
  std::pair<int, json> PostCompletion(const std::string& body) {
    httplib::Client client("127.0.0.1", http_->port());
    client.set_read_timeout(60);
    client.set_write_timeout(60);
    auto r = client.Post("/v1/completions", body, "application/json");
    if (!r) return {0, nullptr};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  static lede::v1::GenerateRequest Request(std::string prompt) {
    lede::v1::GenerateRequest r;
    r.set_prompt(std::move(prompt));
    r.set_max_new_tokens(4);
    r.set_method(lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE);
    return r;
  }

  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<EosVerifier> verifier_;
  std::unique_ptr<rpc::ServerRunner> model_;
  telemetry::Registry registry_;
  std::unique_ptr<GenerationService> service_;
  RequestBounds bounds_;
  std::unique_ptr<rpc::ServerRunner> public_;
  std::unique_ptr<lede::v1::Generation::Stub> stub_;
  std::unique_ptr<OpenAiServer> http_;
};

// The longest piece covers every token's bytes; the limits follow from it.
TEST_F(InputBoundsTest, MaxTokenBytesBoundsEveryPiece) {
  const int64_t longest = tokenizer_->MaxTokenBytes();
  EXPECT_GE(longest, tokenizer::Tokenizer::kMinTokenTextBytes);
  for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
    EXPECT_LE(static_cast<int64_t>(tokenizer_->TokenBytes(-1, id).size()), longest) << id;
  }
  EXPECT_EQ(service_->max_token_bytes(), longest);
  EXPECT_GE(MaxRequestMessageBytes(bounds_), 2 * bounds_.max_prompt_bytes());
  EXPECT_GE(MaxHttpBodyBytes(bounds_), 6 * bounds_.max_prompt_bytes());
  EXPECT_LT(MaxRequestMessageBytes(bounds_), 1 << 20);  // lede-tiny: far below 64 MiB
}

// The coordinator's queue-wait bound travels with OpenSession, so that the
// verifier bounds the wait for a KV slot and the call's deadline is left to
// the prefill (remote_backend.h ModelClients::prefill_timeout); so does the
// request's max_new_tokens, which sizes the KV blocks the session reserves.
TEST_F(InputBoundsTest, OpenSessionCarriesTheQueueWaitBoundAndNewTokens) {
  StartGrpc(MaxRequestMessageBytes(bounds_));
  ASSERT_TRUE(Generate(Request("Once upon a time")).ok());
  EXPECT_EQ(verifier_->last_max_queue_wait_ms(), 7000);
  EXPECT_EQ(verifier_->last_max_new_tokens(), 4);
}

// Failure 1 over gRPC: the 20 MiB prompt exceeds the receive limit sized to
// the context window and is RESOURCE_EXHAUSTED before the coordinator's
// code sees it; nothing is tokenized and memory stays flat.
TEST_F(InputBoundsTest, HugePromptOverGrpcIsRejectedByTheMessageLimit) {
  StartGrpc(MaxRequestMessageBytes(bounds_));
  ASSERT_TRUE(Generate(Request("Once upon a time")).ok());  // warm: channel, Describe
  const double tokenized_before = TokenizedBytes(registry_);
  EXPECT_GT(tokenized_before, 0);
  const int opens_before = verifier_->n_opens();
  test_util::ResetPeakRss();
  const int64_t base = test_util::ReadRssBytes("VmHWM");
  {
    const grpc::Status s = Generate(Request(std::string(kHugePromptBytes, 'a')));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  }
  const int64_t growth = test_util::ReadRssBytes("VmHWM") - base;
  EXPECT_LT(growth, kMaxPeakGrowthBytes) << "peak RSS grew by " << growth << " bytes";
  EXPECT_EQ(TokenizedBytes(registry_), tokenized_before);
  EXPECT_EQ(verifier_->n_opens(), opens_before);
}

// Failure 1 behind a permissive message limit (the old 64 MiB): validation
// rejects the prompt by its length, INVALID_ARGUMENT naming `prompt`,
// before tokenization.
TEST_F(InputBoundsTest, HugePromptIsInvalidArgumentBeforeTokenization) {
  StartGrpc(64 << 20);
  ASSERT_TRUE(Generate(Request("Once upon a time")).ok());
  const double tokenized_before = TokenizedBytes(registry_);
  const int opens_before = verifier_->n_opens();
  test_util::ResetPeakRss();
  const int64_t base = test_util::ReadRssBytes("VmHWM");
  {
    const grpc::Status s = Generate(Request(std::string(kHugePromptBytes, 'a')));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), StartsWith("prompt: "));
    EXPECT_THAT(s.error_message(), HasSubstr("context window of 256 tokens"));
  }
  // The work done, not the time: nothing was tokenized (the old path
  // tokenized all 20 MiB, 17.6 s and 5 GB) and no session was opened.
  const int64_t growth = test_util::ReadRssBytes("VmHWM") - base;
  // The server holds the message a few times over (buffer, copy, two parses).
  EXPECT_LT(growth, kMaxPeakGrowthBytes + (int64_t{5} * kHugePromptBytes)) << growth;
  EXPECT_EQ(TokenizedBytes(registry_), tokenized_before);
  EXPECT_EQ(verifier_->n_opens(), opens_before);
}

// The byte bound is exact at its edge: max_prompt_bytes() passes the size
// check (and is tokenized), one more byte is INVALID_ARGUMENT.
TEST_F(InputBoundsTest, PromptByteBoundIsCapacityTimesLongestPiece) {
  lede::v1::GenerateRequest at_bound = Request(std::string(bounds_.max_prompt_bytes(), 'a'));
  EXPECT_THAT(ValidateRequestSize(at_bound, bounds_), IsOk());
  lede::v1::GenerateRequest over = Request(std::string(bounds_.max_prompt_bytes() + 1, 'a'));
  EXPECT_THAT(ValidateRequestSize(over, bounds_), StatusIs(StatusCode::kInvalidArgument));
  StartGrpc(MaxRequestMessageBytes(bounds_));
  const grpc::Status s = Generate(over);  // under the message limit: validation answers
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), StartsWith("prompt: "));
}

// The same kind of bound for token ids and stop strings, each naming its field.
TEST_F(InputBoundsTest, TokenIdsAndStopStringsAreBounded) {
  lede::v1::GenerateRequest ids;
  ids.set_max_new_tokens(4);
  for (int i = 0; i <= kCapacity; ++i) ids.add_prompt_token_ids(5);
  Status s = service_->GenerateInProcess(ids, [](const lede::v1::GenerateResponse&) { return true; });
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()), StartsWith("prompt_token_ids: "));

  lede::v1::GenerateRequest many = Request("Once");
  for (int i = 0; i <= kMaxStopStrings; ++i) many.add_stop("x" + std::to_string(i));
  s = service_->GenerateInProcess(many, [](const lede::v1::GenerateResponse&) { return true; });
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()), StartsWith("stop: "));

  lede::v1::GenerateRequest long_stop = Request("Once");
  long_stop.add_stop(std::string(bounds_.max_prompt_bytes() + 1, 'z'));
  s = service_->GenerateInProcess(long_stop, [](const lede::v1::GenerateResponse&) { return true; });
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()), StartsWith("stop: "));
  EXPECT_EQ(verifier_->n_opens(), 0);
}

// A slot smaller than the model's window (the verifier's KV budget): a
// prompt the window would hold but the slot cannot is RESOURCE_EXHAUSTED
// naming the KV budget (HTTP 429); beyond the window it stays
// INVALID_ARGUMENT; without a window (an older verifier) nothing changes.
TEST(RequestSizeTest, BeyondTheSlotButWithinTheWindowIsResourceExhausted) {
  const RequestBounds bounds{64, 4, 256};
  lede::v1::GenerateRequest ids;
  for (int i = 0; i < 65; ++i) ids.add_prompt_token_ids(5);
  Status s = ValidateRequestSize(ids, bounds);
  EXPECT_THAT(s, StatusIs(StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(s.message()), HasSubstr("KV memory budget"));
  for (int i = 65; i < 257; ++i) ids.add_prompt_token_ids(5);
  EXPECT_THAT(ValidateRequestSize(ids, bounds), StatusIs(StatusCode::kInvalidArgument));

  lede::v1::GenerateRequest text;
  text.set_prompt(std::string(64 * 4 + 1, 'a'));
  EXPECT_THAT(ValidateRequestSize(text, bounds), StatusIs(StatusCode::kResourceExhausted));
  text.set_prompt(std::string(256 * 4 + 1, 'a'));
  EXPECT_THAT(ValidateRequestSize(text, bounds), StatusIs(StatusCode::kInvalidArgument));
  text.set_prompt(std::string(64 * 4 + 1, 'a'));
  EXPECT_THAT(ValidateRequestSize(text, RequestBounds{64, 4}), StatusIs(StatusCode::kInvalidArgument));
}

// Failure 1 over HTTP: the body limit sized to the context window answers
// 413 in OpenAI's error envelope before JSON parsing; nothing tokenized.
TEST_F(InputBoundsTest, HugePromptOverHttpIs413) {
  StartHttp(MaxHttpBodyBytes(bounds_));
  const std::string body = json{{"prompt", std::string(kHugePromptBytes, 'a')}, {"max_tokens", 4}}.dump();
  test_util::ResetPeakRss();
  const int64_t base = test_util::ReadRssBytes("VmHWM");
  auto [status, reply] = PostCompletion(body);
  EXPECT_EQ(status, 413);
  ASSERT_TRUE(reply.is_object()) << reply;
  EXPECT_EQ(reply["error"]["code"], "request_too_large");
  EXPECT_EQ(reply["error"]["type"], "invalid_request_error");
  const int64_t growth = test_util::ReadRssBytes("VmHWM") - base;
  EXPECT_LT(growth, kMaxPeakGrowthBytes) << growth;
  EXPECT_EQ(TokenizedBytes(registry_), 0);
  EXPECT_EQ(verifier_->n_opens(), 0);
}

// Behind a permissive body limit, the HTTP API gives the gRPC API's
// validation error: 400 with param "prompt", before tokenization.
TEST_F(InputBoundsTest, HugePromptOverHttpIs400NamingPrompt) {
  StartHttp(64 << 20);
  auto [status, reply] =
      PostCompletion(json{{"prompt", std::string(kHugePromptBytes, 'a')}, {"max_tokens", 4}}.dump());
  EXPECT_EQ(status, 400);
  ASSERT_TRUE(reply.is_object()) << reply;
  EXPECT_EQ(reply["error"]["param"], "prompt");
  EXPECT_EQ(TokenizedBytes(registry_), 0);
  // A prompt that fits still works through the same server.
  auto [ok_status, ok_reply] = PostCompletion(json{{"prompt", "Once upon a time"}, {"max_tokens", 4}}.dump());
  EXPECT_EQ(ok_status, 200) << ok_reply;
  EXPECT_GT(TokenizedBytes(registry_), 0);
}

// The context window comes from the model's files at startup.
TEST(ReadContextWindowTest, ReadsTheModelsConfig) {
  auto window = ReadContextWindow(std::string(LEDE_SOURCE_DIR) + "/models/lede-tiny");
  ASSERT_THAT(window, IsOk());
  EXPECT_EQ(*window, 512);
  EXPECT_THAT(ReadContextWindow("/nonexistent/model"), StatusIs(StatusCode::kNotFound));
}

// A .gguf model: its llama.context_length key.
TEST(ReadContextWindowTest, ReadsAGgufsContextLength) {
  testing::TempDir tmp;
  const std::string path = (tmp.path() / "m.gguf").string();
  checkpoint::GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUint32("llama.context_length", 4096);
  ASSERT_THAT(w.Write(path), IsOk());
  auto window = ReadContextWindow(path);
  ASSERT_THAT(window, IsOk());
  EXPECT_EQ(*window, 4096);
  const std::string bad = (tmp.path() / "bad.gguf").string();
  checkpoint::GgufWriter no_key;
  no_key.AddString("general.architecture", "llama");
  ASSERT_THAT(no_key.Write(bad), IsOk());
  EXPECT_THAT(ReadContextWindow(bad), StatusIs(StatusCode::kNotFound));
}

}  // namespace
}  // namespace lede::coordinator
