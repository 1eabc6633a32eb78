// File: services/coordinator/response_writer.h
//
// Where one request's responses go, for the two front ends of the
// coordinator: the gRPC Generate stream (GenerateReactor: a worker thread
// runs the request and hands each response to the gRPC reactor through a
// small bounded queue, so a slow client blocks the worker, never the
// reactor) and an in-process callback (the OpenAI HTTP API).
#ifndef LEDE_SERVICES_COORDINATOR_RESPONSE_WRITER_H_
#define LEDE_SERVICES_COORDINATOR_RESPONSE_WRITER_H_

#include <cstddef>
#include <deque>
#include <functional>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/lede/v1/generation.pb.h"
#include "shared/status/status.h"

namespace lede::coordinator {

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // Hands one response to the client; false once the client is gone.
  // Called from the request's worker thread only.
  virtual bool Write(const lede::v1::GenerateResponse& response) = 0;
  // What a failed Write() means for the request's status: a gRPC stream
  // that broke is UNAVAILABLE; an HTTP client that hung up cancelled it.
  virtual Status WriteFailedStatus() const { return UnavailableError("client stream closed"); }
};

// Runs one request to its end, writing its responses to `writer`; `context`
// is the gRPC call's (null for in-process requests).
using RequestRunner = std::function<Status(grpc::CallbackServerContext* context,
                                           const lede::v1::GenerateRequest* request, ResponseWriter* writer)>;

// The server side of one Generate call (gRPC callback API): a detached
// worker thread runs `run` and hands responses to the reactor through a
// queue of at most kMaxQueued; the reactor writes one at a time. The worker
// finishes the call once the queue is drained; OnDone() waits for the
// worker to be out before the reactor deletes itself.
class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public ResponseWriter {
 public:
  // Starts the worker. `run` must stay valid until OnDone().
  GenerateReactor(const RequestRunner& run, grpc::CallbackServerContext* context, lede::v1::GenerateRequest request);

  bool Write(const lede::v1::GenerateResponse& response) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  static constexpr size_t kMaxQueued = 8;

  void StartNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Work();
  // Await conditions (mu_ held): room in the queue (or failed); every
  // response written (or failed).
  bool CanQueueLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool DrainedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RequestRunner& run_;
  grpc::CallbackServerContext* context_;
  lede::v1::GenerateRequest request_;
  absl::Mutex mu_;  // a state change wakes the Await()s on its release
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);  // front = the write in flight (when writing_)
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;  // client gone or write failed
  bool worker_done_ ABSL_GUARDED_BY(mu_) = false;
};

// Finishes a call at once with an error (no worker needed).
class RejectReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RejectReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// The HTTP front end's writer: a callback; a false return is a client that
// hung up, which cancels the request (CANCELLED).
class CallbackWriter final : public ResponseWriter {
 public:
  explicit CallbackWriter(const std::function<bool(const lede::v1::GenerateResponse&)>& fn) : fn_(fn) {}
  bool Write(const lede::v1::GenerateResponse& response) override { return fn_(response); }
  Status WriteFailedStatus() const override { return Status(StatusCode::kCancelled, "client disconnected"); }

 private:
  const std::function<bool(const lede::v1::GenerateResponse&)>& fn_;
};

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_RESPONSE_WRITER_H_
