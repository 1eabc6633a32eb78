#include "services/coordinator/session_lease.h"

#include <unistd.h>

#include <cstdio>
#include <random>
#include <utility>

#include <grpcpp/client_context.h>

#include "shared/rpc/server.h"

namespace lede::coordinator {
namespace {

std::string RandomInstanceId() {
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ rd());
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

}  // namespace

std::string DefaultInstanceName(const std::string& listen_address) {
  const size_t colon = listen_address.rfind(':');
  const std::string port = colon == std::string::npos ? "" : listen_address.substr(colon + 1);
  if (port.empty() || port == "0") return "";
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = 0;
  return std::string(host) + "/" + listen_address;
}

SessionLease::SessionLease(lede::v1::Verifier::Stub* verifier, SessionLeaseOptions options)
    : verifier_(verifier),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : clock::Clock::Real()),
      instance_id_(RandomInstanceId()) {}

SessionLease::~SessionLease() { Stop(); }

void SessionLease::Start() {
  if (started_) return;
  started_ = true;
  rpc::LogEvent("info", "session_lease_instance",
                {{"instance_id", instance_id_}, {"owner_name", options_.owner_name}});
  if (!RenewOnce()) return;
  thread_ = std::thread([this] { Loop(); });
}

void SessionLease::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool SessionLease::RenewOnce() {
  lede::v1::RenewLeaseRequest req;
  req.set_instance_id(instance_id_);
  req.set_owner_name(options_.owner_name);
  req.set_ttl_ms(absl::ToInt64Milliseconds(options_.ttl));
  lede::v1::RenewLeaseResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  const grpc::Status s = verifier_->RenewLease(&ctx, req, &resp);
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    rpc::LogEvent("warn", "session_lease_unsupported",
                  {{"detail", "the verifier has no RenewLease; a crash leaves sessions until its idle timeout"}});
    return false;
  }
  if (!s.ok()) {
    if (last_ok_) {
      rpc::LogEvent(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ? "error" : "warn",
                    "session_lease_renewal_failed", {{"instance_id", instance_id_}, {"error", s.error_message()}});
    }
    last_ok_ = false;
    return true;
  }
  if (!last_ok_ || resp.n_replaced_sessions() > 0) {
    rpc::LogEvent("info", "session_lease_renewed",
                  {{"instance_id", instance_id_}, {"replaced_sessions", std::to_string(resp.n_replaced_sessions())}});
  }
  last_ok_ = true;
  if (options_.on_renewed) options_.on_renewed(resp);
  return true;
}

void SessionLease::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (clock_->AwaitWithTimeout(&mu_, absl::Condition(&stopping_), options_.renew_interval)) break;
    mu_.Unlock();
    const bool go_on = RenewOnce();
    mu_.Lock();
    if (!go_on) break;
  }
}

}  // namespace lede::coordinator
