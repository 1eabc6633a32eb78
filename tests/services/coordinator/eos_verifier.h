// A lede.v1.Verifier for the coordinator's limit and security tests: it
// describes a tiny model (capacity 256 tokens) and ends every generation at
// once (OpenSession answers EOS), counting what it was asked. No model
// process, no torch.
#ifndef LEDE_TESTS_SERVICES_COORDINATOR_EOS_VERIFIER_H_
#define LEDE_TESTS_SERVICES_COORDINATOR_EOS_VERIFIER_H_

#include <atomic>
#include <cstdint>
#include <fstream>
#include <string>

#include <grpcpp/server_context.h>

#include "proto/lede/v1/model.grpc.pb.h"

namespace lede::coordinator::test_util {

inline constexpr int64_t kCapacity = 256;
inline constexpr int32_t kEosId = 2;

class EosVerifier final : public lede::v1::Verifier::Service {
 public:
  explicit EosVerifier(int32_t vocab_size) : vocab_size_(vocab_size) {}

  grpc::Status Describe(grpc::ServerContext*, const lede::v1::DescribeRequest*, lede::v1::ModelInfo* info) override {
    info->set_n_layers(4);
    info->set_vocab_size(vocab_size_);
    info->set_capacity(kCapacity);
    info->set_n_slots(4);
    info->set_max_draft_length(4);
    info->add_eos_ids(kEosId);
    info->set_bos_id(1);
    return grpc::Status::OK;
  }
  grpc::Status OpenSession(grpc::ServerContext*, const lede::v1::OpenSessionRequest* request,
                           lede::v1::OpenSessionResponse* response) override {
    opens_.fetch_add(1);
    last_max_queue_wait_ms_.store(request->max_queue_wait_ms());
    last_max_new_tokens_.store(request->max_new_tokens());
    response->set_slot(0);
    response->set_first_token(kEosId);
    return grpc::Status::OK;
  }
  grpc::Status Verify(grpc::ServerContext*, const lede::v1::VerifyRequest*, lede::v1::VerifyResponse* response) override {
    response->add_tokens(kEosId);
    return grpc::Status::OK;
  }
  grpc::Status CloseSession(grpc::ServerContext*, const lede::v1::CloseSessionRequest*,
                            lede::v1::CloseSessionResponse*) override {
    return grpc::Status::OK;
  }
  int n_opens() const { return opens_.load(); }
  // OpenSessionRequest.max_queue_wait_ms of the last open (-1: none yet).
  int64_t last_max_queue_wait_ms() const { return last_max_queue_wait_ms_.load(); }
  // OpenSessionRequest.max_new_tokens of the last open (-1: none yet).
  int64_t last_max_new_tokens() const { return last_max_new_tokens_.load(); }

 private:
  const int32_t vocab_size_;
  std::atomic<int> opens_{0};
  std::atomic<int64_t> last_max_queue_wait_ms_{-1};
  std::atomic<int64_t> last_max_new_tokens_{-1};
};

// The process's resident set, bytes: "VmHWM" (peak since the last
// ResetPeakRss()) or "VmRSS" (now) of /proc/self/status; 0 if unreadable.
inline int64_t ReadRssBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

// Resets VmHWM to the current RSS (Linux: "5" to /proc/self/clear_refs).
// False where the kernel refuses; then VmHWM keeps an older peak and a
// growth check can only miss growth below it (never fail falsely).
inline bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace lede::coordinator::test_util

#endif  // LEDE_TESTS_SERVICES_COORDINATOR_EOS_VERIFIER_H_
