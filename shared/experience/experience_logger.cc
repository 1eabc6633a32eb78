#include "shared/experience/experience_logger.h"

#include <unistd.h>

#include <cstdio>
#include <utility>

#include "proto/lede/v1/experience.pb.h"
#include "shared/experience/experience.h"

namespace lede::experience {
namespace {

bool KeySafeName(const std::string& s) {
  if (s.empty() || s.front() == '.') return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string DefaultWriterId(clock::Clock& clock) {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof(host), "host");
  std::string id = host;
  for (char& c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-';
    if (!ok) c = '_';
  }
  id += "-" + std::to_string(::getpid()) + "-" +
        absl::FormatTime("%Y%m%dT%H%M%SZ", clock.Now(), absl::UTCTimeZone());
  return id;
}

}  // namespace

// The shard being filled by the writer thread.
class ExperienceLogger::ShardBuilder {
 public:
  bool empty() const { return encoder_ == nullptr || encoder_->records() == 0; }
  ShardEncoder& encoder() {
    if (encoder_ == nullptr) encoder_ = std::make_unique<ShardEncoder>(magic);
    return *encoder_;
  }
  absl::Time first_record = absl::InfinitePast();
  std::string magic;
  void Reset() {
    encoder_.reset();
    first_record = absl::InfinitePast();
  }

 private:
  std::unique_ptr<ShardEncoder> encoder_;
};

StatusOr<std::unique_ptr<ExperienceLogger>> ExperienceLogger::Create(
    std::shared_ptr<storage::ObjectStore> store, ExperienceLoggerOptions o) {
  if (store == nullptr) return InvalidArgumentError("ExperienceLogger needs a store");
  if (Status s = storage::ValidateKey(o.prefix); !s.ok()) {
    return InvalidArgumentError("bad experience prefix: " + std::string(s.message()));
  }
  if (o.clock == nullptr) o.clock = clock::Clock::Real();
  if (o.writer_id.empty()) o.writer_id = DefaultWriterId(*o.clock);
  if (!KeySafeName(o.writer_id)) {
    return InvalidArgumentError("bad experience writer id \"" + o.writer_id +
                                "\" (use [A-Za-z0-9._-], not starting with '.')");
  }
  if (o.shard_magic.size() != kShardMagicSize || o.shard_suffix.size() < 2 || o.shard_suffix.front() != '.') {
    return InvalidArgumentError("ExperienceLoggerOptions: shard_magic must have 8 bytes, shard_suffix start with '.'");
  }
  if (o.queue_capacity_records <= 0 || o.max_shard_bytes <= 0 || o.max_put_attempts <= 0 ||
      o.max_shard_age <= absl::ZeroDuration() || o.initial_backoff < absl::ZeroDuration() ||
      o.retention_interval <= absl::ZeroDuration()) {
    return InvalidArgumentError(
        "ExperienceLoggerOptions: queue_capacity_records, max_shard_bytes, max_put_attempts, "
        "max_shard_age and retention_interval must be positive, initial_backoff non-negative");
  }
  if (o.retention.max_total_bytes < 0 || o.retention.max_age < absl::ZeroDuration()) {
    return InvalidArgumentError("ExperienceLoggerOptions.retention: max_total_bytes and max_age must not be negative");
  }
  if (o.retention.max_total_bytes > 0 && o.retention.max_total_bytes < o.max_shard_bytes) {
    return InvalidArgumentError("ExperienceLoggerOptions.retention.max_total_bytes (" +
                                std::to_string(o.retention.max_total_bytes) +
                                ") must be 0 or at least max_shard_bytes (" + std::to_string(o.max_shard_bytes) +
                                "): retention would delete the shard just written");
  }
  // Temporaries of writers killed mid-Put(); best
  // effort: a store that cannot list them keeps them.
  const StatusOr<storage::StaleTemporaries> stale = store->RemoveStaleTemporaries(o.prefix + "/");
  std::unique_ptr<ExperienceLogger> logger(new ExperienceLogger(std::move(store), std::move(o)));
  if (stale.ok()) {
    logger->counts_.stale_temp_files_removed.store(stale->files, std::memory_order_relaxed);
    logger->counts_.stale_temp_bytes_removed.store(stale->bytes, std::memory_order_relaxed);
  }
  logger->writer_ = std::thread([l = logger.get()] { l->Run(); });
  return logger;
}

ExperienceLogger::ExperienceLogger(std::shared_ptr<storage::ObjectStore> store, ExperienceLoggerOptions options)
    : store_(std::move(store)), options_(std::move(options)) {}

ExperienceLogger::~ExperienceLogger() { (void)Close(); }

template <typename T>
bool ExperienceLogger::Enqueue(T&& record) {
  absl::MutexLock lock(&mu_);
  if (closing_ || static_cast<int64_t>(queue_.size()) >= options_.queue_capacity_records) {
    counts_.records_dropped.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  queue_.push_back(std::forward<T>(record));
  counts_.records_logged.fetch_add(1, std::memory_order_relaxed);
  return true;  // the writer's condition is re-evaluated when mu_ is released
}

bool ExperienceLogger::Log(const lede::v1::Transition& record) { return Enqueue(record); }
bool ExperienceLogger::Log(lede::v1::Transition&& record) { return Enqueue(std::move(record)); }
bool ExperienceLogger::Log(lede::v1::RequestRecord&& record) { return Enqueue(std::move(record)); }

Status ExperienceLogger::Flush() {
  absl::MutexLock lock(&mu_);
  if (closing_) return FailedPreconditionError("ExperienceLogger::Flush() after Close()");
  const int64_t gen = ++flush_requested_gen_;
  while (flushed_gen_ < gen) done_cv_.Wait(&mu_);
  return flush_status_;
}

Status ExperienceLogger::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closing_) {
      while (!closed_) done_cv_.Wait(&mu_);
      return OkStatus();
    }
    closing_ = true;
    ++flush_requested_gen_;
  }
  if (writer_.joinable()) writer_.join();
  Status status;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    status = flush_status_;
    done_cv_.SignalAll();
  }
  Report();
  return status;
}

ExperienceLoggerCounters ExperienceLogger::counters() const {
  ExperienceLoggerCounters c;
  c.records_logged = counts_.records_logged.load(std::memory_order_relaxed);
  c.records_dropped = counts_.records_dropped.load(std::memory_order_relaxed);
  c.records_rejected = counts_.records_rejected.load(std::memory_order_relaxed);
  c.records_written = counts_.records_written.load(std::memory_order_relaxed);
  c.records_lost = counts_.records_lost.load(std::memory_order_relaxed);
  c.shards_written = counts_.shards_written.load(std::memory_order_relaxed);
  c.put_failures = counts_.put_failures.load(std::memory_order_relaxed);
  c.put_retries = counts_.put_retries.load(std::memory_order_relaxed);
  c.stale_temp_files_removed = counts_.stale_temp_files_removed.load(std::memory_order_relaxed);
  c.stale_temp_bytes_removed = counts_.stale_temp_bytes_removed.load(std::memory_order_relaxed);
  c.shards_deleted = counts_.shards_deleted.load(std::memory_order_relaxed);
  c.bytes_deleted = counts_.bytes_deleted.load(std::memory_order_relaxed);
  c.retention_failures = counts_.retention_failures.load(std::memory_order_relaxed);
  return c;
}

void ExperienceLogger::Report() {
  if (options_.on_counters) options_.on_counters(counters());
}

void ExperienceLogger::ApplyRetentionNow() {
  if (!options_.retention.enabled()) return;
  const absl::Time now = options_.clock->Now();
  last_retention_ = now;
  const StatusOr<RetentionResult> r = ApplyRetention(*store_, options_.prefix + "/", options_.retention, now, options_.shard_suffix);
  if (r.ok()) {
    counts_.shards_deleted.fetch_add(r->shards_deleted, std::memory_order_relaxed);
    counts_.bytes_deleted.fetch_add(r->bytes_deleted, std::memory_order_relaxed);
  } else {
    counts_.retention_failures.fetch_add(1, std::memory_order_relaxed);
  }
}

void ExperienceLogger::ReportPutError(const Status& error) {
  ++unreported_put_errors_;
  if (!options_.on_put_error) return;
  const absl::Time now = options_.clock->Now();
  if (now - last_put_error_report_ < options_.put_error_interval) return;
  options_.on_put_error(error, unreported_put_errors_ - 1);
  unreported_put_errors_ = 0;
  last_put_error_report_ = now;
}

void ExperienceLogger::PutShard(ShardBuilder& shard) {
  if (shard.empty()) return;
  ShardEncoder& encoder = shard.encoder();
  const int64_t n_records = encoder.records();
  char seq[32];
  std::snprintf(seq, sizeof(seq), "%08lld", static_cast<long long>(seq_++));
  const std::string key = options_.prefix + "/" +
                          absl::FormatTime("%Y-%m-%d", shard.first_record, absl::UTCTimeZone()) + "/" +
                          options_.writer_id + "-" + seq + options_.shard_suffix;
  const std::string bytes = encoder.TakeBytes();
  shard.Reset();
  absl::Duration backoff = options_.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    const Status s = store_->Put(key, bytes);
    if (s.ok()) {
      counts_.records_written.fetch_add(n_records, std::memory_order_relaxed);
      counts_.shards_written.fetch_add(1, std::memory_order_relaxed);
      if (failed_puts_since_success_ > 0) {
        if (options_.on_put_recovered) {
          PutRecovery recovery;
          recovery.key = key;
          recovery.failed_attempts = failed_puts_since_success_;
          recovery.shards_given_up = shards_given_up_since_success_;
          recovery.outage = options_.clock->Now() - first_failed_put_;
          options_.on_put_recovered(recovery);
        }
        failed_puts_since_success_ = 0;
        shards_given_up_since_success_ = 0;
      }
      if (options_.retention.enabled() &&
          options_.clock->Now() - last_retention_ >= options_.retention_interval) {
        ApplyRetentionNow();
      }
      break;
    }
    if (failed_puts_since_success_++ == 0) first_failed_put_ = options_.clock->Now();
    ReportPutError(Status(s.code(), "experience shard " + key + " (attempt " + std::to_string(attempt) + " of " +
                                        std::to_string(options_.max_put_attempts) + "): " + std::string(s.message())));
    if (attempt < options_.max_put_attempts) {
      counts_.put_retries.fetch_add(1, std::memory_order_relaxed);
      options_.clock->SleepFor(backoff);
      backoff *= 2;
      continue;
    }
    counts_.put_failures.fetch_add(1, std::memory_order_relaxed);
    counts_.records_lost.fetch_add(n_records, std::memory_order_relaxed);
    ++shards_given_up_since_success_;
    absl::MutexLock lock(&mu_);
    pending_error_ = Status(s.code(), "experience shard " + key + " given up after " +
                                          std::to_string(attempt) + " attempts: " + std::string(s.message()));
    break;
  }
  Report();
}

void ExperienceLogger::Run() {
  ShardBuilder shard;
  shard.magic = options_.shard_magic;
  std::deque<Record> batch;
  int64_t flushed = 0;
  ApplyRetentionNow();
  Report();  // the start-up sweep and first retention pass reach /metrics now
  while (true) {
    int64_t gen = 0;
    bool closing = false;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || flush_requested_gen_ > flushed || closing_;
      };
      if (shard.empty()) {
        mu_.Await(absl::Condition(&ready));
      } else {
        // Returns false once the shard is old enough to publish.
        options_.clock->AwaitWithDeadline(&mu_, absl::Condition(&ready),
                                          shard.first_record + options_.max_shard_age);
      }
      batch.swap(queue_);
      gen = flush_requested_gen_;
      closing = closing_;
    }
    for (Record& record : batch) {
      if (shard.empty()) shard.first_record = options_.clock->Now();
      const Status appended =
          std::visit([&](const auto& r) { return shard.encoder().Append(r); }, record);
      if (!appended.ok()) {
        counts_.records_rejected.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (shard.encoder().bytes() >= options_.max_shard_bytes) PutShard(shard);
    }
    batch.clear();
    if (!shard.empty() && options_.clock->Now() - shard.first_record >= options_.max_shard_age) {
      PutShard(shard);
    }
    if (gen > flushed || closing) {
      PutShard(shard);
      flushed = gen;
      absl::MutexLock lock(&mu_);
      flushed_gen_ = gen;
      flush_status_ = pending_error_;
      pending_error_ = OkStatus();
      done_cv_.SignalAll();
    }
    if (closing) break;
  }
}

}  // namespace lede::experience
