// File: services/model/session_leases.h
//
// SessionLeases: which coordinator instances are alive, as far as the
// verifier knows (without it a crashed coordinator's sessions held
// KV slots until the 300 s idle timeout). A coordinator instance (a random
// id per process) renews its lease well within the lease's TTL
// (lede.v1.Verifier/RenewLease); the verifier frees the sessions of every
// instance whose lease lapsed (TakeExpired) and, when a renewal names a
// stable owner_name, those of every other instance of that name at once
// (the restarted coordinator replaces its predecessor).
//
// Why a renewed lease and not a long-lived stream whose end frees the
// sessions: a lease's time is the verifier's own Clock, so it is tested with
// a FakeClock and does not depend on how fast the transport notices a dead
// peer (a half-open TCP connection or a proxy keeps a stream "alive" for
// minutes without keepalive tuning); and a unary call per second costs
// nothing next to a verification round.
//
// A replaced instance is remembered (the last kMaxTombstones): its later
// renewals and sessions are kFailedPrecondition, so two live coordinators
// misconfigured with one owner_name fail loudly instead of freeing each
// other's sessions in turn.
//
// Thread-safety: thread-safe (one internal mutex). The Clock is borrowed and
// must outlive the object. Torch-free.
#ifndef LEDE_SERVICES_MODEL_SESSION_LEASES_H_
#define LEDE_SERVICES_MODEL_SESSION_LEASES_H_

#include <cstddef>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shared/clock/clock.h"
#include "shared/status/status.h"

namespace lede::model_service {

struct SessionLeaseOptions {
  clock::Clock* clock = nullptr;  // nullptr = Clock::Real()
  // TTL of a renewal that asks for none (ttl 0), and of the lease an
  // OpenSession of an unknown instance creates: long enough for four missed
  // renewals at the coordinator's 1 s period, short enough that a dead
  // coordinator's slots come back "within a few seconds".
  absl::Duration default_ttl = absl::Seconds(5);
  // Requested TTLs are clamped to [min_ttl, max_ttl]: a tiny TTL would make
  // a slow renewal free live sessions, a huge one brings back failure 2.
  absl::Duration min_ttl = absl::Seconds(1);
  absl::Duration max_ttl = absl::Seconds(60);
  // Example: SessionLeaseOptions o; o.clock = &fake_clock; SessionLeases leases(o);
};

class SessionLeases {
 public:
  static constexpr size_t kMaxTombstones = 1024;

  struct Renewal {
    absl::Duration ttl;                  // granted (clamped)
    std::vector<std::string> replaced;   // instances of the same owner_name, now dead
  };

  explicit SessionLeases(SessionLeaseOptions options = {});

  // Creates or extends `instance_id`'s lease to Now() + ttl (clamped; zero =
  // default_ttl). With a non-empty `owner_name`, every other live instance of
  // that name is removed and returned in `replaced` (free its sessions now).
  // Errors: kInvalidArgument "instance_id: ..." when empty;
  // kFailedPrecondition when the instance was itself replaced (state
  // unchanged).
  StatusOr<Renewal> Renew(const std::string& instance_id, const std::string& owner_name, absl::Duration ttl);

  // For OpenSession: OK when `instance_id` holds a live lease (one with
  // default_ttl is created if it holds none: a coordinator whose first
  // renewal has not arrived yet). Errors: kFailedPrecondition for a replaced
  // instance.
  Status Admit(const std::string& instance_id);

  // Removes and returns the instances whose lease lapsed at Now().
  std::vector<std::string> TakeExpired();

  // Whether `instance_id` holds a live (not yet collected) lease.
  bool Holds(const std::string& instance_id);
  size_t size();
  clock::Clock& clock() { return *clock_; }

 private:
  struct Lease {
    std::string owner_name;
    absl::Time expires;
  };
  void Bury(const std::string& instance_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  SessionLeaseOptions options_;
  clock::Clock* clock_;
  absl::Mutex mu_;
  std::map<std::string, Lease> leases_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> tombstones_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> tombstone_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lede::model_service

#endif  // LEDE_SERVICES_MODEL_SESSION_LEASES_H_
