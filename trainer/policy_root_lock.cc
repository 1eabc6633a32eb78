#include "trainer/policy_root_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <utility>

#include "absl/strings/cord.h"
#include "shared/file/file.h"

namespace lede::trainer {
namespace {

namespace fs = std::filesystem;

constexpr char kLockedPayload[] = "type.lede/trainer.PolicyRootLocked";

std::string ErrnoText(int err) { return std::strerror(err); }

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The holder's line in the lock file ("pid=<n> since=<UTC>"), "" if none.
std::string Holder(const std::string& path) {
  StatusOr<std::string> text = file::ReadFile(path);
  if (!text.ok()) return "";
  std::string line = text->substr(0, text->find('\n'));
  return line.size() > 200 ? line.substr(0, 200) : line;
}

}  // namespace

StatusOr<PolicyRootLock> PolicyRootLock::TryAcquire(const std::string& policy_root) {
  std::error_code ec;
  fs::create_directories(policy_root, ec);
  if (ec) return InternalError("policy root " + policy_root + ": cannot create it: " + ec.message());
  const std::string path = (fs::path(policy_root) / kRetrainLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return InternalError("retrain lock " + path + ": cannot open: " + ErrnoText(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err != EWOULDBLOCK) return InternalError("retrain lock " + path + ": cannot lock: " + ErrnoText(err));
    const std::string holder = Holder(path);
    Status locked(StatusCode::kAborted, "policy root " + policy_root + " is being retrained by another process (" +
                                            (holder.empty() ? std::string("holder unknown") : holder) +
                                            "; lock " + path + "); only one retraining runs at a time");
    locked.SetPayload(kLockedPayload, absl::Cord("1"));
    return locked;
  }
  // Ours: say who holds it (best effort; the lock does not depend on it).
  const std::string holder = "pid=" + std::to_string(::getpid()) + " since=" + UtcNow() + "\n";
  if (::ftruncate(fd, 0) == 0) {
    const ssize_t written = ::pwrite(fd, holder.data(), holder.size(), 0);
    (void)written;
  }
  return PolicyRootLock(fd, path);
}

PolicyRootLock::PolicyRootLock(PolicyRootLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

PolicyRootLock& PolicyRootLock::operator=(PolicyRootLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

PolicyRootLock::~PolicyRootLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

bool IsPolicyRootLocked(const Status& status) {
  return status.code() == StatusCode::kAborted && status.GetPayload(kLockedPayload).has_value();
}

VersionReservation::VersionReservation(VersionReservation&& other) noexcept
    : name_(std::move(other.name_)), dir_(std::exchange(other.dir_, std::string())) {}

VersionReservation& VersionReservation::operator=(VersionReservation&& other) noexcept {
  if (this != &other) {
    Release();
    name_ = std::move(other.name_);
    dir_ = std::exchange(other.dir_, std::string());
  }
  return *this;
}

VersionReservation::~VersionReservation() { Release(); }

void VersionReservation::Release() {
  if (!dir_.empty()) ::rmdir(dir_.c_str());
  dir_.clear();
}

StatusOr<VersionReservation> ReserveVersionName(const std::string& policy_root,
                                                const std::function<std::string(int attempt)>& next_name,
                                                const std::function<bool(const std::string& name)>& taken) {
  const fs::path root(policy_root);
  const fs::path reserved = root / kReservedVersionsDir;
  std::error_code ec;
  fs::create_directories(reserved, ec);
  if (ec) return InternalError("version reservations " + reserved.string() + ": cannot create: " + ec.message());
  constexpr int kMaxAttempts = 10000;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    const std::string name = next_name(attempt);
    const fs::path dir = reserved / name;
    if (::mkdir(dir.c_str(), 0755) != 0) {
      if (errno == EEXIST) continue;  // another writer holds it
      return InternalError("version reservation " + dir.string() + ": " + ErrnoText(errno));
    }
    VersionReservation reservation(name, dir.string());
    // Checked after the mkdir: a writer saves its version before it drops
    // its reservation, so a name whose reservation we now hold is either
    // free or visibly taken here.
    if (taken(name)) continue;
    return reservation;
  }
  return InternalError("no free version name under " + policy_root + " after " + std::to_string(kMaxAttempts) +
                       " attempts");
}

}  // namespace lede::trainer
