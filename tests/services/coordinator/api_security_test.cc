// Security of the public API ("no transport security
// and no authentication"): TLS on the public gRPC API and the OpenAI HTTP
// API, mutual TLS between the coordinator and a model service, and API keys
// on both APIs. Certificates are made at test time with openssl
// (test_certificates.h); the coordinator runs in-process over a scripted
// verifier (eos_verifier.h).
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
#include "shared/rpc/security.h"
#include "shared/rpc/server.h"
#include "shared/status/status_macros.h"
#include "shared/telemetry/metrics.h"
#include "shared/tokenizer/model_files.h"
#include "tests/services/coordinator/eos_verifier.h"
#include "tests/services/coordinator/test_certificates.h"
#include "tests/testing/status_matchers.h"

namespace lede::coordinator {
namespace {

using ::lede::testing::IsOk;
using ::testing::HasSubstr;
using ::testing::Not;
using nlohmann::json;
using test_util::EosVerifier;
using test_util::TestCertificates;

constexpr char kKeyOne[] = "sk-lede-test-key-one-5f1c";
constexpr char kKeyTwo[] = "sk-lede-test-key-two-9a7e";
constexpr char kWrongKey[] = "sk-lede-wrong-key-0000";

class ApiSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    certs_ = TestCertificates::Make();
    if (!certs_->error.empty()) GTEST_SKIP() << "openssl: " << certs_->error;
    auto path = tokenizer::FindTokenizerFile(std::string(LEDE_SOURCE_DIR) + "/models/lede-tiny");
    ASSERT_THAT(path, IsOk());
    tokenizer_path_ = *path;
    verifier_ = std::make_unique<EosVerifier>(2048);
  }
  void TearDown() override {
    http_.reset();
    if (public_) public_->Shutdown();
    services_.clear();
    if (model_) model_->Shutdown();
  }

  // The scripted verifier on loopback; `tls` may require client certificates.
  void StartModel(const rpc::ServerTlsOptions& tls) {
    model_ = std::make_unique<rpc::ServerRunner>("test-verifier");
    model_->AddService(verifier_.get());
    rpc::ServerOptions mo;
    mo.metrics_address = "";
    mo.shutdown_grace = absl::Milliseconds(100);
    mo.tls = tls;
    ASSERT_THAT(model_->Start(mo, nullptr), IsOk());
  }
  // A coordinator (GenerationService) over the model; owned by the fixture.
  GenerationService* MakeService(CoordinatorOptions o) {
    o.tokenizer_path = tokenizer_path_;
    o.verifier_target = o.drafter_target = "127.0.0.1:" + std::to_string(model_->port());
    o.rpc_timeout = absl::Seconds(3);
    o.max_new_tokens_limit = 8;
    auto service = GenerationService::Create(o, &registry_);
    EXPECT_THAT(service, IsOk());
    if (!service.ok()) return nullptr;
    services_.push_back(std::move(*service));
    return services_.back().get();
  }
  // `service` as the public gRPC API.
  void StartPublic(GenerationService* service, const rpc::ServerTlsOptions& tls) {
    public_ = std::make_unique<rpc::ServerRunner>("test-coordinator");
    public_->AddService(service);
    rpc::ServerOptions so;
    so.metrics_address = "";
    so.shutdown_grace = absl::Milliseconds(100);
    so.tls = tls;
    ASSERT_THAT(public_->Start(so, nullptr), IsOk());
  }
  std::unique_ptr<lede::v1::Generation::Stub> PublicStub(std::shared_ptr<grpc::ChannelCredentials> credentials) {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    return lede::v1::Generation::NewStub(
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(public_->port()), credentials, args));
  }
  static std::shared_ptr<grpc::ChannelCredentials> TrustingCa(const std::string& ca_path) {
    rpc::ChannelTlsOptions tls;
    tls.ca_path = ca_path;
    auto credentials = rpc::MakeChannelCredentials(tls);
    EXPECT_THAT(credentials, IsOk());
    return credentials.ok() ? *credentials : nullptr;
  }
  static grpc::Status Generate(lede::v1::Generation::Stub* stub, const std::string& authorization = "") {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!authorization.empty()) context.AddMetadata("authorization", authorization);
    lede::v1::GenerateRequest request;
    request.set_prompt("Once upon a time");
    request.set_max_new_tokens(4);
    request.set_method(lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE);
    auto reader = stub->Generate(&context, request);
    lede::v1::GenerateResponse response;
    while (reader->Read(&response)) {
    }
    return reader->Finish();
  }
  static Status GenerateInProcess(GenerationService* service) {
    lede::v1::GenerateRequest request;
    request.set_prompt("Once upon a time");
    request.set_max_new_tokens(4);
    request.set_method(lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE);
    return service->GenerateInProcess(request, [](const lede::v1::GenerateResponse&) { return true; });
  }

  std::unique_ptr<TestCertificates> certs_;
  std::string tokenizer_path_;
  std::unique_ptr<EosVerifier> verifier_;
  std::unique_ptr<rpc::ServerRunner> model_;
  telemetry::Registry registry_;
  std::vector<std::unique_ptr<GenerationService>> services_;
  std::unique_ptr<rpc::ServerRunner> public_;
  std::unique_ptr<OpenAiServer> http_;
};

// TLS on the public gRPC API: the handshake succeeds for a client that
// trusts the CA, and fails (UNAVAILABLE) for one that trusts another CA or
// speaks plaintext.
TEST_F(ApiSecurityTest, GrpcTlsHandshakeNeedsTheCa) {
  StartModel({});
  GenerationService* service = MakeService({});
  ASSERT_NE(service, nullptr);
  StartPublic(service, {certs_->server_cert, certs_->server_key, ""});
  EXPECT_TRUE(Generate(PublicStub(TrustingCa(certs_->ca)).get()).ok());
  EXPECT_EQ(Generate(PublicStub(TrustingCa(certs_->other_ca)).get()).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Generate(PublicStub(grpc::InsecureChannelCredentials()).get()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

// Mutual TLS between the coordinator and a model service that requires
// client certificates: with the CA and its client certificate the request
// runs; with the CA alone the model service refuses the handshake.
TEST_F(ApiSecurityTest, ModelServiceVerifiesTheCoordinatorsCertificate) {
  StartModel({certs_->server_cert, certs_->server_key, certs_->ca});
  CoordinatorOptions with_cert;
  with_cert.model_tls.ca_path = certs_->ca;
  with_cert.model_tls.cert_path = certs_->client_cert;
  with_cert.model_tls.key_path = certs_->client_key;
  // gRPC 1.51 checks the server's DNS names only (not IP SANs): the
  // channel's target is 127.0.0.1, so the certificate's name is given.
  with_cert.model_tls.server_name = "localhost";
  GenerationService* trusted = MakeService(with_cert);
  ASSERT_NE(trusted, nullptr);
  EXPECT_THAT(GenerateInProcess(trusted), IsOk());
  EXPECT_EQ(verifier_->n_opens(), 1);

  CoordinatorOptions without_cert;
  without_cert.model_tls.ca_path = certs_->ca;
  without_cert.model_tls.server_name = "localhost";
  GenerationService* anonymous = MakeService(without_cert);
  ASSERT_NE(anonymous, nullptr);
  EXPECT_EQ(GenerateInProcess(anonymous).code(), StatusCode::kUnavailable);
  GenerationService* plaintext = MakeService({});
  ASSERT_NE(plaintext, nullptr);
  EXPECT_EQ(GenerateInProcess(plaintext).code(), StatusCode::kUnavailable);
  EXPECT_EQ(verifier_->n_opens(), 1);
}

// API keys on gRPC: no key or a wrong key is UNAUTHENTICATED, a right key
// (either of two) works, and no log line carries a key.
TEST_F(ApiSecurityTest, GrpcApiKeysAreRequiredAndNeverLogged) {
  StartModel({});
  CoordinatorOptions o;
  o.api_keys = {kKeyOne, kKeyTwo};
  GenerationService* service = MakeService(o);
  ASSERT_NE(service, nullptr);
  StartPublic(service, {});
  auto stub = PublicStub(grpc::InsecureChannelCredentials());
  ::testing::internal::CaptureStderr();
  const grpc::Status missing = Generate(stub.get());
  const grpc::Status wrong = Generate(stub.get(), std::string("Bearer ") + kWrongKey);
  const grpc::Status prefix = Generate(stub.get(), std::string("Bearer ") + std::string(kKeyOne).substr(0, 10));
  const grpc::Status no_scheme = Generate(stub.get(), kKeyOne);
  const grpc::Status right = Generate(stub.get(), std::string("Bearer ") + kKeyTwo);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(missing.error_message(), HasSubstr("authorization"));
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(prefix.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(no_scheme.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(right.ok()) << right.error_message();
  EXPECT_THAT(log, HasSubstr("request_failed"));  // the rejections were logged...
  for (const char* key : {kKeyOne, kKeyTwo, kWrongKey}) EXPECT_THAT(log, Not(HasSubstr(key)));  // ...keylessly
  EXPECT_EQ(verifier_->n_opens(), 1);
}

// The HTTP API over TLS (cpp-httplib's SSLServer) with API keys: a client
// trusting the CA connects, one trusting another CA does not; /v1/* needs
// the key (401, OpenAI's invalid_api_key error otherwise); /health and
// /metrics stay open; the key never reaches the log.
TEST_F(ApiSecurityTest, HttpsWithApiKeys) {
  StartModel({});
  GenerationService* service = MakeService({});
  ASSERT_NE(service, nullptr);
  OpenAiServerOptions ho;
  ho.listen_address = "127.0.0.1:0";
  ho.model_id = "m";
  ho.threads = 2;
  ho.tls_cert_path = certs_->server_cert;
  ho.tls_key_path = certs_->server_key;
  ho.api_keys = {kKeyOne};
  auto server = OpenAiServer::Start(service, &registry_, ho, RenderPlainChatPrompt);
  ASSERT_THAT(server, IsOk());
  http_ = std::move(*server);

  httplib::SSLClient untrusting("localhost", http_->port());
  untrusting.set_ca_cert_path(certs_->other_ca.c_str());
  untrusting.enable_server_certificate_verification(true);
  EXPECT_FALSE(untrusting.Get("/health"));  // the handshake fails

  // cpp-httplib 0.11 verifies the DNS name (its IP SAN check fails for
  // 127.0.0.1): connect by the certificate's name.
  httplib::SSLClient client("localhost", http_->port());
  client.set_ca_cert_path(certs_->ca.c_str());
  client.enable_server_certificate_verification(true);
  client.set_read_timeout(10);
  const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 4}}.dump();
  ::testing::internal::CaptureStderr();
  auto missing = client.Post("/v1/completions", body, "application/json");
  auto wrong = client.Post("/v1/completions", httplib::Headers{{"Authorization", std::string("Bearer ") + kWrongKey}}, body,
                           "application/json");
  auto models = client.Get("/v1/models");
  auto right = client.Post("/v1/completions", httplib::Headers{{"Authorization", std::string("Bearer ") + kKeyOne}}, body,
                           "application/json");
  auto health = client.Get("/health");
  auto metrics = client.Get("/metrics");
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(missing && wrong && models && right && health && metrics)
      << httplib::to_string(missing.error()) << " " << httplib::to_string(wrong.error()) << " "
      << httplib::to_string(models.error()) << " " << httplib::to_string(right.error()) << " "
      << httplib::to_string(health.error()) << " " << httplib::to_string(metrics.error());
  for (const auto* r : {&missing, &wrong, &models}) {
    EXPECT_EQ((*r)->status, 401);
    const json error = json::parse((*r)->body, nullptr, false);
    ASSERT_TRUE(error.is_object()) << (*r)->body;
    EXPECT_EQ(error["error"]["code"], "invalid_api_key");
    EXPECT_EQ(error["error"]["type"], "invalid_request_error");
  }
  EXPECT_EQ(right->status, 200) << right->body;
  EXPECT_EQ(health->status, 200) << health->body;
  EXPECT_EQ(metrics->status, 200);
  for (const char* key : {kKeyOne, kWrongKey}) EXPECT_THAT(log, Not(HasSubstr(key)));
  EXPECT_EQ(verifier_->n_opens(), 1);
}

}  // namespace
}  // namespace lede::coordinator
