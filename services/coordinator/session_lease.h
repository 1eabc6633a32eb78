// File: services/coordinator/session_lease.h
//
// SessionLease: the coordinator's side of session ownership on the verifier
// (lede.v1.Verifier/RenewLease). Each coordinator
// process is one instance (a random 128-bit id, hex); every session it
// opens names that id (OpenSessionRequest.owner_instance), and a thread
// renews the instance's lease every `renew_interval`. When the coordinator
// dies, renewals stop and the verifier frees its sessions within the TTL;
// a restarted coordinator with the same `owner_name` frees them with its
// first renewal, which Start() sends before the coordinator serves.
//
// A renewal that fails is retried at the next period (the verifier may be
// down or restarting; it has lost its sessions then anyway). UNIMPLEMENTED
// (a verifier without leases) stops the renewals: sessions then fall back
// to the verifier's idle reclaim.
//
// Thread-safety: instance_id() is immutable; Start/Stop from one thread.
// The stub and the clock are borrowed and must outlive the object.
#ifndef LEDE_SERVICES_COORDINATOR_SESSION_LEASE_H_
#define LEDE_SERVICES_COORDINATOR_SESSION_LEASE_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/lede/v1/model.grpc.pb.h"
#include "shared/clock/clock.h"

namespace lede::coordinator {

struct SessionLeaseOptions {
  // Stable across restarts of this coordinator (default in main: host name
  // + listen address, when the port is fixed); "" = replace nobody (the old
  // instance's sessions are freed when its lease lapses).
  std::string owner_name;
  // Lease TTL asked for; the verifier clamps it to [1 s, 60 s]. A dead
  // coordinator's slots come back within about this long.
  absl::Duration ttl = absl::Seconds(5);
  // Renewal period: well under the TTL, so a few lost renewals lose nothing.
  absl::Duration renew_interval = absl::Seconds(1);
  // Deadline of one renewal call.
  absl::Duration call_timeout = absl::Seconds(1);
  clock::Clock* clock = nullptr;  // nullptr = Clock::Real() (the renewal period)
  // Called after every successful renewal with the verifier's answer (its
  // load report: slots, free slots, waiting sessions, this instance's
  // sessions), on the renewal thread (and on Start's caller for the first).
  std::function<void(const lede::v1::RenewLeaseResponse&)> on_renewed;
  // Example: SessionLeaseOptions o; o.owner_name = "pod-7/0.0.0.0:50051";
};

// The default owner_name of a coordinator listening on `listen_address`:
// "<host name>/<listen_address>" when the port is fixed, "" for port 0 (two
// test coordinators on 127.0.0.1:0 are not one coordinator restarted).
std::string DefaultInstanceName(const std::string& listen_address);

class SessionLease {
 public:
  SessionLease(lede::v1::Verifier::Stub* verifier, SessionLeaseOptions options);
  ~SessionLease();  // Stop()
  SessionLease(const SessionLease&) = delete;
  SessionLease& operator=(const SessionLease&) = delete;

  // Sends the first renewal (synchronously; a failure is logged, not
  // fatal: the coordinator may start before the verifier) and starts the
  // renewal thread. Idempotent.
  void Start();
  // Stops renewing (the lease then lapses on the verifier). Idempotent.
  void Stop();

  // This instance's id (what OpenSession sends as owner_instance).
  const std::string& instance_id() const { return instance_id_; }

 private:
  // One RenewLease call; false when renewals should stop (UNIMPLEMENTED).
  bool RenewOnce();
  void Loop();

  lede::v1::Verifier::Stub* verifier_;
  SessionLeaseOptions options_;
  clock::Clock* clock_;
  const std::string instance_id_;
  std::thread thread_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ = false;
  bool last_ok_ = true;  // renewal thread only (after Start)
};

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_SESSION_LEASE_H_
