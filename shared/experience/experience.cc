#include "shared/experience/experience.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <utility>

#include "proto/lede/v1/experience.pb.h"
#include "shared/file/file.h"
#include "shared/status/status_macros.h"

namespace lede::experience {
namespace {

namespace fs = std::filesystem;

constexpr size_t kRecordHeaderSize = 8;            // length + crc32
constexpr size_t kWriteBufferBytes = 1u << 20;     // flush threshold of ShardWriter

void PutUint32Le(uint32_t v, char* out) {
  out[0] = static_cast<char>(v & 0xff);
  out[1] = static_cast<char>((v >> 8) & 0xff);
  out[2] = static_cast<char>((v >> 16) & 0xff);
  out[3] = static_cast<char>((v >> 24) & 0xff);
}

uint32_t GetUint32Le(const char* in) {
  const auto* b = reinterpret_cast<const unsigned char*>(in);
  return static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8) |
         (static_cast<uint32_t>(b[2]) << 16) | (static_cast<uint32_t>(b[3]) << 24);
}

// zlib's CRC-32 (the same as Python's zlib.crc32).
uint32_t Crc32(const char* data, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(n));
  return static_cast<uint32_t>(crc);
}

// Reads one shard file, appending its good records to `out`.
ShardReport ReadShard(const std::string& path, std::vector<Transition>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ShardReport report;
    report.path = path;
    report.error = "cannot open: " + std::string(std::strerror(errno));
    return report;
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    ShardReport report;
    report.path = path;
    report.error = "read error";
    return report;
  }
  return DecodeShard(bytes, path, out);
}

}  // namespace

// ---------------------------------------------------------------------------
// Encoding and decoding of one shard

ShardEncoder::ShardEncoder(std::string_view magic)
    : buffer_(magic), bytes_(static_cast<int64_t>(magic.size())) {}

Status ShardEncoder::Append(const google::protobuf::MessageLite& record) {
  const size_t length = record.ByteSizeLong();
  if (length > kMaxRecordBytes) {
    return InvalidArgumentError("experience record of " + std::to_string(length) +
                                " bytes exceeds kMaxRecordBytes");
  }
  const size_t start = buffer_.size();
  buffer_.resize(start + kRecordHeaderSize + length);
  char* header = buffer_.data() + start;
  char* payload = header + kRecordHeaderSize;
  if (!record.SerializeToArray(payload, static_cast<int>(length))) {
    buffer_.resize(start);
    return InternalError("cannot serialize " + record.GetTypeName());
  }
  PutUint32Le(static_cast<uint32_t>(length), header);
  PutUint32Le(Crc32(payload, length), header + 4);
  ++records_;
  bytes_ += static_cast<int64_t>(kRecordHeaderSize + length);
  return OkStatus();
}

std::string ShardEncoder::TakeBytes() {
  std::string out;
  out.swap(buffer_);
  return out;
}

ShardReport DecodeFrames(std::string_view bytes, const std::string& name, std::string_view magic,
                         const std::string& what_kind,
                         const std::function<std::string(int64_t index, std::string_view payload)>& take) {
  ShardReport report;
  report.path = name;
  if (bytes.size() < magic.size() || std::memcmp(bytes.data(), magic.data(), magic.size()) != 0) {
    report.error = "bad file magic (not " + what_kind + ")";
    return report;
  }
  uint64_t offset = magic.size();
  for (int64_t index = 0;; ++index) {
    const std::string where =
        "record " + std::to_string(index) + " at offset " + std::to_string(offset) + ": ";
    const uint64_t left = bytes.size() - offset;
    if (left == 0) break;  // clean end of shard
    if (left < kRecordHeaderSize) {
      report.error = where + "truncated record header";
      break;
    }
    const char* header = bytes.data() + offset;
    const uint32_t length = GetUint32Le(header);
    const uint32_t crc = GetUint32Le(header + 4);
    if (length > kMaxRecordBytes) {
      report.error = where + "record length " + std::to_string(length) + " exceeds " +
                     std::to_string(kMaxRecordBytes) + " (corrupt)";
      break;
    }
    const uint64_t available = left - kRecordHeaderSize;
    if (available < length) {
      report.error = where + "truncated payload (" + std::to_string(available) + " of " +
                     std::to_string(length) + " bytes)";
      break;
    }
    const char* payload = header + kRecordHeaderSize;
    if (Crc32(payload, length) != crc) {
      report.error = where + "checksum mismatch";
      break;
    }
    if (std::string bad = take(index, std::string_view(payload, length)); !bad.empty()) {
      report.error = where + bad;
      break;
    }
    ++report.records;
    offset += kRecordHeaderSize + length;
  }
  return report;
}

ShardReport DecodeShard(std::string_view bytes, const std::string& name,
                        std::vector<Transition>* out) {
  lede::v1::Transition record;
  return DecodeFrames(bytes, name, std::string_view(kShardMagic, kShardMagicSize), "an experience shard",
                      [&](int64_t, std::string_view payload) -> std::string {
                        if (!record.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
                          return "unparsable lede.v1.Transition";
                        }
                        StatusOr<Transition> t = FromProto(record);
                        if (!t.ok()) return "invalid lede.v1.Transition: " + std::string(t.status().message());
                        out->push_back(*std::move(t));
                        return "";
                      });
}

// ---------------------------------------------------------------------------
// ShardWriter

struct ShardWriter::Impl {
  std::string path;
  std::unique_ptr<file::AtomicFileWriter> out;  // null once finished
  ShardEncoder encoder;  // framed records not yet written to `out`
  bool finished = false;  // Finish() was called (successfully or not)
  Status error;           // sticky I/O error

  Status Flush() {
    if (encoder.pending_bytes() == 0) return OkStatus();
    return out->Append(encoder.TakeBytes());
  }
  void Discard() { out.reset(); }  // removes the temporary file
};

StatusOr<std::unique_ptr<ShardWriter>> ShardWriter::Create(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  LEDE_ASSIGN_OR_RETURN(impl->out, file::AtomicFileWriter::Create(path));
  std::unique_ptr<ShardWriter> writer(new ShardWriter());
  writer->impl_ = std::move(impl);
  return writer;
}

ShardWriter::~ShardWriter() {
  if (impl_ != nullptr) impl_->Discard();
}

Status ShardWriter::Append(const Transition& transition) {
  Impl& w = *impl_;
  if (w.finished) return FailedPreconditionError("Append() after Finish() on " + w.path);
  if (!w.error.ok()) return w.error;
  lede::v1::Transition record;
  ToProto(transition, &record);
  LEDE_RETURN_IF_ERROR(w.encoder.Append(record));
  if (w.encoder.pending_bytes() >= kWriteBufferBytes) {
    w.error = w.Flush();
    return w.error;
  }
  return OkStatus();
}

int64_t ShardWriter::records() const { return impl_->encoder.records(); }

int64_t ShardWriter::bytes() const { return impl_->encoder.bytes(); }

Status ShardWriter::Finish() {
  Impl& w = *impl_;
  if (w.finished) return FailedPreconditionError("Finish() called twice on " + w.path);
  w.finished = true;
  Status s = w.error;
  if (s.ok()) s = w.Flush();
  if (s.ok()) s = w.out->Commit();
  w.Discard();
  return s;
}

// ---------------------------------------------------------------------------
// Reading

StatusOr<ReadResult> ReadShards(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec && st.type() != fs::file_type::not_found) {
    return InternalError("cannot stat " + dir + ": " + ec.message());
  }
  if (!fs::exists(st)) return NotFoundError("experience directory not found: " + dir);
  if (!fs::is_directory(st)) return InvalidArgumentError("not a directory: " + dir);

  std::vector<std::string> paths;
  fs::directory_iterator it(dir, ec);
  if (ec) return InternalError("cannot list " + dir + ": " + ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    const fs::path& p = it->path();
    std::error_code type_ec;
    if (p.extension() == kShardSuffix && it->is_regular_file(type_ec)) {
      paths.push_back(p.string());
    }
  }
  if (ec) return InternalError("cannot list " + dir + ": " + ec.message());
  std::sort(paths.begin(), paths.end());

  ReadResult result;
  for (const std::string& path : paths) {
    result.shards.push_back(ReadShard(path, &result.transitions));
  }
  return result;
}

Status ReadStoreShards(storage::ObjectStore& store, std::string_view prefix, std::string_view suffix,
                       const std::function<ShardReport(std::string_view bytes, const std::string& key)>& decode,
                       std::vector<ShardReport>* reports) {
  std::string folder(prefix);
  if (!folder.empty() && folder.back() != '/') folder += '/';
  LEDE_ASSIGN_OR_RETURN(std::vector<storage::ObjectInfo> objects, store.List(folder));
  std::sort(objects.begin(), objects.end(),
            [](const storage::ObjectInfo& a, const storage::ObjectInfo& b) { return a.key < b.key; });
  for (const storage::ObjectInfo& o : objects) {
    if (o.key.size() <= suffix.size() || o.key.compare(o.key.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    StatusOr<std::string> bytes = store.Get(o.key);
    if (!bytes.ok()) {
      ShardReport report;
      report.path = o.key;
      report.error = "cannot read: " + bytes.status().ToString();
      reports->push_back(std::move(report));
      continue;
    }
    reports->push_back(decode(*bytes, o.key));
  }
  return OkStatus();
}

StatusOr<ReadResult> ReadShardsFromStore(storage::ObjectStore& store, std::string_view prefix) {
  ReadResult result;
  LEDE_RETURN_IF_ERROR(ReadStoreShards(
      store, prefix, kShardSuffix,
      [&result](std::string_view bytes, const std::string& key) { return DecodeShard(bytes, key, &result.transitions); },
      &result.shards));
  return result;
}

// ---------------------------------------------------------------------------
// Conversions

void ToProto(const Transition& t, lede::v1::Transition* out) {
  out->Clear();
  out->mutable_state()->Add(t.state.begin(), t.state.end());
  out->set_action(t.action == speculation::Action::kExit ? lede::v1::EXIT_ACTION_EXIT
                                                   : lede::v1::EXIT_ACTION_CONTINUE);
  out->set_reward(t.reward);
  if (!t.done) out->mutable_next_state()->Add(t.next_state.begin(), t.next_state.end());
  out->set_done(t.done);
  switch (t.phase) {
    case speculation::Phase::kExitLayer: out->set_phase(lede::v1::PHASE_EXIT_LAYER); break;
    case speculation::Phase::kDraftLength: out->set_phase(lede::v1::PHASE_DRAFT_LENGTH); break;
    case speculation::Phase::kRoundStart: out->set_phase(lede::v1::PHASE_ROUND_START); break;
  }
  out->set_layer(t.layer);
  out->set_n_layers(t.n_layers);
  out->set_draft_pos(t.draft_pos);
  out->set_request_id(t.request_id);
  out->set_round_index(t.round_index);
  out->set_decision_index(t.decision_index);
  out->set_policy_version(t.policy_version);
  out->set_model_fingerprint(t.model_fingerprint);
  out->set_reward_cost_model(t.reward_cost_model);
}

StatusOr<Transition> FromProto(const lede::v1::Transition& r) {
  Transition t;
  // Shards logged before the load feature (lede-features-v3, 13 features),
  // before the cost profile (v4, 14) or before the temperature (v5, 17)
  // hold a prefix of today's (speculation::kOlderExitFeatureSpecs); what
  // they lack reads as 0 (load 1, costs unknown, greedy: a v5 shard does not
  // say which requests were sampled).
  bool readable = r.state_size() == speculation::kExitFeatureDim;
  std::string older;  // newest first
  for (const speculation::OlderFeatureSpec& spec : speculation::kOlderExitFeatureSpecs) {
    readable = readable || r.state_size() == spec.dim;
    older = std::to_string(spec.dim) + " of " + spec.name + (older.empty() ? "" : ", ") + older;
  }
  if (!readable) {
    return InvalidArgumentError("state has " + std::to_string(r.state_size()) + " features, expected " +
                                std::to_string(speculation::kExitFeatureDim) + " (or " + older + ")");
  }
  std::copy(r.state().begin(), r.state().end(), t.state.begin());
  if (r.next_state_size() != 0 && r.next_state_size() != r.state_size()) {
    return InvalidArgumentError("next_state has " + std::to_string(r.next_state_size()) +
                                " features, expected 0 or " + std::to_string(r.state_size()) + " as state");
  }
  std::copy(r.next_state().begin(), r.next_state().end(), t.next_state.begin());
  switch (r.action()) {
    case lede::v1::EXIT_ACTION_CONTINUE: t.action = speculation::Action::kContinue; break;
    case lede::v1::EXIT_ACTION_EXIT: t.action = speculation::Action::kExit; break;
    default: return InvalidArgumentError("unknown action " + std::to_string(r.action()));
  }
  switch (r.phase()) {
    case lede::v1::PHASE_EXIT_LAYER: t.phase = speculation::Phase::kExitLayer; break;
    case lede::v1::PHASE_DRAFT_LENGTH: t.phase = speculation::Phase::kDraftLength; break;
    case lede::v1::PHASE_ROUND_START: t.phase = speculation::Phase::kRoundStart; break;
    default: return InvalidArgumentError("unknown phase " + std::to_string(r.phase()));
  }
  t.reward = r.reward();
  t.done = r.done();
  t.layer = r.layer();
  t.n_layers = r.n_layers();
  t.draft_pos = r.draft_pos();
  t.request_id = r.request_id();
  t.round_index = r.round_index();
  t.decision_index = r.decision_index();
  t.policy_version = r.policy_version();
  t.model_fingerprint = r.model_fingerprint();
  t.reward_cost_model = r.reward_cost_model();
  return t;
}

}  // namespace lede::experience
