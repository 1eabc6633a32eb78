// File: shared/rpc/grpc_status.h
//
// lede::Status <-> grpc::Status. The codes match value for value (absl and
// gRPC share them); the message is kept; UNKNOWN is never invented.
#ifndef LEDE_SHARED_RPC_GRPC_STATUS_H_
#define LEDE_SHARED_RPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "shared/status/status.h"

namespace lede::rpc {

grpc::Status ToGrpcStatus(const Status& status);
// For the result of a call to another LEDE process: the code and message,
// prefixed with `what` (e.g. "verifier Verify").
Status FromGrpcStatus(const grpc::Status& status, const std::string& what = "");

}  // namespace lede::rpc

#endif  // LEDE_SHARED_RPC_GRPC_STATUS_H_
