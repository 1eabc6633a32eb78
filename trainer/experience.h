// File: trainer/experience.h
//
// Experience shards (DESIGN.md §5): append-only files of lede.v1.Transition
// records, each framed as
//   uint32 little-endian payload length | uint32 little-endian CRC-32 (zlib
//   polynomial) of the payload | payload (serialized lede.v1.Transition)
// after an 8-byte file magic "LEDEXP1\n". Readable from Python with protobuf
// and zlib alone (scripts/read_experience.py). A shard is written under a
// temporary name and renamed into place when complete, so readers see whole
// shards or nothing ("complete-or-invisible").
//
// This library (lede::experience) converts between the wire record and the
// plain policy::Transition so that the DQN code never sees protobuf.
#ifndef LEDE_TRAINER_EXPERIENCE_H_
#define LEDE_TRAINER_EXPERIENCE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "policy/transition.h"
#include "shared/status/status.h"

namespace lede::v1 {
class Transition;  // proto/lede/v1/experience.pb.h
}  // namespace lede::v1

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

// Writes one shard. Records are buffered in a temporary file
// "<path>.tmp-<pid>"; Finish() flushes, fsyncs and renames it to `path`.
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
  Status Append(const policy::Transition& transition);
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
  std::string path;
  int64_t records = 0;
  std::string error;  // empty when the whole shard was read
};

struct ReadResult {
  std::vector<policy::Transition> transitions;
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
// "*.lexp.tmp-<pid>", subdirectories) are ignored.
// Errors: kNotFound if `dir` does not exist; kInvalidArgument if it is not a
// directory; kInternal if it cannot be listed.
// Thread-safety: safe to call concurrently; reads only.
StatusOr<ReadResult> ReadShards(const std::string& dir);

// Converts the plain transition to its wire record, every field:
// next_state is left empty when `transition.done`, and the proto-only fields
// (counterfactual labels, time_us) are left unset. `out` is cleared first.
void ToProto(const policy::Transition& transition, lede::v1::Transition* out);

// Converts a wire record back. An empty next_state reads as zeros.
// Errors: kInvalidArgument if state does not have kExitFeatureDim entries,
// next_state has neither 0 nor kExitFeatureDim, or phase or action is not a
// known value (PHASE_UNSPECIFIED included).
StatusOr<policy::Transition> FromProto(const lede::v1::Transition& record);

}  // namespace lede::experience

#endif  // LEDE_TRAINER_EXPERIENCE_H_
