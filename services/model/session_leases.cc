#include "services/model/session_leases.h"

#include <algorithm>
#include <utility>

namespace lede::model_service {

SessionLeases::SessionLeases(SessionLeaseOptions options)
    : options_(options), clock_(options.clock != nullptr ? options.clock : clock::Clock::Real()) {}

void SessionLeases::Bury(const std::string& instance_id) {
  if (!tombstones_.insert(instance_id).second) return;
  tombstone_order_.push_back(instance_id);
  while (tombstone_order_.size() > kMaxTombstones) {
    tombstones_.erase(tombstone_order_.front());
    tombstone_order_.pop_front();
  }
}

StatusOr<SessionLeases::Renewal> SessionLeases::Renew(const std::string& instance_id, const std::string& owner_name,
                                                      absl::Duration ttl) {
  if (instance_id.empty()) return InvalidArgumentError("instance_id: required");
  Renewal r;
  r.ttl = ttl <= absl::ZeroDuration() ? options_.default_ttl : std::clamp(ttl, options_.min_ttl, options_.max_ttl);
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  if (tombstones_.count(instance_id) > 0) {
    return FailedPreconditionError("instance_id: " + instance_id +
                                   " was replaced by a newer instance of its owner_name; its sessions are gone");
  }
  if (!owner_name.empty()) {
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->first != instance_id && it->second.owner_name == owner_name) {
        r.replaced.push_back(it->first);
        Bury(it->first);
        it = leases_.erase(it);
      } else {
        ++it;
      }
    }
  }
  Lease& lease = leases_[instance_id];
  lease.owner_name = owner_name;
  lease.expires = now + r.ttl;
  return r;
}

Status SessionLeases::Admit(const std::string& instance_id) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  if (tombstones_.count(instance_id) > 0) {
    return FailedPreconditionError("owner_instance: " + instance_id + " was replaced by a newer instance");
  }
  auto it = leases_.find(instance_id);
  if (it == leases_.end()) {
    leases_[instance_id] = Lease{"", now + options_.default_ttl};
  } else if (it->second.expires <= now) {
    // Lapsed but not yet collected: the reaper frees its sessions first.
    return FailedPreconditionError("owner_instance: the lease of " + instance_id + " lapsed");
  }
  return OkStatus();
}

std::vector<std::string> SessionLeases::TakeExpired() {
  const absl::Time now = clock_->Now();
  std::vector<std::string> expired;
  absl::MutexLock lock(&mu_);
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires <= now) {
      expired.push_back(it->first);
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
  return expired;
}

bool SessionLeases::Holds(const std::string& instance_id) {
  absl::MutexLock lock(&mu_);
  return leases_.count(instance_id) > 0;
}

size_t SessionLeases::size() {
  absl::MutexLock lock(&mu_);
  return leases_.size();
}

}  // namespace lede::model_service
