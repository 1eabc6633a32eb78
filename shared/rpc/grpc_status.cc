#include "shared/rpc/grpc_status.h"

#include <string>

namespace lede::rpc {

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(status.code())),
                      std::string(status.message()));
}

Status FromGrpcStatus(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return OkStatus();
  std::string message = what.empty() ? status.error_message() : what + ": " + status.error_message();
  return Status(static_cast<StatusCode>(static_cast<int>(status.error_code())), message);
}

}  // namespace lede::rpc
