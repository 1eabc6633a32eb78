// File: shared/experience/experience.h
//
// Experience shards (docs/design.md §5): append-only files of lede.v1.Transition
// records, each framed as
//   uint32 little-endian payload length | uint32 little-endian CRC-32 (zlib
//   polynomial) of the payload | payload (serialized lede.v1.Transition)
// after an 8-byte file magic "LEDEXP1\n". Readable from Python with protobuf
// and zlib alone (scripts/read_experience.py). A shard is written under a
// temporary name and renamed into place when complete, so readers see whole
// shards or nothing ("complete-or-invisible").
//
// This library (lede::experience) converts between the wire record and the
// plain Transition so that the DQN code never sees protobuf.
#ifndef LEDE_SHARED_EXPERIENCE_EXPERIENCE_H_
#define LEDE_SHARED_EXPERIENCE_EXPERIENCE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shared/experience/transition.h"
#include "shared/status/status.h"
#include "shared/storage/object_store.h"

namespace lede::v1 {
class Transition;  // proto/lede/v1/experience.pb.h
}  // namespace lede::v1

namespace google::protobuf {
class MessageLite;
}  // namespace google::protobuf

namespace lede::experience {

// The 8-byte file magic at the start of every shard (no terminating NUL).
inline constexpr char kShardMagic[] = "LEDEXP1\n";
inline constexpr size_t kShardMagicSize = sizeof(kShardMagic) - 1;
// File-name suffix of a complete shard; ReadShards() reads only these.
inline constexpr char kShardSuffix[] = ".lexp";
// Largest payload a record may declare, in bytes (a record is ~100 bytes). A
// larger length field is treated as corruption by readers and refused by
// writers.
inline constexpr uint32_t kMaxRecordBytes = 16u << 20;

// Encodes a shard in memory: the one implementation of the shard format's
// writing side, used by ShardWriter (files) and ExperienceLogger
// (experience_logger.h, object stores). A new encoder holds the file magic;
// each Append() adds one framed record. TakeBytes() hands over the bytes
// encoded since the last call, so a writer can stream a long shard out in
// pieces; the concatenation of every TakeBytes() is the whole shard.
// Thread-safety: not thread-safe.
//
// Example:
//   ShardEncoder enc;
//   for (const auto& r : records) LEDE_RETURN_IF_ERROR(enc.Append(r));
//   LEDE_RETURN_IF_ERROR(store.Put("exp/a.lexp", enc.TakeBytes()));
class ShardEncoder {
 public:
  // `magic` (8 bytes) starts the shard: kShardMagic for experience shards,
  // kRequestLogMagic (request_log.h) for the request log.
  explicit ShardEncoder(std::string_view magic = std::string_view(kShardMagic, kShardMagicSize));
  // Appends one framed record (any protobuf message: lede.v1.Transition in
  // experience shards, lede.v1.RequestRecord in the request log).
  // Errors: kInvalidArgument if the record exceeds kMaxRecordBytes;
  // kInternal if protobuf cannot serialize it. On error nothing is appended.
  Status Append(const google::protobuf::MessageLite& record);
  // Records appended so far.
  int64_t records() const { return records_; }
  // Bytes of the shard so far (magic + framed records), taken or not.
  int64_t bytes() const { return bytes_; }
  // Bytes encoded but not yet taken.
  size_t pending_bytes() const { return buffer_.size(); }
  // Returns the bytes encoded since the last call (the first call includes
  // the magic) and forgets them.
  std::string TakeBytes();

 private:
  std::string buffer_;
  int64_t records_ = 0;
  int64_t bytes_ = 0;
};

// Writes one shard. Records are buffered in a hidden temporary file beside
// `path` (file::AtomicFileWriter); Finish() flushes, fsyncs and renames it to
// `path`, then fsyncs the directory.
// Destroying an unfinished writer deletes the temporary file.
// Thread-safety: not thread-safe.
class ShardWriter {
 public:
  // `path` should end in kShardSuffix for ReadShards() to see the shard; its
  // directory must exist. Errors: kInternal if the temporary file cannot be
  // created.
  static StatusOr<std::unique_ptr<ShardWriter>> Create(const std::string& path);
  ~ShardWriter();
  // Appends one record (ToProto(transition), framed). Errors: kInternal on
  // I/O failure (the shard stays invisible, and every later Append() and
  // Finish() returns the same error); kInvalidArgument if the record exceeds
  // kMaxRecordBytes (nothing written); kFailedPrecondition after Finish().
  Status Append(const Transition& transition);
  // Records appended so far.
  int64_t records() const;
  // Bytes of the shard file so far: magic + framed records (the file size
  // once Finish() succeeds).
  int64_t bytes() const;
  // Makes the shard visible: flushes, fsyncs and renames the temporary file
  // to `path` (replacing any file there), then fsyncs the directory (best
  // effort). Errors: kInternal on I/O failure (the temporary file is removed
  // and the shard stays invisible); kFailedPrecondition if called twice.
  Status Finish();

 private:
  ShardWriter() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ShardReport {
  std::string path;  // the file's path, or the object key for a store
  int64_t records = 0;
  std::string error;  // empty when the whole shard was read
};

struct ReadResult {
  std::vector<Transition> transitions;
  std::vector<ShardReport> shards;  // one per file, in name order
};

// Reads every complete shard ("*.lexp") in `dir` (not recursive), in name
// order. A bad shard (wrong magic, truncated record, checksum mismatch,
// unparsable record) is reported in its ShardReport and skipped from the
// first bad record on; it is never fatal. Records before the bad one are
// kept; ShardReport::records counts the records taken from that shard, and
// its error names the record, its byte offset and the defect. A record that
// parses but fails FromProto() counts as unparsable. A length field over
// kMaxRecordBytes counts as corruption. Other files (temporary shards
// (".<shard>.tmp-<pid>-<n>", see shared/file), subdirectories) are ignored.
// Errors: kNotFound if `dir` does not exist; kInvalidArgument if it is not a
// directory; kInternal if it cannot be listed.
// Thread-safety: safe to call concurrently; reads only.
StatusOr<ReadResult> ReadShards(const std::string& dir);

// Like ReadShards() for an object store (storage/object_store.h): reads
// every object under `prefix` (a folder: a '/' is added unless it is empty
// or ends with one; recursive, so the logger's "<prefix>/<date>/" folders
// are included) whose key ends in kShardSuffix, in key order. Bad shards are
// reported and skipped as by ReadShards(), and so is an object that cannot
// be fetched (its error names the cause); ShardReport::path is the object
// key. Shards are visible only once complete (ObjectStore::Put is atomic).
// Errors: those of ObjectStore::List() (kInvalidArgument for a bad prefix,
// kUnavailable, kPermissionDenied, ...).
// Thread-safety: as safe as `store`; reads only.
StatusOr<ReadResult> ReadShardsFromStore(storage::ObjectStore& store, std::string_view prefix);

// The store walk of every shard kind: every object under `prefix` (a
// folder, as ReadShardsFromStore's) whose key is longer than and ends in
// `suffix`, in key order, fetched and given to `decode(bytes, key)`, whose
// report is appended to `reports`; an object that cannot be fetched gets a
// report "cannot read: <cause>" instead. Errors: those of ObjectStore::List().
Status ReadStoreShards(storage::ObjectStore& store, std::string_view prefix, std::string_view suffix,
                       const std::function<ShardReport(std::string_view bytes, const std::string& key)>& decode,
                       std::vector<ShardReport>* reports);

// Decodes the shard `bytes` (a whole shard), appending its good records to
// `out`; the report's path is `name`. The checks and error texts are those
// of ReadShards().
ShardReport DecodeShard(std::string_view bytes, const std::string& name,
                        std::vector<Transition>* out);

// The framing of every shard kind: checks `magic` (what_kind, e.g. "an
// experience shard", names the kind in the error), then calls `take(index, payload)` for
// each record whose length and CRC-32 are good, in order, until the first
// bad one or `take` returns an error text (non-empty: the record is
// counted bad with that text). The report counts the records taken; its
// error names the first bad record, its byte offset and the defect.
ShardReport DecodeFrames(std::string_view bytes, const std::string& name, std::string_view magic,
                         const std::string& what_kind,
                         const std::function<std::string(int64_t index, std::string_view payload)>& take);

// Converts the plain transition to its wire record, every field:
// next_state is left empty when `transition.done`, and the proto-only fields
// (counterfactual labels, time_us) are left unset. `out` is cleared first.
void ToProto(const Transition& transition, lede::v1::Transition* out);

// Converts a wire record back. An empty next_state reads as zeros.
// A record of lede-features-v3 or v4 (13 or 14 features, logged
// before the load feature or the cost profile) reads with what it lacks
// 0 (load 1, costs unknown).
// Errors: kInvalidArgument if state has neither kExitFeatureDim nor
// 13 or 14 entries, next_state has neither 0 nor as many as
// state, or phase or action is not a known value (PHASE_UNSPECIFIED
// included).
StatusOr<Transition> FromProto(const lede::v1::Transition& record);

}  // namespace lede::experience

#endif  // LEDE_SHARED_EXPERIENCE_EXPERIENCE_H_
