// File: shared/experience/experience_logger.h
//
// ExperienceLogger: the serving side of experience logging (docs/design.md §3:
// coordinator --experience shards--> object store <--reads-- trainer; §5).
// Callers Log() lede.v1.Transition records from the request path; a
// background thread batches them into shards (the format of experience.h,
// encoded by ShardEncoder) and Put()s each shard to an ObjectStore under
//   <prefix>/<UTC date YYYY-MM-DD>/<writer_id>-<seq, 8 digits>.lexp
// (date of the shard's first record; seq counts from 00000000 per logger).
// A shard is invisible until complete because ObjectStore::Put() is atomic,
// so a crash loses at most the buffered records and never leaves a partial
// shard. The trainer reads them back with ReadShardsFromStore().
//
// Disk hygiene: Create() first removes the temporary files that
// writers killed in the middle of a Put() left under <prefix>/
// (ObjectStore::RemoveStaleTemporaries(); counted in
// stale_temp_files_removed). With options.retention enabled the writer
// thread applies it (retention.h: oldest shards under <prefix>/ deleted
// first, whoever wrote them) when it starts and after a shard is Put() once
// retention_interval has passed since the last time (on `clock`).
//
// Ownership: the logger shares ownership of the store. Only the writer
// thread encodes and Put()s; Log() only enqueues.
#ifndef LEDE_SHARED_EXPERIENCE_EXPERIENCE_LOGGER_H_
#define LEDE_SHARED_EXPERIENCE_EXPERIENCE_LOGGER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <variant>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/lede/v1/experience.pb.h"  // the queue holds records by value
#include "shared/clock/clock.h"
#include "shared/experience/retention.h"
#include "shared/status/status.h"
#include "shared/storage/object_store.h"

namespace lede::experience {

// Counters of one logger since it was created, for /metrics (docs/design.md §6).
// Invariant once Close() returns:
//   records_logged = records_written + records_lost + records_rejected
// (records_dropped were never logged).
struct ExperienceLoggerCounters {
  int64_t records_logged = 0;    // accepted by Log() into the queue
  int64_t records_dropped = 0;   // refused by Log(): queue full or logger closed
  int64_t records_rejected = 0;  // logged but not encodable (over kMaxRecordBytes)
  int64_t records_written = 0;   // in shards that were Put() successfully
  int64_t records_lost = 0;      // in shards given up after every Put() attempt failed
  int64_t shards_written = 0;    // shards Put() successfully
  int64_t put_failures = 0;      // shards given up after max_put_attempts failures
  int64_t put_retries = 0;       // failed Put() attempts that were retried
  int64_t stale_temp_files_removed = 0;  // temporaries of dead writers removed by Create()
  int64_t stale_temp_bytes_removed = 0;  // their size, in bytes
  int64_t shards_deleted = 0;            // shards deleted by retention
  int64_t bytes_deleted = 0;             // their size, in bytes
  int64_t retention_failures = 0;        // retention passes that failed (List/Delete error)
};

// What on_put_recovered reports: the store took a shard again after failed
// Put() attempts.
struct PutRecovery {
  std::string key;                  // the shard that was written
  int64_t failed_attempts = 0;      // failed Put() attempts since the last success (retried or not)
  int64_t shards_given_up = 0;      // shards given up (records lost) in that time
  absl::Duration outage;            // from the first of those failures to now (on `clock`)
};

// Example:
//   ExperienceLoggerOptions o;
//   o.prefix = "experience/stories15M";
//   o.max_shard_bytes = 64 << 20;
//   o.max_shard_age = absl::Seconds(60);
//   o.on_counters = [&](const ExperienceLoggerCounters& c) { metrics.Mirror(c); };
struct ExperienceLoggerOptions {
  // Key prefix (folder) in the store, a valid key; shards go under
  // "<prefix>/<date>/".
  std::string prefix = "experience";
  // The shard kind: its 8-byte magic and file-name suffix. Experience
  // shards by default; the request log (request_log.h) sets its own, and
  // retention then counts only shards of this suffix.
  std::string shard_magic = "LEDEXP1\n";
  std::string shard_suffix = ".lexp";
  // Names this writer's shards; must be unique among concurrent writers and
  // across restarts (seq restarts at 0). Default ("" ) is
  // "<hostname>-<pid>-<start time, UTC, YYYYMMDDTHHMMSSZ>". Key-safe
  // characters only ([A-Za-z0-9._-], not starting with '.').
  std::string writer_id;
  // Records the queue holds before Log() starts dropping; bounds memory
  // (a record is ~100-200 bytes) and decouples serving from the store.
  int64_t queue_capacity_records = 1 << 16;
  // A shard is Put() once its encoded size reaches this many bytes; bigger
  // shards mean fewer objects, smaller ones less data at risk in a crash.
  int64_t max_shard_bytes = 16 << 20;
  // ... or once its first record is this old (on `clock`), so that a quiet
  // logger still publishes what it has within about this long.
  absl::Duration max_shard_age = absl::Seconds(60);
  // Put() attempts per shard before it is given up (counted, records lost).
  int max_put_attempts = 4;
  // Sleep after the first failed attempt; doubles after each further one.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  // Bounds on the shards under <prefix>/ (retention.h); off by default.
  // max_total_bytes, when set, must be at least max_shard_bytes.
  RetentionPolicy retention;
  // Least time between two retention passes (on `clock`); a pass lists the
  // whole prefix, so not after every shard.
  absl::Duration retention_interval = absl::Minutes(1);
  // Called on the writer thread with a snapshot after every shard attempt
  // (written or given up) and retention pass, and from Close(). Must be quick and must not call
  // Flush() or Close() (deadlock); counters() is fine.
  std::function<void(const ExperienceLoggerCounters&)> on_counters;
  // Called on the writer thread when a Put() attempt fails, with the error
  // (naming the shard) and how many failed attempts were not reported since
  // the last call: the first failure at once, then at most one call per
  // put_error_interval (on `clock`), so a store that is down for an hour
  // logs a line every interval, not one per attempt.
  std::function<void(const Status& error, int64_t unreported_failures)> on_put_error;
  absl::Duration put_error_interval = absl::Seconds(10);
  // Called on the writer thread once when a Put() succeeds after one or more
  // failed attempts (the store recovered), never otherwise; not rate-limited
  // (one call per outage). With on_put_error it brackets an outage in the
  // log: a line when the store fails, a line when it is back.
  std::function<void(const PutRecovery&)> on_put_recovered;
  // Time source of the shard age, the retry backoff, the shard's date and
  // the default writer id (borrowed; must outlive the logger). nullptr =
  // Clock::Real(); tests pass a FakeClock.
  clock::Clock* clock = nullptr;
};

// Thread-safety: Log(), counters(), Flush() and Close() may be called from
// any thread concurrently.
class ExperienceLogger {
 public:
  // Removes stale temporary files under <prefix>/ (see the file comment;
  // a failure there is not an error, the files stay), then starts the
  // writer thread. Errors: kInvalidArgument if `store` is null, prefix or
  // writer_id is not key-safe, a size, capacity, attempt count or duration
  // is not positive, or a retention bound is negative or max_total_bytes
  // is below max_shard_bytes.
  static StatusOr<std::unique_ptr<ExperienceLogger>> Create(std::shared_ptr<storage::ObjectStore> store,
                                                            ExperienceLoggerOptions options);
  // Close()s (writes what is buffered).
  ~ExperienceLogger();
  ExperienceLogger(const ExperienceLogger&) = delete;
  ExperienceLogger& operator=(const ExperienceLogger&) = delete;

  // Enqueues one record (copied) and returns true; never blocks on I/O
  // (holds a mutex for the push only). Returns false, counting the record in
  // records_dropped, when the queue holds queue_capacity_records or the
  // logger is closed.
  bool Log(const lede::v1::Transition& record);
  bool Log(lede::v1::Transition&& record);
  // A request-log record (request_log.h); same queue, same guarantees.
  bool Log(lede::v1::RequestRecord&& record);

  // Blocks until every record logged before the call is in a shard that was
  // Put() or given up, starting a new shard afterwards. Returns OK, or the
  // last Put() error of a shard given up since the previous Flush() (the
  // records are counted in records_lost), or kFailedPrecondition after
  // Close().
  Status Flush();

  // Writes what is queued and buffered (as Flush()), stops the writer thread
  // and refuses later records. Idempotent; the second call returns OK.
  Status Close();

  // A snapshot of the counters (each field is read atomically; the set is
  // not one consistent cut while the writer runs).
  ExperienceLoggerCounters counters() const;

  // The key prefix and writer id in use (writer_id resolved).
  const std::string& prefix() const { return options_.prefix; }
  const std::string& writer_id() const { return options_.writer_id; }

 private:
  struct Atomics {
    std::atomic<int64_t> records_logged{0}, records_dropped{0}, records_rejected{0}, records_written{0},
        records_lost{0}, shards_written{0}, put_failures{0}, put_retries{0}, stale_temp_files_removed{0},
        stale_temp_bytes_removed{0}, shards_deleted{0}, bytes_deleted{0}, retention_failures{0};
  };
  class ShardBuilder;

  ExperienceLogger(std::shared_ptr<storage::ObjectStore> store, ExperienceLoggerOptions options);
  template <typename T>
  bool Enqueue(T&& record);
  void Run();
  // on_put_error, rate-limited (writer thread).
  void ReportPutError(const Status& error);
  // Puts the current shard, if it has records, with retries.
  void PutShard(ShardBuilder& shard);
  void Report();
  // Applies options_.retention (writer thread only).
  void ApplyRetentionNow();

  const std::shared_ptr<storage::ObjectStore> store_;
  ExperienceLoggerOptions options_;
  Atomics counts_;

  mutable absl::Mutex mu_;
  // The writer waits on mu_ (absl::Condition) for records, a flush or
  // closing; Flush() and Close() wait on done_cv_ for flushed_gen_.
  absl::CondVar done_cv_;
  using Record = std::variant<lede::v1::Transition, lede::v1::RequestRecord>;
  std::deque<Record> queue_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t flush_requested_gen_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t flushed_gen_ ABSL_GUARDED_BY(mu_) = 0;
  Status flush_status_ ABSL_GUARDED_BY(mu_);    // result of the last completed flush
  Status pending_error_ ABSL_GUARDED_BY(mu_);   // last give-up since the last flush
  int64_t seq_ = 0;                             // writer thread only
  absl::Time last_retention_ = absl::InfinitePast();  // writer thread only
  absl::Time last_put_error_report_ = absl::InfinitePast();  // writer thread only
  int64_t unreported_put_errors_ = 0;                         // writer thread only
  // The current outage (writer thread only): failed attempts and shards
  // given up since the last successful Put(), and when the first failed.
  int64_t failed_puts_since_success_ = 0;
  int64_t shards_given_up_since_success_ = 0;
  absl::Time first_failed_put_ = absl::InfinitePast();
  std::thread writer_;
};

}  // namespace lede::experience

#endif  // LEDE_SHARED_EXPERIENCE_EXPERIENCE_LOGGER_H_
