#include "services/coordinator/replica_set.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

#include <grpcpp/create_channel.h>

#include "shared/rpc/server.h"

namespace lede::coordinator {
namespace {

Status CheckHostPort(const std::string& entry, const std::string& address) {
  const size_t colon = address.rfind(':');
  if (address.empty() || colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return InvalidArgumentError("replicas: '" + entry + "': want host:port, got '" + address + "'");
  }
  const std::string port = address.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 || std::stoi(port) < 1 ||
      std::stoi(port) > 65535) {
    return InvalidArgumentError("replicas: '" + entry + "': port '" + port + "' is not in 1..65535");
  }
  return OkStatus();
}

// The addresses `name` resolves to, as gRPC targets without the port
// ("10.0.0.7", "[fd00::7]"); empty when it resolves to nothing.
std::set<std::string> Resolve(const std::string& name) {
  std::set<std::string> out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, buf, sizeof(buf));
      out.insert(buf);
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, buf, sizeof(buf));
      out.insert("[" + std::string(buf) + "]");
    }
  }
  freeaddrinfo(res);
  return out;
}

}  // namespace

StatusOr<std::vector<ReplicaTarget>> ParseReplicaTargets(const std::string& list) {
  std::vector<ReplicaTarget> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string entry = list.substr(start, comma - start);
    start = comma + 1;
    if (entry.empty()) {
      if (list.empty()) break;
      return InvalidArgumentError("replicas: an empty entry in '" + list + "'");
    }
    const size_t plus = entry.find('+');
    ReplicaTarget t;
    t.verifier = entry.substr(0, plus);
    t.drafter = plus == std::string::npos ? t.verifier : entry.substr(plus + 1);
    if (Status s = CheckHostPort(entry, t.verifier); !s.ok()) return s;
    if (Status s = CheckHostPort(entry, t.drafter); !s.ok()) return s;
    out.push_back(std::move(t));
  }
  return out;
}

// ------------------------------------------------------------------ Replica

Replica::Replica(ReplicaTarget target, const ReplicaSetOptions& options)
    : target_(std::move(target)), fused_rounds_(target_.drafter == target_.verifier) {
  auto credentials = options.credentials ? options.credentials : grpc::InsecureChannelCredentials();
  verifier_channel_ = options.token.Channel(target_.verifier, credentials, options.channel_args);
  drafter_channel_ = target_.drafter == target_.verifier
                         ? verifier_channel_
                         : options.token.Channel(target_.drafter, credentials, options.channel_args);
  verifier_ = lede::v1::Verifier::NewStub(verifier_channel_);
  drafter_ = lede::v1::Drafter::NewStub(drafter_channel_);
  SessionLeaseOptions lo = options.lease;
  lo.on_renewed = [this](const lede::v1::RenewLeaseResponse& r) {
    UpdateLoad(r.n_slots(), r.n_free_slots(), r.n_waiting(), r.n_sessions());
    if (on_load_) on_load_();
  };
  lease_ = std::make_unique<SessionLease>(verifier_.get(), std::move(lo));
}

Replica::~Replica() { lease_->Stop(); }

void Replica::UpdateLoad(int64_t n_slots, int64_t n_free, int64_t n_waiting, int64_t n_mine) {
  absl::MutexLock lock(&load_mu_);
  have_load_ = n_slots > 0;  // a verifier without load reports says 0
  free_at_report_ = n_free - n_waiting;
  mine_at_report_ = n_mine;
  slots_at_report_ = n_slots;
  in_use_at_report_ = n_slots - n_free;
}

std::pair<int64_t, int64_t> Replica::ReportedSlots() const {
  absl::MutexLock lock(&load_mu_);
  return {slots_at_report_, in_use_at_report_};
}

int64_t Replica::EstimatedFreeSlots() const {
  absl::MutexLock lock(&load_mu_);
  if (!have_load_) return (int64_t{1} << 30) - sessions_.load();
  return free_at_report_ - (sessions_.load() - mine_at_report_);
}

bool Replica::Connected(std::chrono::system_clock::time_point deadline) const {
  return verifier_channel_->WaitForConnected(deadline) &&
         (drafter_channel_ == verifier_channel_ || drafter_channel_->WaitForConnected(deadline));
}

// --------------------------------------------------------------- ReplicaSet

StatusOr<std::unique_ptr<ReplicaSet>> ReplicaSet::Create(ReplicaSetOptions options) {
  if (options.targets.empty() && options.dns_name.empty()) {
    return InvalidArgumentError("replicas: no replica (give --replicas, --replica-dns or --verifier)");
  }
  for (const ReplicaTarget& t : options.targets) {
    if (Status s = CheckHostPort(t.verifier, t.verifier); !s.ok()) return s;
    if (Status s = CheckHostPort(t.drafter, t.drafter); !s.ok()) return s;
  }
  if (!options.dns_name.empty() && (options.verifier_port < 1 || options.verifier_port > 65535 ||
                                    options.drafter_port < 0 || options.drafter_port > 65535)) {
    return InvalidArgumentError("replica ports: verifier in 1..65535, drafter in 0..65535");
  }
  std::unique_ptr<ReplicaSet> set(new ReplicaSet(std::move(options)));
  for (const ReplicaTarget& t : set->options_.targets) set->Add(t);
  if (!set->options_.dns_name.empty()) {
    set->Refresh();
    set->refresher_ = std::thread([s = set.get()] {
      absl::MutexLock lock(&s->mu_);
      while (!s->stopping_) {
        s->mu_.AwaitWithTimeout(absl::Condition(&s->stopping_), s->options_.refresh_interval);
        if (s->stopping_) break;
        s->mu_.Unlock();
        s->Refresh();
        s->mu_.Lock();
      }
    });
  }
  return set;
}

ReplicaSet::~ReplicaSet() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (refresher_.joinable()) refresher_.join();
}

std::shared_ptr<Replica> ReplicaSet::Add(const ReplicaTarget& target) {
  auto replica = std::make_shared<Replica>(target, options_);
  if (options_.on_slots) {
    replica->set_on_load([this] {
      int64_t capacity = 0, in_use = 0;
      for (const std::shared_ptr<Replica>& r : All()) {
        const auto [slots, used] = r->ReportedSlots();
        capacity += slots;
        in_use += used;
      }
      options_.on_slots(capacity, in_use);
    });
  }
  if (options_.start_leases) replica->StartLease();  // its first renewal reports the load
  absl::MutexLock lock(&mu_);
  replicas_.push_back(replica);
  failed_at_.push_back(absl::InfinitePast());
  rpc::LogEvent("info", "replica_added", {{"verifier", target.verifier}, {"drafter", target.drafter}});
  return replica;
}

size_t ReplicaSet::Refresh() {
  if (options_.dns_name.empty()) return All().size();
  const std::set<std::string> hosts = Resolve(options_.dns_name);
  std::set<std::string> wanted;  // verifier targets from DNS
  std::vector<ReplicaTarget> to_add;
  for (const std::string& host : hosts) {
    ReplicaTarget t;
    t.verifier = host + ":" + std::to_string(options_.verifier_port);
    t.drafter = options_.drafter_port == 0 ? t.verifier : host + ":" + std::to_string(options_.drafter_port);
    wanted.insert(t.verifier);
    to_add.push_back(std::move(t));
  }
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < replicas_.size();) {
      const ReplicaTarget& t = replicas_[i]->target();
      const bool is_static = std::find(options_.targets.begin(), options_.targets.end(), t) != options_.targets.end();
      if (!is_static && wanted.count(t.verifier) == 0) {
        rpc::LogEvent("info", "replica_removed", {{"verifier", t.verifier}, {"reason", "not in DNS"}});
        replicas_.erase(replicas_.begin() + static_cast<std::ptrdiff_t>(i));
        failed_at_.erase(failed_at_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    to_add.erase(std::remove_if(to_add.begin(), to_add.end(),
                                [&](const ReplicaTarget& t) {
                                  return std::any_of(replicas_.begin(), replicas_.end(),
                                                     [&](const auto& r) { return r->target() == t; });
                                }),
                 to_add.end());
  }
  for (const ReplicaTarget& t : to_add) Add(t);
  return All().size();
}

std::vector<std::shared_ptr<Replica>> ReplicaSet::Candidates() {
  absl::MutexLock lock(&mu_);
  const size_t n = replicas_.size();
  const absl::Time now = absl::Now();
  const uint64_t rotation = rotation_++;
  std::vector<std::tuple<bool, int64_t, int64_t, size_t>> keys;  // failed, -free, sessions, rotated index
  keys.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const bool failed = now - failed_at_[i] < options_.failure_backoff;
    keys.emplace_back(failed, -replicas_[i]->EstimatedFreeSlots(), replicas_[i]->sessions(),
                      (i + n - rotation % n) % n);  // n >= 1 inside the loop
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  std::vector<std::shared_ptr<Replica>> out;
  out.reserve(n);
  for (size_t i : order) out.push_back(replicas_[i]);
  return out;
}

void ReplicaSet::MarkFailed(const Replica& replica) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < replicas_.size(); ++i) {
    if (replicas_[i].get() == &replica) failed_at_[i] = absl::Now();
  }
}

std::vector<std::shared_ptr<Replica>> ReplicaSet::All() const {
  absl::MutexLock lock(&mu_);
  return replicas_;
}

}  // namespace lede::coordinator
