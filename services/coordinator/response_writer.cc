#include "services/coordinator/response_writer.h"

#include <thread>
#include <utility>

#include <grpcpp/impl/codegen/proto_utils.h>

#include "shared/rpc/grpc_status.h"

namespace lede::coordinator {

GenerateReactor::GenerateReactor(const RequestRunner& run, grpc::CallbackServerContext* context,
                                 lede::v1::GenerateRequest request)
    : run_(run), context_(context), request_(std::move(request)) {
  std::thread([this] { Work(); }).detach();
}

bool GenerateReactor::Write(const lede::v1::GenerateResponse& response) {
  grpc::ByteBuffer buffer;
  bool own = false;
  if (!grpc::SerializationTraits<lede::v1::GenerateResponse>::Serialize(response, &buffer, &own).ok()) return false;
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &GenerateReactor::CanQueueLocked));
  if (failed_) return false;
  queue_.push_back(std::move(buffer));
  if (!writing_) StartNextLocked();
  return true;
}

void GenerateReactor::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  queue_.pop_front();
  if (!ok) {
    failed_ = true;
    queue_.clear();
  } else if (!queue_.empty()) {
    StartNextLocked();
  }
}

void GenerateReactor::OnCancel() {
  absl::MutexLock lock(&mu_);
  failed_ = true;
}

void GenerateReactor::OnDone() {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&worker_done_));
  }
  delete this;
}

void GenerateReactor::StartNextLocked() {
  writing_ = true;
  StartWrite(&queue_.front());
}

void GenerateReactor::Work() {
  Status status = run_(context_, &request_, this);
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &GenerateReactor::DrainedLocked));
  }
  Finish(rpc::ToGrpcStatus(status));
  absl::MutexLock lock(&mu_);
  worker_done_ = true;
}

bool GenerateReactor::CanQueueLocked() const { return queue_.size() < kMaxQueued || failed_; }

bool GenerateReactor::DrainedLocked() const { return (!writing_ && queue_.empty()) || failed_; }

}  // namespace lede::coordinator
