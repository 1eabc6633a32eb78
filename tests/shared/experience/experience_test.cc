// File: tests/shared/experience/experience_test.cc
//
// Tests for shared/experience/experience.h: shard round trips, complete-or-invisible
// writing, corrupt shards (each reported and skipped, never fatal), the
// Transition <-> lede.v1.Transition conversions, and the Python
// reader (scripts/read_experience.py) on a shard the C++ writer wrote; and
// for shared/experience/experience_logger.h: shards Put() to object stores (local,
// fake, and a real S3 server, s3rver, skipped when absent), rotation,
// dropping, retries, and a writer killed mid-write.
//
// Files go under a fresh mkdtemp directory. ctest runs the tests with the
// repository root as working directory (the Python test needs it).
#include "shared/experience/experience.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <regex>
#include <thread>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "proto/lede/v1/experience.pb.h"
#include "shared/status/status_macros.h"
#include "shared/storage/local_store.h"
#include "shared/storage/object_store.h"
#include "tests/testing/child_process.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/s3rver.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"
#include "shared/experience/experience_logger.h"
#include "shared/experience/retention.h"
#include "shared/file/file.h"
#include <fcntl.h>
#include <sys/stat.h>

namespace lede::experience {
namespace {

namespace fs = std::filesystem;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::lede::testing::WaitUntil;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A transition whose every field depends on `i`, so that mix-ups show.
Transition MakeTransition(int i) {
  Transition t;
  for (int k = 0; k < speculation::kExitFeatureDim; ++k) {
    t.state[k] = 0.25f * i + 0.01f * k;
    t.next_state[k] = -0.5f * i - 0.02f * k;
  }
  t.action = i % 3 == 0 ? speculation::Action::kExit : speculation::Action::kContinue;
  t.reward = i % 5 == 0 ? -2.0f + 0.125f * i : 0.5f * i;
  t.done = i % 4 == 3;
  if (t.done) t.next_state = {};
  t.phase = i % 2 == 0 ? speculation::Phase::kExitLayer : speculation::Phase::kDraftLength;
  t.layer = 1 + i % 7;
  t.n_layers = 8 + i % 3;
  t.draft_pos = i % 6;
  t.request_id = "req-" + std::to_string(i / 10);
  t.round_index = 1000000000000LL + i / 4;
  t.decision_index = i % 4;
  t.policy_version = "v" + std::to_string(i % 2);
  t.model_fingerprint = "fp-" + std::to_string(i % 3);
  t.reward_cost_model = i % 2 == 0 ? "accelerator" : "measured";
  return t;
}

std::vector<Transition> MakeTransitions(int first, int n) {
  std::vector<Transition> out;
  for (int i = first; i < first + n; ++i) out.push_back(MakeTransition(i));
  return out;
}

void ExpectSameTransition(const Transition& a, const Transition& b) {
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.action, b.action);
  EXPECT_EQ(a.reward, b.reward);
  EXPECT_EQ(a.next_state, b.next_state);
  EXPECT_EQ(a.done, b.done);
  EXPECT_EQ(a.phase, b.phase);
  EXPECT_EQ(a.layer, b.layer);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.draft_pos, b.draft_pos);
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.round_index, b.round_index);
  EXPECT_EQ(a.decision_index, b.decision_index);
  EXPECT_EQ(a.policy_version, b.policy_version);
  EXPECT_EQ(a.model_fingerprint, b.model_fingerprint);
  EXPECT_EQ(a.reward_cost_model, b.reward_cost_model);
}

void ExpectSameTransitions(const std::vector<Transition>& a,
                           const std::vector<Transition>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("transition " + std::to_string(i));
    ExpectSameTransition(a[i], b[i]);
  }
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string Uint32Le(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// zlib's CRC-32, computed bitwise here so that the test does not share the
// implementation's code path.
uint32_t TestCrc32(const std::string& bytes) {
  uint32_t c = 0xffffffffu;
  for (unsigned char byte : bytes) {
    c ^= byte;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

// `payload` framed as a shard record: length, CRC-32, payload.
std::string Frame(const std::string& payload) {
  return Uint32Le(static_cast<uint32_t>(payload.size())) + Uint32Le(TestCrc32(payload)) + payload;
}

// Byte offset of record `index` in a shard of whole records.
size_t RecordOffset(const std::string& shard, int index) {
  size_t offset = kShardMagicSize;
  for (int i = 0; i < index; ++i) {
    const auto* b = reinterpret_cast<const unsigned char*>(shard.data() + offset);
    const uint32_t length = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
    offset += 8 + length;
  }
  return offset;
}

class ShardTestBase : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    dir_ = tmp_.path().string();
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Writes `transitions` to the shard `name` and finishes it.
  void WriteShard(const std::string& name, const std::vector<Transition>& transitions) {
    StatusOr<std::unique_ptr<ShardWriter>> writer = ShardWriter::Create(Path(name));
    ASSERT_THAT(writer, IsOk());
    for (const Transition& t : transitions) ASSERT_THAT((*writer)->Append(t), IsOk());
    ASSERT_THAT((*writer)->Finish(), IsOk());
  }

  std::vector<std::string> DirEntries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  lede::testing::TempDir tmp_;
  std::string dir_;
};

using ShardWriterTest = ShardTestBase;
using ReadShardsTest = ShardTestBase;

// Many transitions survive a write and a read with every field intact, and
// records()/bytes() describe the file that was written.
TEST_F(ShardWriterTest, RoundTripsManyTransitionsWithAllFields) {
  const std::vector<Transition> in = MakeTransitions(0, 5000);
  StatusOr<std::unique_ptr<ShardWriter>> writer = ShardWriter::Create(Path("a.lexp"));
  ASSERT_THAT(writer, IsOk());
  for (const Transition& t : in) ASSERT_THAT((*writer)->Append(t), IsOk());
  ASSERT_THAT((*writer)->Finish(), IsOk());
  EXPECT_EQ((*writer)->records(), 5000);
  EXPECT_EQ((*writer)->bytes(), static_cast<int64_t>(fs::file_size(Path("a.lexp"))));

  StatusOr<ReadResult> read = ReadShards(dir_);
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->shards.size(), 1u);
  EXPECT_EQ(read->shards[0].path, Path("a.lexp"));
  EXPECT_EQ(read->shards[0].records, 5000);
  EXPECT_THAT(read->shards[0].error, IsEmpty());
  ExpectSameTransitions(read->transitions, in);
}

// Shards are read in name order and their records concatenated in that order.
TEST_F(ReadShardsTest, ReadsShardsInNameOrder) {
  WriteShard("b.lexp", MakeTransitions(10, 3));
  WriteShard("a.lexp", MakeTransitions(0, 2));
  WriteShard("c.lexp", MakeTransitions(20, 4));

  StatusOr<ReadResult> read = ReadShards(dir_);
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->shards.size(), 3u);
  EXPECT_EQ(read->shards[0].path, Path("a.lexp"));
  EXPECT_EQ(read->shards[1].path, Path("b.lexp"));
  EXPECT_EQ(read->shards[2].path, Path("c.lexp"));
  std::vector<Transition> expected = MakeTransitions(0, 2);
  for (const auto& t : MakeTransitions(10, 3)) expected.push_back(t);
  for (const auto& t : MakeTransitions(20, 4)) expected.push_back(t);
  ExpectSameTransitions(read->transitions, expected);
}

// A writer that is destroyed without Finish() leaves no file at all, and
// while it writes, readers see no shard.
TEST_F(ShardWriterTest, UnfinishedWriterLeavesNoVisibleShard) {
  {
    StatusOr<std::unique_ptr<ShardWriter>> writer = ShardWriter::Create(Path("a.lexp"));
    ASSERT_THAT(writer, IsOk());
    // Enough records to pass the writer's 1 MiB buffer, so data hits the disk.
    for (const auto& t : MakeTransitions(0, 20000)) ASSERT_THAT((*writer)->Append(t), IsOk());
    EXPECT_FALSE(fs::exists(Path("a.lexp")));
    StatusOr<ReadResult> during = ReadShards(dir_);
    ASSERT_THAT(during, IsOk());
    EXPECT_THAT(during->shards, IsEmpty());
    EXPECT_THAT(during->transitions, IsEmpty());
  }
  EXPECT_THAT(DirEntries(), IsEmpty());
}

// After Finish() only the shard itself remains: the temporary file is gone.
TEST_F(ShardWriterTest, FinishLeavesOnlyTheShard) {
  WriteShard("a.lexp", MakeTransitions(0, 3));
  EXPECT_EQ(DirEntries(), std::vector<std::string>{"a.lexp"});
}

// A shard with no records is valid and empty.
TEST_F(ShardWriterTest, EmptyShardIsValid) {
  WriteShard("a.lexp", {});
  EXPECT_EQ(ReadBytes(Path("a.lexp")), std::string(kShardMagic, kShardMagicSize));
  StatusOr<ReadResult> read = ReadShards(dir_);
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->shards.size(), 1u);
  EXPECT_EQ(read->shards[0].records, 0);
  EXPECT_THAT(read->shards[0].error, IsEmpty());
}

// Append() and Finish() after Finish() are precondition failures.
TEST_F(ShardWriterTest, UseAfterFinishIsFailedPrecondition) {
  StatusOr<std::unique_ptr<ShardWriter>> writer = ShardWriter::Create(Path("a.lexp"));
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT((*writer)->Finish(), IsOk());
  EXPECT_THAT((*writer)->Append(MakeTransition(0)), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT((*writer)->Finish(), StatusIs(StatusCode::kFailedPrecondition));
}

// A writer cannot be created in a directory that does not exist.
TEST_F(ShardWriterTest, MissingDirectoryIsInternal) {
  EXPECT_THAT(ShardWriter::Create(Path("no/such/dir/a.lexp")), StatusIs(StatusCode::kInternal));
}

// A shard cut in the middle of a record keeps the records before the cut and
// is reported, while the shards around it are read whole.
TEST_F(ReadShardsTest, TruncatedShardIsReportedAndOthersAreRead) {
  WriteShard("a.lexp", MakeTransitions(0, 3));
  WriteShard("b.lexp", MakeTransitions(10, 5));
  WriteShard("c.lexp", MakeTransitions(20, 2));
  const std::string b = ReadBytes(Path("b.lexp"));
  WriteBytes(Path("b.lexp"), b.substr(0, RecordOffset(b, 3) + 11));

  StatusOr<ReadResult> read = ReadShards(dir_);
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->shards.size(), 3u);
  EXPECT_THAT(read->shards[0].error, IsEmpty());
  EXPECT_EQ(read->shards[1].records, 3);
  EXPECT_THAT(read->shards[1].error, HasSubstr("truncated"));
  EXPECT_THAT(read->shards[2].error, IsEmpty());
  std::vector<Transition> expected = MakeTransitions(0, 3);
  for (const auto& t : MakeTransitions(10, 3)) expected.push_back(t);
  for (const auto& t : MakeTransitions(20, 2)) expected.push_back(t);
  ExpectSameTransitions(read->transitions, expected);
}

// A shard cut inside a record header is reported as truncated too.
TEST_F(ReadShardsTest, TruncatedRecordHeaderIsReported) {
  WriteShard("a.lexp", MakeTransitions(0, 2));
  const std::string a = ReadBytes(Path("a.lexp"));
  WriteBytes(Path("a.lexp"), a.substr(0, RecordOffset(a, 1) + 5));

  StatusOr<ReadResult> read = ReadShards(dir_);
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->shards.size(), 1u);
  EXPECT_EQ(read->shards[0].records, 1);
  EXPECT_THAT(read->shards[0].error, HasSubstr("truncated"));
}

// One flipped payload byte fails the checksum: that record and the rest of
// its shard are skipped, the other shards are read.
TEST_F(ReadShardsTest, FlippedByteFailsChecksum) {
  WriteShard("a.lexp", MakeTransitions(0, 4));
  WriteShard("b.lexp", MakeTransitions(10, 2));
  std::string a = ReadBytes(Path("a.lexp"));
  a[RecordOffset(a, 2) + 8 + 5] ^= 0x10;
  WriteBytes(Path("a.lexp"), a);

  StatusOr<ReadResult> read = ReadShards(dir_);
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->shards.size(), 2u);
  EXPECT_EQ(read->shards[0].records, 2);
  EXPECT_THAT(read->shards[0].error, HasSubstr("checksum"));
  EXPECT_EQ(read->shards[1].records, 2);
  EXPECT_THAT(read->shards[1].error, IsEmpty());
  std::vector<Transition> expected = MakeTransitions(0, 2);
  for (const auto& t : MakeTransitions(10, 2)) expected.push_back(t);
  ExpectSameTransitions(read->transitions, expected);
}

// A file without the shard magic yields no records and is reported.
TEST_F(ReadShardsTest, WrongMagicSkipsTheWholeShard) {
  WriteShard("a.lexp", MakeTransitions(0, 2));
  WriteShard("b.lexp", MakeTransitions(10, 2));
  std::string a = ReadBytes(Path("a.lexp"));
  a[3] = 'X';
  WriteBytes(Path("a.lexp"), a);
  WriteBytes(Path("c.lexp"), "LED");  // shorter than the magic

  StatusOr<ReadResult> read = ReadShards(dir_);
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->shards.size(), 3u);
  EXPECT_EQ(read->shards[0].records, 0);
  EXPECT_THAT(read->shards[0].error, HasSubstr("magic"));
  EXPECT_THAT(read->shards[1].error, IsEmpty());
  EXPECT_EQ(read->shards[2].records, 0);
  EXPECT_THAT(read->shards[2].error, HasSubstr("magic"));
  ExpectSameTransitions(read->transitions, MakeTransitions(10, 2));
}

// A record with a valid frame and checksum but a payload that is not a
// lede.v1.Transition is reported as unparsable.
TEST_F(ReadShardsTest, GarbageRecordIsReported) {
  WriteShard("a.lexp", MakeTransitions(0, 1));
  WriteShard("b.lexp", MakeTransitions(10, 1));
  WriteBytes(Path("a.lexp"), ReadBytes(Path("a.lexp")) + Frame("\xff\xff\xff\xff\xff\xff\xff"));

  StatusOr<ReadResult> read = ReadShards(dir_);
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->shards.size(), 2u);
  EXPECT_EQ(read->shards[0].records, 1);
  EXPECT_THAT(read->shards[0].error, HasSubstr("unparsable"));
  EXPECT_THAT(read->shards[1].error, IsEmpty());
  std::vector<Transition> expected = MakeTransitions(0, 1);
  expected.push_back(MakeTransition(10));
  ExpectSameTransitions(read->transitions, expected);
}

// Random bytes after the magic give an absurd record length, which is
// refused as corruption rather than allocated.
TEST_F(ReadShardsTest, AbsurdRecordLengthIsCorruption) {
  WriteBytes(Path("a.lexp"), std::string(kShardMagic, kShardMagicSize) +
                                 Uint32Le(0xfffffff0u) + Uint32Le(0) + "junk");
  WriteShard("b.lexp", MakeTransitions(10, 1));

  StatusOr<ReadResult> read = ReadShards(dir_);
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->shards.size(), 2u);
  EXPECT_EQ(read->shards[0].records, 0);
  EXPECT_THAT(read->shards[0].error, HasSubstr("length"));
  EXPECT_THAT(read->shards[1].error, IsEmpty());
  ExpectSameTransitions(read->transitions, MakeTransitions(10, 1));
}

// A record that parses but holds the wrong number of features is reported;
// the records before it are kept, those after it skipped.
TEST_F(ReadShardsTest, RecordWithWrongFeatureCountIsReported) {
  lede::v1::Transition bad;
  ToProto(MakeTransition(2), &bad);
  bad.add_state(1.0f);
  lede::v1::Transition good;
  ToProto(MakeTransition(3), &good);
  WriteShard("a.lexp", MakeTransitions(0, 2));
  WriteBytes(Path("a.lexp"), ReadBytes(Path("a.lexp")) + Frame(bad.SerializeAsString()) +
                                 Frame(good.SerializeAsString()));

  StatusOr<ReadResult> read = ReadShards(dir_);
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->shards.size(), 1u);
  EXPECT_EQ(read->shards[0].records, 2);
  EXPECT_THAT(read->shards[0].error, HasSubstr("invalid"));
  ExpectSameTransitions(read->transitions, MakeTransitions(0, 2));
}

// Only "*.lexp" regular files are read: temporary shards, other files and
// directories named like shards are ignored.
TEST_F(ReadShardsTest, ReadsOnlyLexpFiles) {
  WriteShard("a.lexp", MakeTransitions(0, 2));
  WriteBytes(Path("b.lexp.tmp-123"), "partial");
  WriteBytes(Path("notes.txt"), "hello");
  WriteBytes(Path("c.lexp.bak"), ReadBytes(Path("a.lexp")));
  fs::create_directory(Path("d.lexp"));

  StatusOr<ReadResult> read = ReadShards(dir_);
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->shards.size(), 1u);
  EXPECT_EQ(read->shards[0].path, Path("a.lexp"));
  ExpectSameTransitions(read->transitions, MakeTransitions(0, 2));
}

// A directory that does not exist is kNotFound; a file is kInvalidArgument.
TEST_F(ReadShardsTest, MissingDirIsNotFound) {
  EXPECT_THAT(ReadShards(Path("missing")), StatusIs(StatusCode::kNotFound));
  WriteShard("a.lexp", {});
  EXPECT_THAT(ReadShards(Path("a.lexp")), StatusIs(StatusCode::kInvalidArgument));
}

// ToProto writes every field, and no next_state for a terminal transition.
TEST(ShardRecordTest, ToProtoWritesEveryField) {
  Transition t = MakeTransition(7);  // done, phase 2, continue
  lede::v1::Transition r;
  ToProto(t, &r);
  ASSERT_EQ(r.state_size(), speculation::kExitFeatureDim);
  EXPECT_EQ(r.state(3), t.state[3]);
  EXPECT_EQ(r.action(), lede::v1::EXIT_ACTION_CONTINUE);
  EXPECT_EQ(r.reward(), t.reward);
  EXPECT_TRUE(r.done());
  EXPECT_EQ(r.next_state_size(), 0);
  EXPECT_EQ(r.phase(), lede::v1::PHASE_DRAFT_LENGTH);
  EXPECT_EQ(r.layer(), t.layer);
  EXPECT_EQ(r.n_layers(), t.n_layers);
  EXPECT_EQ(r.draft_pos(), t.draft_pos);
  EXPECT_EQ(r.request_id(), t.request_id);
  EXPECT_EQ(r.round_index(), t.round_index);
  EXPECT_EQ(r.decision_index(), t.decision_index);
  EXPECT_EQ(r.policy_version(), t.policy_version);
  EXPECT_EQ(r.model_fingerprint(), t.model_fingerprint);
  EXPECT_EQ(r.reward_cost_model(), t.reward_cost_model);

  t = MakeTransition(6);  // not done, phase 1, exit
  ToProto(t, &r);
  EXPECT_FALSE(r.done());
  EXPECT_EQ(r.next_state_size(), speculation::kExitFeatureDim);
  EXPECT_EQ(r.action(), lede::v1::EXIT_ACTION_EXIT);
  EXPECT_EQ(r.phase(), lede::v1::PHASE_EXIT_LAYER);
}

// FromProto inverts ToProto.
TEST(ShardRecordTest, FromProtoInvertsToProto) {
  for (int i = 0; i < 12; ++i) {
    lede::v1::Transition r;
    ToProto(MakeTransition(i), &r);
    StatusOr<Transition> t = FromProto(r);
    ASSERT_THAT(t, IsOk());
    ExpectSameTransition(*t, MakeTransition(i));
  }
}

// A record logged before the load feature (lede-features-v3, 13
// features) or before the cost profile (v4, 14) reads with what it lacks
// 0 (load 1, costs unknown), the rest as written; a next_state of another
// width than its state is refused.
TEST(ShardRecordTest, FromProtoReadsLoadBlindRecordsAsLoadOne) {
  for (int dim : {13, 14}) {
    SCOPED_TRACE(dim);
    Transition want = MakeTransition(6);  // not done
    for (int c = dim; c < speculation::kExitFeatureDim; ++c) want.state[c] = want.next_state[c] = 0.0f;
    lede::v1::Transition r;
    ToProto(want, &r);
    while (r.state_size() > dim) r.mutable_state()->RemoveLast();
    while (r.next_state_size() > dim) r.mutable_next_state()->RemoveLast();
    StatusOr<Transition> t = FromProto(r);
    ASSERT_THAT(t, IsOk());
    ExpectSameTransition(*t, want);
  }
  Transition want = MakeTransition(6);
  lede::v1::Transition r;
  ToProto(want, &r);
  while (r.state_size() > 14) r.mutable_state()->RemoveLast();
  while (r.next_state_size() > 13) r.mutable_next_state()->RemoveLast();
  EXPECT_THAT(FromProto(r), StatusIs(StatusCode::kInvalidArgument, HasSubstr("next_state")));
}

// FromProto refuses records that a Transition cannot hold.
TEST(ShardRecordTest, FromProtoRejectsMalformedRecords) {
  lede::v1::Transition good;
  ToProto(MakeTransition(2), &good);

  lede::v1::Transition r = good;
  r.add_state(0.0f);
  EXPECT_THAT(FromProto(r), StatusIs(StatusCode::kInvalidArgument));
  r = good;
  r.clear_state();
  EXPECT_THAT(FromProto(r), StatusIs(StatusCode::kInvalidArgument));
  r = good;
  r.mutable_next_state()->RemoveLast();
  EXPECT_THAT(FromProto(r), StatusIs(StatusCode::kInvalidArgument));
  r = good;
  r.set_phase(lede::v1::PHASE_UNSPECIFIED);
  EXPECT_THAT(FromProto(r), StatusIs(StatusCode::kInvalidArgument));
  r = good;
  r.set_action(static_cast<lede::v1::ExitAction>(7));
  EXPECT_THAT(FromProto(r), StatusIs(StatusCode::kInvalidArgument));
}

// ---------------------------------------------------------------------------
// scripts/read_experience.py

// Runs `command` with /bin/sh; returns its exit status (-1 if it did not exit).
int RunShell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A python3 that has the protobuf module: "python3" on PATH, else Debian's
// /usr/bin/python3 (python3-protobuf); empty if neither has it.
std::string PythonWithProtobuf() {
  for (const char* python : {"python3", "/usr/bin/python3"}) {
    if (RunShell(std::string(python) + " -c 'import google.protobuf' >/dev/null 2>&1") == 0) {
      return python;
    }
  }
  return "";
}

using PythonShardReaderTest = ShardTestBase;

// The Python reader reads a shard the C++ writer wrote, field for field, and
// exits 1 on a bad shard.
TEST_F(PythonShardReaderTest, ReadsShardWrittenByCpp) {
  const std::string python = PythonWithProtobuf();
  if (python.empty()) GTEST_SKIP() << "no python3 with the protobuf module";
  if (RunShell("protoc --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "protoc not installed";
  ASSERT_TRUE(fs::exists("scripts/read_experience.py"))
      << "run from the repository root (ctest does)";

  WriteShard("a.lexp", MakeTransitions(0, 40));
  const std::string script = python + " scripts/read_experience.py ";
  const std::string json_out = Path("out.jsonl");
  ASSERT_EQ(RunShell(script + Path("a.lexp") + " --json > " + json_out), 0);
  std::ifstream in(json_out);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 40u);
  // Record 7: done, phase 2, continue, request "req-0", round 1000000000001.
  EXPECT_THAT(lines[7], HasSubstr("\"request_id\": \"req-0\""));
  EXPECT_THAT(lines[7], HasSubstr("\"done\": true"));
  EXPECT_THAT(lines[7], HasSubstr("\"phase\": \"PHASE_DRAFT_LENGTH\""));
  EXPECT_THAT(lines[7], HasSubstr("\"action\": \"EXIT_ACTION_CONTINUE\""));
  EXPECT_THAT(lines[7], HasSubstr("\"round_index\": \"1000000000001\""));
  EXPECT_THAT(lines[7], HasSubstr("\"next_state\": []"));
  EXPECT_THAT(lines[7], HasSubstr("\"reward_cost_model\": \"measured\""));
  EXPECT_THAT(lines[33], HasSubstr("\"request_id\": \"req-3\""));
  EXPECT_THAT(lines[33], HasSubstr("\"layer\": 6"));

  const std::string summary = Path("summary.txt");
  ASSERT_EQ(RunShell(script + dir_ + " > " + summary), 0);
  EXPECT_THAT(ReadBytes(summary), HasSubstr("a.lexp: 40 records"));
  EXPECT_THAT(ReadBytes(summary), HasSubstr("total: 40 records in 1 shards (0 bad)"));

  std::string a = ReadBytes(Path("a.lexp"));
  a[RecordOffset(a, 5) + 8 + 2] ^= 0x01;
  WriteBytes(Path("b.lexp"), a);
  EXPECT_EQ(RunShell(script + dir_ + " > " + summary + " 2>/dev/null"), 1);
  EXPECT_THAT(ReadBytes(summary), HasSubstr("b.lexp: 5 records (BAD"));
}


// ---------------------------------------------------------------------------
// ReadShardsFromStore and ExperienceLogger

lede::v1::Transition MakeRecord(int i) {
  lede::v1::Transition r;
  ToProto(MakeTransition(i), &r);
  return r;
}

// An in-memory ObjectStore whose Put() can be made to block (until
// Release()) or to fail.
class FakeStore : public storage::ObjectStore {
 public:
  Status Put(std::string_view key, std::string_view bytes) override {
    LEDE_RETURN_IF_ERROR(storage::ValidateKey(key));
    {
      absl::MutexLock lock(&mu_);
      ++puts_started_;
      if (block_) {
        mu_.Await(absl::Condition(+[](bool* b) { return !*b; }, &block_));
      }
      if (fail_puts_ > 0) {
        --fail_puts_;
        return UnavailableError("fake store is down");
      }
      objects_[std::string(key)] = std::string(bytes);
    }
    return OkStatus();
  }
  StatusOr<std::string> Get(std::string_view key) override {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find(std::string(key));
    if (it == objects_.end()) return NotFoundError(std::string(key));
    return it->second;
  }
  StatusOr<std::vector<storage::ObjectInfo>> List(std::string_view prefix) override {
    LEDE_RETURN_IF_ERROR(storage::ValidatePrefix(prefix));
    absl::MutexLock lock(&mu_);
    std::vector<storage::ObjectInfo> out;
    for (const auto& [key, bytes] : objects_) {
      if (key.compare(0, prefix.size(), prefix) == 0) {
        out.push_back({key, static_cast<int64_t>(bytes.size())});
      }
    }
    return out;
  }
  Status Delete(std::string_view key) override {
    absl::MutexLock lock(&mu_);
    objects_.erase(std::string(key));
    return OkStatus();
  }
  std::string url() const override { return "fake://"; }

  void Block() { absl::MutexLock lock(&mu_); block_ = true; }
  void Release() { absl::MutexLock lock(&mu_); block_ = false; }
  void FailNextPuts(int n) { absl::MutexLock lock(&mu_); fail_puts_ = n; }
  int puts_started() { absl::MutexLock lock(&mu_); return puts_started_; }
  std::vector<std::string> keys() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& [key, bytes] : objects_) out.push_back(key);
    return out;
  }
  void PutRaw(const std::string& key, const std::string& bytes) {
    absl::MutexLock lock(&mu_);
    objects_[key] = bytes;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> objects_ ABSL_GUARDED_BY(mu_);
  bool block_ ABSL_GUARDED_BY(mu_) = false;
  int fail_puts_ ABSL_GUARDED_BY(mu_) = 0;
  int puts_started_ ABSL_GUARDED_BY(mu_) = 0;
};

ExperienceLoggerOptions SmallOptions() {
  ExperienceLoggerOptions o;
  o.prefix = "experience";
  o.writer_id = "w1";
  o.initial_backoff = absl::Milliseconds(1);
  return o;
}

// Reads everything under `prefix` and checks that no shard is bad.
std::vector<Transition> ReadAllClean(storage::ObjectStore& store, const std::string& prefix,
                                             size_t* n_shards = nullptr) {
  StatusOr<ReadResult> read = ReadShardsFromStore(store, prefix);
  EXPECT_THAT(read, IsOk());
  if (!read.ok()) return {};
  for (const ShardReport& r : read->shards) EXPECT_THAT(r.error, IsEmpty()) << r.path;
  if (n_shards != nullptr) *n_shards = read->shards.size();
  return read->transitions;
}

// The logger's shards land under <prefix>/<UTC date>/<writer>-<seq>.lexp in a
// local store, and read back in order with every field; counters add up.
TEST(ExperienceLoggerTest, WritesShardsReadableFromStore) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  StatusOr<std::unique_ptr<storage::ObjectStore>> opened =
      storage::OpenObjectStore("file://" + tmp.path().string());
  ASSERT_THAT(opened, IsOk());
  std::shared_ptr<storage::ObjectStore> store = std::move(opened).value();
  StatusOr<std::unique_ptr<ExperienceLogger>> logger = ExperienceLogger::Create(store, SmallOptions());
  ASSERT_THAT(logger, IsOk());
  for (int i = 0; i < 100; ++i) EXPECT_TRUE((*logger)->Log(MakeRecord(i)));
  ASSERT_THAT((*logger)->Flush(), IsOk());
  for (int i = 100; i < 150; ++i) EXPECT_TRUE((*logger)->Log(MakeRecord(i)));
  ASSERT_THAT((*logger)->Close(), IsOk());

  StatusOr<std::vector<storage::ObjectInfo>> objects = store->List("");
  ASSERT_THAT(objects, IsOk());
  ASSERT_EQ(objects->size(), 2u);
  const std::regex key_re(R"(experience/\d{4}-\d{2}-\d{2}/w1-0000000[01]\.lexp)");
  for (const auto& o : *objects) EXPECT_TRUE(std::regex_match(o.key, key_re)) << o.key;
  ExpectSameTransitions(ReadAllClean(*store, "experience"), MakeTransitions(0, 150));
  // The plain-directory reader reads one date folder of the same shards.
  const std::string date_dir = (tmp.path() / fs::path((*objects)[0].key).parent_path()).string();
  StatusOr<ReadResult> dir_read = ReadShards(date_dir);
  ASSERT_THAT(dir_read, IsOk());
  EXPECT_EQ(dir_read->transitions.size(), 150u);

  const ExperienceLoggerCounters c = (*logger)->counters();
  EXPECT_EQ(c.records_logged, 150);
  EXPECT_EQ(c.records_written, 150);
  EXPECT_EQ(c.shards_written, 2);
  EXPECT_EQ(c.records_dropped, 0);
  EXPECT_EQ(c.put_failures, 0);
}

// A shard is Put() once it reaches max_shard_bytes: many small shards, none
// much larger than the limit, all records present in order.
TEST(ExperienceLoggerTest, RotatesBySize) {
  auto store = std::make_shared<FakeStore>();
  ExperienceLoggerOptions o = SmallOptions();
  o.max_shard_bytes = 2000;
  StatusOr<std::unique_ptr<ExperienceLogger>> logger = ExperienceLogger::Create(store, o);
  ASSERT_THAT(logger, IsOk());
  for (int i = 0; i < 200; ++i) ASSERT_TRUE((*logger)->Log(MakeRecord(i)));
  ASSERT_THAT((*logger)->Close(), IsOk());

  const int64_t record_bytes = 8 + static_cast<int64_t>(MakeRecord(0).ByteSizeLong());
  StatusOr<std::vector<storage::ObjectInfo>> objects = store->List("experience/");
  ASSERT_THAT(objects, IsOk());
  EXPECT_GT(objects->size(), 5u);
  for (const auto& obj : *objects) EXPECT_LT(obj.size_bytes, 2000 + 2 * record_bytes) << obj.key;
  size_t n_shards = 0;
  ExpectSameTransitions(ReadAllClean(*store, "experience", &n_shards), MakeTransitions(0, 200));
  EXPECT_EQ(static_cast<int64_t>(n_shards), (*logger)->counters().shards_written);
}

// A shard is Put() once its first record is max_shard_age old on the
// logger's clock, not before, and is dated by that record's time.
TEST(ExperienceLoggerTest, RotatesByAge) {
  auto store = std::make_shared<FakeStore>();
  lede::testing::FakeClock clock;  // 2026-01-02 03:04:05 UTC
  ExperienceLoggerOptions o = SmallOptions();
  o.max_shard_age = absl::Seconds(60);
  o.clock = &clock;
  StatusOr<std::unique_ptr<ExperienceLogger>> logger = ExperienceLogger::Create(store, o);
  ASSERT_THAT(logger, IsOk());
  ExperienceLogger& l = **logger;
  ASSERT_TRUE(l.Log(MakeRecord(0)));
  // The writer holds a one-record shard and waits for its age on the clock.
  ASSERT_TRUE(WaitUntil([&] { return clock.n_waiting() == 1; }));
  const int64_t short_wakeups = clock.n_short_wakeups();
  clock.Advance(absl::Seconds(59));
  // One second short: the writer sees the new time and goes on waiting.
  ASSERT_TRUE(WaitUntil([&] { return clock.n_short_wakeups() > short_wakeups; }));
  EXPECT_EQ(l.counters().shards_written, 0);
  EXPECT_THAT(store->keys(), IsEmpty());
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(WaitUntil([&] { return l.counters().shards_written == 1; }));
  EXPECT_THAT(store->keys(), ElementsAre("experience/2026-01-02/w1-00000000.lexp"));

  // The next shard's age counts from its own first record: a day later.
  clock.Advance(absl::Hours(24));
  ASSERT_TRUE(l.Log(MakeRecord(1)));
  ASSERT_TRUE(l.Log(MakeRecord(2)));
  ASSERT_TRUE(WaitUntil([&] { return clock.n_waiting() == 1; }));
  clock.Advance(absl::Seconds(60));
  ASSERT_TRUE(WaitUntil([&] { return l.counters().shards_written == 2; }));
  EXPECT_EQ(l.counters().records_written, 3);
  EXPECT_THAT(store->keys(), ElementsAre("experience/2026-01-02/w1-00000000.lexp",
                                         "experience/2026-01-03/w1-00000001.lexp"));
  ASSERT_THAT(l.Close(), IsOk());
  ExpectSameTransitions(ReadAllClean(*store, "experience"), MakeTransitions(0, 3));
}

// When the store stalls, Log() keeps returning at once: the queue fills to
// its capacity and further records are dropped and counted.
TEST(ExperienceLoggerTest, DropsAndCountsWhenQueueIsFull) {
  auto store = std::make_shared<FakeStore>();
  store->Block();
  ExperienceLoggerOptions o = SmallOptions();
  o.queue_capacity_records = 4;
  o.max_shard_bytes = 1;  // every record is a shard
  StatusOr<std::unique_ptr<ExperienceLogger>> logger = ExperienceLogger::Create(store, o);
  ASSERT_THAT(logger, IsOk());
  ExperienceLogger& l = **logger;
  ASSERT_TRUE(l.Log(MakeRecord(0)));
  ASSERT_TRUE(WaitUntil([&] { return store->puts_started() == 1; }));  // writer stuck in Put
  int accepted = 0;
  for (int i = 1; i <= 10; ++i) accepted += l.Log(MakeRecord(i)) ? 1 : 0;
  EXPECT_EQ(accepted, 4);
  EXPECT_EQ(l.counters().records_dropped, 6);
  store->Release();
  ASSERT_THAT(l.Close(), IsOk());
  const ExperienceLoggerCounters c = l.counters();
  EXPECT_EQ(c.records_logged, 5);
  EXPECT_EQ(c.records_written, 5);
  EXPECT_EQ(c.shards_written, 5);
  EXPECT_EQ(c.records_dropped, 6);
  ExpectSameTransitions(ReadAllClean(*store, "experience"), MakeTransitions(0, 5));
}

// A failing Put() is retried with backoff; after max_put_attempts the shard
// is given up and counted, Flush() reports it, and the logger carries on.
TEST(ExperienceLoggerTest, RetriesFailedPutsThenCountsAndDrops) {
  auto store = std::make_shared<FakeStore>();
  ExperienceLoggerOptions o = SmallOptions();
  o.max_put_attempts = 3;
  StatusOr<std::unique_ptr<ExperienceLogger>> logger = ExperienceLogger::Create(store, o);
  ASSERT_THAT(logger, IsOk());
  ExperienceLogger& l = **logger;

  store->FailNextPuts(2);  // two failures, then success: retried, not lost
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(l.Log(MakeRecord(i)));
  ASSERT_THAT(l.Flush(), IsOk());
  EXPECT_EQ(l.counters().put_retries, 2);
  EXPECT_EQ(l.counters().records_written, 3);

  store->FailNextPuts(3);  // every attempt fails: given up
  for (int i = 3; i < 7; ++i) ASSERT_TRUE(l.Log(MakeRecord(i)));
  EXPECT_THAT(l.Flush(), StatusIs(StatusCode::kUnavailable));
  ExperienceLoggerCounters c = l.counters();
  EXPECT_EQ(c.put_failures, 1);
  EXPECT_EQ(c.put_retries, 4);
  EXPECT_EQ(c.records_lost, 4);

  for (int i = 7; i < 9; ++i) ASSERT_TRUE(l.Log(MakeRecord(i)));
  ASSERT_THAT(l.Close(), IsOk());
  c = l.counters();
  EXPECT_EQ(c.records_written, 5);
  EXPECT_EQ(c.shards_written, 2);
  EXPECT_EQ(c.records_logged, c.records_written + c.records_lost + c.records_rejected);
  std::vector<Transition> expected = MakeTransitions(0, 3);
  for (const auto& t : MakeTransitions(7, 2)) expected.push_back(t);
  ExpectSameTransitions(ReadAllClean(*store, "experience"), expected);
}

// A failing store is loud. The first failed Put()
// attempt reaches on_put_error at once, naming the shard and the store's
// error; further failures within put_error_interval are counted, not
// reported, and the next report says how many it folds in.
TEST(ExperienceLoggerTest, FailedPutsAreReportedRateLimited) {
  auto store = std::make_shared<FakeStore>();
  ExperienceLoggerOptions o = SmallOptions();
  o.max_put_attempts = 3;
  o.put_error_interval = absl::Hours(1);
  absl::Mutex mu;
  std::vector<std::pair<std::string, int64_t>> reports;
  o.on_put_error = [&](const Status& error, int64_t unreported) {
    absl::MutexLock lock(&mu);
    reports.emplace_back(std::string(error.message()), unreported);
  };
  StatusOr<std::unique_ptr<ExperienceLogger>> logger = ExperienceLogger::Create(store, o);
  ASSERT_THAT(logger, IsOk());
  store->FailNextPuts(6);  // two shards given up, three attempts each
  ASSERT_TRUE((*logger)->Log(MakeRecord(0)));
  EXPECT_THAT((*logger)->Flush(), StatusIs(StatusCode::kUnavailable));
  ASSERT_TRUE((*logger)->Log(MakeRecord(1)));
  EXPECT_THAT((*logger)->Flush(), StatusIs(StatusCode::kUnavailable));
  ASSERT_THAT((*logger)->Close(), IsOk());
  EXPECT_EQ((*logger)->counters().put_failures, 2);
  auto taken = [&] {
    absl::MutexLock lock(&mu);
    return std::exchange(reports, {});
  };
  const auto first = taken();
  ASSERT_EQ(first.size(), 1u) << "one report per interval";
  EXPECT_THAT(first[0].first, HasSubstr("fake store is down"));
  EXPECT_THAT(first[0].first, HasSubstr("experience/"));
  EXPECT_EQ(first[0].second, 0);

  // With no interval every failure is reported as it happens.
  auto store2 = std::make_shared<FakeStore>();
  o.put_error_interval = absl::ZeroDuration();
  StatusOr<std::unique_ptr<ExperienceLogger>> logger2 = ExperienceLogger::Create(store2, o);
  ASSERT_THAT(logger2, IsOk());
  store2->FailNextPuts(2);
  ASSERT_TRUE((*logger2)->Log(MakeRecord(0)));
  ASSERT_THAT((*logger2)->Flush(), IsOk());
  ASSERT_THAT((*logger2)->Close(), IsOk());
  EXPECT_EQ(taken().size(), 2u);
}

// A store that fails and comes back is logged coming back: on_put_recovered
// is called once, at the first successful Put() after failures, with the
// failed attempts and the shards given up since the last success; never
// while the store works, and again only after a new outage.
TEST(ExperienceLoggerTest, RecoveryAfterFailedPutsIsReportedOnce) {
  auto store = std::make_shared<FakeStore>();
  ExperienceLoggerOptions o = SmallOptions();
  o.max_put_attempts = 3;
  absl::Mutex mu;
  std::vector<PutRecovery> recoveries;
  o.on_put_recovered = [&](const PutRecovery& r) {
    absl::MutexLock lock(&mu);
    recoveries.push_back(r);
  };
  auto taken = [&] {
    absl::MutexLock lock(&mu);
    return std::exchange(recoveries, {});
  };
  StatusOr<std::unique_ptr<ExperienceLogger>> logger = ExperienceLogger::Create(store, o);
  ASSERT_THAT(logger, IsOk());
  // A healthy store: no recovery to report.
  ASSERT_TRUE((*logger)->Log(MakeRecord(0)));
  ASSERT_THAT((*logger)->Flush(), IsOk());
  EXPECT_THAT(taken(), IsEmpty());
  // Down for one whole shard (3 attempts, given up) and the first attempt of
  // the next, which its retry writes.
  store->FailNextPuts(4);
  ASSERT_TRUE((*logger)->Log(MakeRecord(1)));
  EXPECT_THAT((*logger)->Flush(), StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(taken(), IsEmpty());  // still failing: nothing recovered yet
  ASSERT_TRUE((*logger)->Log(MakeRecord(2)));
  ASSERT_THAT((*logger)->Flush(), IsOk());
  std::vector<PutRecovery> first = taken();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].failed_attempts, 4);
  EXPECT_EQ(first[0].shards_given_up, 1);
  EXPECT_GE(first[0].outage, absl::ZeroDuration());
  EXPECT_THAT(first[0].key, HasSubstr("experience/"));
  // Working again: later shards report nothing; a new outage reports anew.
  ASSERT_TRUE((*logger)->Log(MakeRecord(3)));
  ASSERT_THAT((*logger)->Flush(), IsOk());
  EXPECT_THAT(taken(), IsEmpty());
  store->FailNextPuts(1);
  ASSERT_TRUE((*logger)->Log(MakeRecord(4)));
  ASSERT_THAT((*logger)->Flush(), IsOk());
  ASSERT_THAT((*logger)->Close(), IsOk());
  std::vector<PutRecovery> second = taken();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].failed_attempts, 1);
  EXPECT_EQ(second[0].shards_given_up, 0);
  EXPECT_EQ((*logger)->counters().records_written, 4);
}

// Close() writes what is buffered, reports the final counters through the
// hook, and refuses later records; destruction closes too.
TEST(ExperienceLoggerTest, CloseFlushesAndReportsCounters) {
  auto store = std::make_shared<FakeStore>();
  ExperienceLoggerOptions o = SmallOptions();
  absl::Mutex mu;
  ExperienceLoggerCounters last;
  int calls = 0;
  o.on_counters = [&](const ExperienceLoggerCounters& c) {
    absl::MutexLock lock(&mu);
    last = c;
    ++calls;
  };
  StatusOr<std::unique_ptr<ExperienceLogger>> logger = ExperienceLogger::Create(store, o);
  ASSERT_THAT(logger, IsOk());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*logger)->Log(MakeRecord(i)));
  EXPECT_THAT(store->keys(), IsEmpty());  // big shard, long age: still buffered
  ASSERT_THAT((*logger)->Close(), IsOk());
  EXPECT_THAT((*logger)->Close(), IsOk());
  EXPECT_FALSE((*logger)->Log(MakeRecord(5)));
  EXPECT_THAT((*logger)->Flush(), StatusIs(StatusCode::kFailedPrecondition));
  ExpectSameTransitions(ReadAllClean(*store, "experience"), MakeTransitions(0, 5));
  {
    absl::MutexLock lock(&mu);
    EXPECT_GE(calls, 1);
    EXPECT_EQ(last.records_written, 5);
    EXPECT_EQ(last.shards_written, 1);
  }
  EXPECT_EQ((*logger)->counters().records_dropped, 1);

  {  // destruction without Close()
    StatusOr<std::unique_ptr<ExperienceLogger>> other = ExperienceLogger::Create(store, [] {
      ExperienceLoggerOptions p = SmallOptions();
      p.writer_id = "w2";
      return p;
    }());
    ASSERT_THAT(other, IsOk());
    ASSERT_TRUE((*other)->Log(MakeRecord(9)));
  }
  EXPECT_EQ(store->keys().size(), 2u);
}

// Options that cannot work are refused.
TEST(ExperienceLoggerTest, RejectsBadOptions) {
  auto store = std::make_shared<FakeStore>();
  EXPECT_THAT(ExperienceLogger::Create(nullptr, SmallOptions()), StatusIs(StatusCode::kInvalidArgument));
  ExperienceLoggerOptions o = SmallOptions();
  o.prefix = "../up";
  EXPECT_THAT(ExperienceLogger::Create(store, o), StatusIs(StatusCode::kInvalidArgument));
  o = SmallOptions();
  o.writer_id = "a/b";
  EXPECT_THAT(ExperienceLogger::Create(store, o), StatusIs(StatusCode::kInvalidArgument));
  o = SmallOptions();
  o.queue_capacity_records = 0;
  EXPECT_THAT(ExperienceLogger::Create(store, o), StatusIs(StatusCode::kInvalidArgument));
  o = SmallOptions();
  o.writer_id = "";
  StatusOr<std::unique_ptr<ExperienceLogger>> defaulted = ExperienceLogger::Create(store, o);
  ASSERT_THAT(defaulted, IsOk());
  EXPECT_THAT((*defaulted)->writer_id(), ::testing::MatchesRegex(".+-[0-9]+-[0-9]{8}T[0-9]{6}Z"));
}

// ReadShardsFromStore reads only *.lexp under the prefix folder, reports a
// corrupt shard and keeps going.
TEST(ReadShardsFromStoreTest, ReportsBadShardsAndSkipsOtherObjects) {
  FakeStore store;
  ShardEncoder a, b;
  for (int i = 0; i < 3; ++i) ASSERT_THAT(a.Append(MakeRecord(i)), IsOk());
  for (int i = 10; i < 12; ++i) ASSERT_THAT(b.Append(MakeRecord(i)), IsOk());
  std::string bad = b.TakeBytes();
  store.PutRaw("exp/d/a.lexp", a.TakeBytes());
  store.PutRaw("exp/d/b.lexp", bad.substr(0, bad.size() - 3));
  store.PutRaw("exp/d/notes.txt", "x");
  store.PutRaw("expert/c.lexp", "not mine");
  StatusOr<ReadResult> read = ReadShardsFromStore(store, "exp");
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->shards.size(), 2u);
  EXPECT_EQ(read->shards[0].path, "exp/d/a.lexp");
  EXPECT_THAT(read->shards[0].error, IsEmpty());
  EXPECT_EQ(read->shards[1].records, 1);
  EXPECT_THAT(read->shards[1].error, HasSubstr("truncated"));
  std::vector<Transition> expected = MakeTransitions(0, 3);
  expected.push_back(MakeTransition(10));
  ExpectSameTransitions(read->transitions, expected);
  EXPECT_THAT(ReadShardsFromStore(store, "/abs"), StatusIs(StatusCode::kInvalidArgument));
}

// A process that logs continuously to a local store and is SIGKILLed
// mid-write leaves only whole shards: every visible shard reads back with
// no error (temporary files are invisible to List()).
TEST(ExperienceLoggerTest, KilledWriterLeavesOnlyCompleteShards) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string root = tmp.path().string();
  auto child = lede::testing::ChildProcess::Fork(
      [&root]() -> int {  // log forever
        StatusOr<std::unique_ptr<storage::LocalStore>> store = storage::LocalStore::Open(root);
        if (!store.ok()) return 3;
        ExperienceLoggerOptions o = SmallOptions();
        o.max_shard_bytes = 64 << 10;
        StatusOr<std::unique_ptr<ExperienceLogger>> logger =
            ExperienceLogger::Create(std::shared_ptr<storage::ObjectStore>(std::move(store).value()), o);
        if (!logger.ok()) return 4;
        for (int i = 0;; ++i) {
          if (!(*logger)->Log(MakeRecord(i % 1000))) std::this_thread::yield();
        }
      },
      (tmp.path() / "writer.log").string());
  ASSERT_THAT(child, IsOk());
  StatusOr<std::unique_ptr<storage::ObjectStore>> store = storage::OpenObjectStore(root);
  ASSERT_THAT(store, IsOk());
  const bool enough = WaitUntil([&] {
    StatusOr<std::vector<storage::ObjectInfo>> objects = (*store)->List("experience/");
    return objects.ok() && objects->size() >= 8;
  });
  EXPECT_EQ((*child)->Kill(), 128 + SIGKILL) << "the child exited by itself; its log:\n"
                                             << (*child)->Log();
  ASSERT_TRUE(enough) << "the child wrote fewer than 8 shards in 20 s";

  size_t n_shards = 0;
  const std::vector<Transition> read = ReadAllClean(**store, "experience", &n_shards);
  EXPECT_GE(n_shards, 8u);
  EXPECT_GT(read.size(), 8u * 100);
}

// The logger's shards round-trip through a real S3 server (s3rver) and read
// back with ReadShardsFromStore.
TEST(ExperienceLoggerTest, RoundTripThroughS3) {
  lede::testing::S3rver s3;
  if (!s3.available()) GTEST_SKIP() << s3.skip_reason();
  ASSERT_THAT(s3.Start("lede-test"), IsOk());
  ::setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
  StatusOr<std::unique_ptr<storage::ObjectStore>> opened = storage::OpenObjectStore(
      "s3://lede-test/run1?endpoint=" + s3.endpoint() + "&region=us-east-1&max_keys=2");
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  ASSERT_THAT(opened, IsOk());
  std::shared_ptr<storage::ObjectStore> store = std::move(opened).value();
  ExperienceLoggerOptions o = SmallOptions();
  o.max_shard_bytes = 3000;
  StatusOr<std::unique_ptr<ExperienceLogger>> logger = ExperienceLogger::Create(store, o);
  ASSERT_THAT(logger, IsOk());
  for (int i = 0; i < 60; ++i) ASSERT_TRUE((*logger)->Log(MakeRecord(i)));
  ASSERT_THAT((*logger)->Close(), IsOk());
  EXPECT_GE((*logger)->counters().shards_written, 3);
  EXPECT_EQ((*logger)->counters().put_failures, 0);
  ExpectSameTransitions(ReadAllClean(*store, "experience"), MakeTransitions(0, 60));
}

// ---------------------------------------------------------------------------
// Disk hygiene: stale temporaries at start, retention.

// Sets the modification time of `path` to `t`.
void SetModified(const fs::path& path, absl::Time t) {
  const timespec ts = absl::ToTimespec(t);
  const timespec times[2] = {ts, ts};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

void WriteFileOfSize(const fs::path& path, size_t n) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << std::string(n, 'x');
}

// A pid no process has: a child that exited and was reaped.
pid_t DeadPid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

std::shared_ptr<storage::ObjectStore> OpenLocal(const fs::path& dir) {
  StatusOr<std::unique_ptr<storage::ObjectStore>> opened = storage::OpenObjectStore("file://" + dir.string());
  EXPECT_THAT(opened, IsOk());
  if (!opened.ok()) return nullptr;
  return std::shared_ptr<storage::ObjectStore>(std::move(opened).value());
}

// `kill -9` during a shard write left a 2 MiB temporary
// file that no restart removed. A (re)started logger removes the temporary
// files of dead writers under its prefix, counts them, and leaves a live
// writer's in-progress file, other prefixes and finished shards alone.
TEST(ExperienceLoggerTest, StartRemovesStaleTemporaryShardsOfDeadWriters) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  std::shared_ptr<storage::ObjectStore> store = OpenLocal(tmp.path());
  ASSERT_NE(store, nullptr);
  const fs::path day = tmp.path() / "experience" / "2026-01-02";
  // What a coordinator killed mid-Put() leaves: .<shard>.tmp-<pid>-<n>, last
  // written before this process started.
  const fs::path stale = day / (".host-1-20260102T030405Z-00000007.lexp.tmp-" + std::to_string(DeadPid()) + "-0");
  WriteFileOfSize(stale, 2 << 20);
  SetModified(stale, absl::Now() - absl::Hours(1));
  const fs::path other_prefix = tmp.path() / "policies" / (".p.json.tmp-" + std::to_string(DeadPid()) + "-0");
  WriteFileOfSize(other_prefix, 3);
  SetModified(other_prefix, absl::Now() - absl::Hours(1));
  ASSERT_THAT(store->Put("experience/2026-01-02/old-00000000.lexp", "shard"), IsOk());
  // A live writer (this process) with a shard in progress.
  auto live = file::AtomicFileWriter::Create((day / "live-00000000.lexp").string());
  ASSERT_THAT(live, IsOk());
  ASSERT_THAT((*live)->Append("half a shard"), IsOk());

  StatusOr<std::unique_ptr<ExperienceLogger>> logger = ExperienceLogger::Create(store, SmallOptions());
  ASSERT_THAT(logger, IsOk());
  const ExperienceLoggerCounters c = (*logger)->counters();
  EXPECT_EQ(c.stale_temp_files_removed, 1);
  EXPECT_EQ(c.stale_temp_bytes_removed, 2 << 20);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists((*live)->temp_path()));
  EXPECT_TRUE(fs::exists(other_prefix));
  EXPECT_EQ(*store->Get("experience/2026-01-02/old-00000000.lexp"), "shard");
  ASSERT_THAT((*live)->Commit(), IsOk());
  ASSERT_THAT((*logger)->Close(), IsOk());
}

// Shards older than max_age go; then the oldest until the rest fit in
// max_total_bytes; objects that are not shards are never counted or
// touched; a disabled policy deletes nothing.
TEST(RetentionTest, DeletesOldestShardsFirstByAgeThenSize) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  std::shared_ptr<storage::ObjectStore> store = OpenLocal(tmp.path());
  ASSERT_NE(store, nullptr);
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  const fs::path root = tmp.path() / "exp";
  // Key order differs from age order on purpose.
  const std::vector<std::pair<std::string, int>> shards = {
      {"d1/a-00000009.lexp", 10}, {"d1/b-00000000.lexp", 6}, {"d2/a-00000001.lexp", 4},
      {"d2/c-00000000.lexp", 2},  {"d3/a-00000002.lexp", 1}};  // name, age in days
  for (const auto& [name, days] : shards) {
    WriteFileOfSize(root / name, 1000);
    SetModified(root / name, now - absl::Hours(24 * days));
  }
  WriteFileOfSize(root / "notes.txt", 5000);
  SetModified(root / "notes.txt", now - absl::Hours(24 * 30));

  RetentionPolicy off;
  StatusOr<RetentionResult> r = ApplyRetention(*store, "exp/", off, now);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->shards_deleted, 0);

  RetentionPolicy age;
  age.max_age = absl::Hours(24 * 7);
  r = ApplyRetention(*store, "exp/", age, now);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->shards_deleted, 1);
  EXPECT_EQ(r->bytes_deleted, 1000);
  EXPECT_EQ(r->shards_kept, 4);
  EXPECT_EQ(r->bytes_kept, 4000);
  EXPECT_FALSE(fs::exists(root / "d1/a-00000009.lexp"));

  RetentionPolicy size;
  size.max_total_bytes = 2500;
  r = ApplyRetention(*store, "exp/", size, now);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->shards_deleted, 2);  // the 6- and 4-day-old ones
  EXPECT_EQ(r->bytes_kept, 2000);
  EXPECT_FALSE(fs::exists(root / "d1/b-00000000.lexp"));
  EXPECT_FALSE(fs::exists(root / "d2/a-00000001.lexp"));
  EXPECT_TRUE(fs::exists(root / "d2/c-00000000.lexp"));
  EXPECT_TRUE(fs::exists(root / "d3/a-00000002.lexp"));
  EXPECT_TRUE(fs::exists(root / "notes.txt"));

  RetentionPolicy bad;
  bad.max_total_bytes = -1;
  EXPECT_THAT(ApplyRetention(*store, "exp/", bad, now), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ApplyRetention(*store, "../", size, now), StatusIs(StatusCode::kInvalidArgument));
}

// Experience grew without bound. The logger applies
// its retention policy when it starts and then after a shard is published
// once retention_interval has passed on its clock (a FakeClock here: time
// decides, not sleeps), deleting shards of any writer under its prefix.
TEST(ExperienceLoggerTest, AppliesRetentionWhenStartingAndPeriodically) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  std::shared_ptr<storage::ObjectStore> store = OpenLocal(tmp.path());
  ASSERT_NE(store, nullptr);
  const absl::Time start = absl::Now();  // file times are real; the clock starts at them
  lede::testing::FakeClock clock(start);
  const fs::path day = tmp.path() / "experience" / "2026-01-01";
  WriteFileOfSize(day / "old-00000000.lexp", 100);
  SetModified(day / "old-00000000.lexp", start - absl::Hours(24 * 10));
  WriteFileOfSize(day / "old-00000001.lexp", 100);
  SetModified(day / "old-00000001.lexp", start - absl::Hours(24 * 5));

  ExperienceLoggerOptions o = SmallOptions();
  o.clock = &clock;
  o.retention.max_age = absl::Hours(24 * 7);
  o.retention_interval = absl::Hours(1);
  std::atomic<int64_t> reported_deleted{0};
  o.on_counters = [&](const ExperienceLoggerCounters& c) { reported_deleted = c.shards_deleted; };
  StatusOr<std::unique_ptr<ExperienceLogger>> logger = ExperienceLogger::Create(store, o);
  ASSERT_THAT(logger, IsOk());
  ExperienceLogger& l = **logger;
  // The start-up pass removes the 10-day-old shard.
  ASSERT_TRUE(l.Log(MakeRecord(0)));
  ASSERT_THAT(l.Flush(), IsOk());
  EXPECT_EQ(l.counters().shards_deleted, 1);
  EXPECT_EQ(l.counters().bytes_deleted, 100);
  EXPECT_FALSE(fs::exists(day / "old-00000000.lexp"));
  EXPECT_TRUE(fs::exists(day / "old-00000001.lexp"));

  // Three days on, the 5-day-old shard is 8 days old: the pass after the
  // next publish deletes it; the logger's own new shards stay.
  clock.Advance(absl::Hours(24 * 3));
  ASSERT_TRUE(l.Log(MakeRecord(1)));
  ASSERT_THAT(l.Flush(), IsOk());
  EXPECT_EQ(l.counters().shards_deleted, 2);
  EXPECT_FALSE(fs::exists(day / "old-00000001.lexp"));

  // Within retention_interval of the last pass, no pass runs ...
  WriteFileOfSize(day / "late-00000000.lexp", 100);
  SetModified(day / "late-00000000.lexp", clock.Now() - absl::Hours(24 * 8));
  clock.Advance(absl::Minutes(10));
  ASSERT_TRUE(l.Log(MakeRecord(2)));
  ASSERT_THAT(l.Flush(), IsOk());
  EXPECT_EQ(l.counters().shards_deleted, 2);
  EXPECT_TRUE(fs::exists(day / "late-00000000.lexp"));
  // ... and once it has passed, the next publish runs one.
  clock.Advance(absl::Hours(1));
  ASSERT_TRUE(l.Log(MakeRecord(3)));
  ASSERT_THAT(l.Flush(), IsOk());
  EXPECT_EQ(l.counters().shards_deleted, 3);
  EXPECT_FALSE(fs::exists(day / "late-00000000.lexp"));
  EXPECT_EQ(reported_deleted.load(), 3);
  ASSERT_THAT(l.Close(), IsOk());
  EXPECT_EQ(l.counters().shards_written, 4);
  ExpectSameTransitions(ReadAllClean(*store, "experience"), MakeTransitions(0, 4));
}

// Bad retention options are invalid arguments at Create().
TEST(ExperienceLoggerTest, RejectsBadRetentionOptions) {
  auto store = std::make_shared<FakeStore>();
  ExperienceLoggerOptions o = SmallOptions();
  o.retention.max_age = absl::Seconds(-1);
  EXPECT_THAT(ExperienceLogger::Create(store, o), StatusIs(StatusCode::kInvalidArgument));
  o = SmallOptions();
  o.retention.max_total_bytes = o.max_shard_bytes - 1;
  EXPECT_THAT(ExperienceLogger::Create(store, o), StatusIs(StatusCode::kInvalidArgument));
  o = SmallOptions();
  o.retention_interval = absl::ZeroDuration();
  EXPECT_THAT(ExperienceLogger::Create(store, o), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lede::experience
