// File: shared/experience/retention.h
//
// Retention of experience shards (without it, experience grew
// without bound). A RetentionPolicy bounds the shards under a key prefix by
// total size and by age; ApplyRetention() deletes the oldest shards first
// until both bounds hold. ExperienceLogger applies it periodically
// (ExperienceLoggerOptions::retention); the trainer or an operator may call
// it directly. It works on any ObjectStore that reports
// ObjectInfo::modified; for S3 the recommended way is a bucket lifecycle
// rule instead (docs/serving.md "Experience and retention"), which needs no listing.
#ifndef LEDE_SHARED_EXPERIENCE_RETENTION_H_
#define LEDE_SHARED_EXPERIENCE_RETENTION_H_

#include <cstdint>
#include <string_view>

#include "absl/time/time.h"
#include "shared/status/status.h"
#include "shared/storage/object_store.h"

namespace lede::experience {

// Bounds on the shards kept under one prefix; both off by default (keep
// everything, the behaviour before retention existed).
//
// Example (keep at most 10 GiB and 7 days):
//   RetentionPolicy r;
//   r.max_total_bytes = int64_t{10} << 30;
//   r.max_age = absl::Hours(24 * 7);
struct RetentionPolicy {
  // Largest total size of the shards kept, in bytes; 0 = unbounded. The
  // oldest shards are deleted until the rest fit.
  int64_t max_total_bytes = 0;
  // Shards last modified longer than this before `now` are deleted;
  // ZeroDuration() = unbounded. A shard whose time the store does not
  // report is never deleted by age (only by size, oldest key first).
  absl::Duration max_age = absl::ZeroDuration();

  bool enabled() const { return max_total_bytes > 0 || max_age > absl::ZeroDuration(); }
};

// What one ApplyRetention() did.
struct RetentionResult {
  int64_t shards_deleted = 0;  // shards Delete()d
  int64_t bytes_deleted = 0;   // their total size, in bytes
  int64_t shards_kept = 0;     // shards left under the prefix
  int64_t bytes_kept = 0;      // their total size, in bytes
};

// Lists the shards (keys ending in `suffix`: kShardSuffix, or the request
// log's ".lreq"; other objects are neither counted nor touched) under `prefix` (a List() prefix; use a trailing '/'
// for a folder), orders them oldest first (ObjectInfo::modified, then key),
// deletes those older than policy.max_age at `now`, then the oldest of the
// rest until their total is at most policy.max_total_bytes. A disabled
// policy lists nothing and returns {}. Concurrent appliers (several
// coordinators on one store) are safe: Delete() is idempotent.
// Errors: kInvalidArgument for a bad prefix or a negative bound; the List()
// error; the first Delete() error (shards deleted before it stay deleted and
// are not counted in the returned error, only in a successful result).
// Thread-safety: as the store's.
StatusOr<RetentionResult> ApplyRetention(storage::ObjectStore& store, std::string_view prefix,
                                         const RetentionPolicy& policy, absl::Time now,
                                         std::string_view suffix = ".lexp");

}  // namespace lede::experience

#endif  // LEDE_SHARED_EXPERIENCE_RETENTION_H_
