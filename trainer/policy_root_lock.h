// File: trainer/policy_root_lock.h
//
// One retraining at a time per policy root (docs/design.md §5, "trainer
// (batch retraining)"), and candidate version names that no two writers of
// one root can both take.
//
// PolicyRootLock: an exclusive flock(2) on <policy_root>/retrain.lock, taken
// without waiting. The holder writes its pid and start time into the file so
// that a refused run can name it. The kernel releases the lock when the
// holder's descriptor closes, so a killed retrainer (kill -9, OOM) never
// leaves a stale lock behind. flock is advisory and per host (and per
// file system that honours it): it serializes the retrainers of one machine
// or one shared volume, which is how lede-train runs (a CronJob with one
// policy root, scripts/run).
//
// ReserveVersionName: claims a version name by mkdir(2) of
// <policy_root>/.reserved/<name>, which is atomic: of two processes that try
// the same name one gets EEXIST and moves on to the next, even without the
// lock. The reservation lasts as long as the returned object; a writer
// saves the candidate's own directory (<policy_root>/<name> or
// candidates/<name>) before it drops the reservation, and that directory
// keeps the name taken afterwards.
//
// Thread-safety: the objects are move-only and not shared; the functions
// may be called from any thread. Two PolicyRootLocks of one root exclude
// each other also within one process (each opens its own file description).
#ifndef LEDE_TRAINER_POLICY_ROOT_LOCK_H_
#define LEDE_TRAINER_POLICY_ROOT_LOCK_H_

#include <functional>
#include <string>

#include "shared/status/status.h"

namespace lede::trainer {

inline constexpr char kRetrainLockFile[] = "retrain.lock";
inline constexpr char kReservedVersionsDir[] = ".reserved";

class PolicyRootLock {
 public:
  // Takes the lock of `policy_root` (creating the directory and the lock
  // file, mode 0644, when missing) or fails at once.
  // Errors: kAborted when another process (or PolicyRootLock) holds it; the
  // message names the root, the lock file and the holder's pid and start
  // time, and IsPolicyRootLocked() is true of it. kInternal naming the path
  // when the directory or the file cannot be made or locked.
  static StatusOr<PolicyRootLock> TryAcquire(const std::string& policy_root);

  PolicyRootLock(PolicyRootLock&& other) noexcept;
  PolicyRootLock& operator=(PolicyRootLock&& other) noexcept;
  PolicyRootLock(const PolicyRootLock&) = delete;
  PolicyRootLock& operator=(const PolicyRootLock&) = delete;
  // Releases the lock (closes the file; the file itself stays).
  ~PolicyRootLock();

  const std::string& path() const { return path_; }

 private:
  PolicyRootLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// Whether `status` is TryAcquire's "held by another retraining" error (a
// payload, not the message text, says so).
bool IsPolicyRootLocked(const Status& status);

// A reserved version name; the reservation directory is removed on
// destruction (see the file comment).
class VersionReservation {
 public:
  VersionReservation() = default;
  VersionReservation(std::string name, std::string dir) : name_(std::move(name)), dir_(std::move(dir)) {}
  VersionReservation(VersionReservation&& other) noexcept;
  VersionReservation& operator=(VersionReservation&& other) noexcept;
  VersionReservation(const VersionReservation&) = delete;
  VersionReservation& operator=(const VersionReservation&) = delete;
  ~VersionReservation();

  const std::string& name() const { return name_; }

 private:
  void Release();
  std::string name_;
  std::string dir_;  // "" = nothing to release
};

// Reserves the first name of `next_name(0)`, `next_name(1)`, ... that is
// neither reserved nor `taken` (e.g. a version or candidate directory
// exists), by an atomic mkdir of <policy_root>/.reserved/<name>; `taken` is
// asked after the mkdir succeeds. `next_name` must give distinct names.
// Errors: kInternal naming the path when the reservation directory cannot
// be made for another reason than EEXIST, or when 10000 names in a row are
// taken.
StatusOr<VersionReservation> ReserveVersionName(const std::string& policy_root,
                                                const std::function<std::string(int attempt)>& next_name,
                                                const std::function<bool(const std::string& name)>& taken);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_POLICY_ROOT_LOCK_H_
