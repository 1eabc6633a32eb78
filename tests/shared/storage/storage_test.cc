// File: tests/shared/storage/storage_test.cc
//
// Tests for shared/storage: key and URL validation, the local-directory
// backend (round trips, List prefix/sort, hidden temporary files, NotFound)
// and the S3 backend against a real S3 server on loopback (s3rver; skipped
// with the reason when it is not installed).
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/file/file.h"
#include "shared/storage/local_store.h"
#include "shared/storage/object_store.h"
#include "shared/storage/s3_store.h"
#include "tests/testing/s3rver.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::storage {
namespace {

namespace fs = std::filesystem;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<std::string> Keys(const std::vector<ObjectInfo>& objects) {
  std::vector<std::string> keys;
  for (const ObjectInfo& o : objects) keys.push_back(o.key);
  return keys;
}

// Sets an environment variable for the life of the object, restoring it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

// Valid keys pass; empty keys, "..", leading '/', empty and hidden
// components are invalid arguments.
TEST(ObjectKeyTest, RejectsBadKeys) {
  EXPECT_THAT(ValidateKey("a"), IsOk());
  EXPECT_THAT(ValidateKey("experience/2024-05-01/w-00000001.lexp"), IsOk());
  for (const char* bad : {"", "..", "a/../b", "/a", "a//b", "a/", ".hidden", "a/.b", "./a"}) {
    EXPECT_THAT(ValidateKey(bad), StatusIs(StatusCode::kInvalidArgument)) << bad;
  }
  EXPECT_THAT(ValidateKey(std::string("a\0b", 3)), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidatePrefix(""), IsOk());
  EXPECT_THAT(ValidatePrefix("a/"), IsOk());
  EXPECT_THAT(ValidatePrefix("a/b"), IsOk());
  EXPECT_THAT(ValidatePrefix("/a"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidatePrefix("../a"), StatusIs(StatusCode::kInvalidArgument));
}

// Malformed URLs are invalid arguments whose message names the URL.
TEST(OpenObjectStoreTest, RejectsBadUrlsNamingThem) {
  for (const char* bad : {"", "ftp://x/y", "file://relative/dir", "file://", "s3://", "s3:///prefix",
                          "s3://UPPER/p", "s3://ab", "s3://bucket/p?color=red", "s3://bucket/p?region",
                          "s3://bucket/p?max_keys=0", "s3://bucket/p?max_keys=x",
                          "s3://bucket/p?endpoint=localhost:9000", "s3://bucket/a/../b"}) {
    StatusOr<std::unique_ptr<ObjectStore>> store = OpenObjectStore(bad);
    EXPECT_THAT(store, StatusIs(StatusCode::kInvalidArgument)) << bad;
    if (!store.ok()) {
      EXPECT_THAT(std::string(store.status().message()), HasSubstr(bad));
    }
  }
}

// S3 options come from the URL first, then the environment; url() shows
// them without credentials and reopens the same store.
TEST(OpenObjectStoreTest, S3OptionsFromUrlAndEnvironment) {
  ScopedEnv key("AWS_ACCESS_KEY_ID", "AK"), secret("AWS_SECRET_ACCESS_KEY", "SK");
  ScopedEnv token("AWS_SESSION_TOKEN", "TOK"), endpoint("AWS_ENDPOINT_URL", "http://env:9000");
  ScopedEnv endpoint_s3("AWS_ENDPOINT_URL_S3", nullptr);
  ScopedEnv region("AWS_REGION", nullptr), default_region("AWS_DEFAULT_REGION", "eu-west-3");

  StatusOr<std::unique_ptr<ObjectStore>> a = OpenObjectStore("s3://my-bucket/some/prefix/");
  ASSERT_THAT(a, IsOk());
  const S3Options& o = dynamic_cast<S3Store&>(**a).options();
  EXPECT_EQ(o.bucket, "my-bucket");
  EXPECT_EQ(o.prefix, "some/prefix");
  EXPECT_EQ(o.endpoint, "http://env:9000");
  EXPECT_EQ(o.region, "eu-west-3");
  EXPECT_EQ(o.access_key_id, "AK");
  EXPECT_EQ(o.secret_access_key, "SK");
  EXPECT_EQ(o.session_token, "TOK");
  EXPECT_EQ(o.max_keys, 1000);
  EXPECT_THAT((*a)->url(), ::testing::Not(HasSubstr("SK")));

  StatusOr<std::unique_ptr<ObjectStore>> b =
      OpenObjectStore("s3://my-bucket?endpoint=http://127.0.0.1:4569&region=us-east-1&max_keys=2");
  ASSERT_THAT(b, IsOk());
  const S3Options& p = dynamic_cast<S3Store&>(**b).options();
  EXPECT_EQ(p.prefix, "");
  EXPECT_EQ(p.endpoint, "http://127.0.0.1:4569");
  EXPECT_EQ(p.region, "us-east-1");
  EXPECT_EQ(p.max_keys, 2);
  StatusOr<std::unique_ptr<ObjectStore>> c = OpenObjectStore((*b)->url());
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ((*c)->url(), (*b)->url());
}

// Only one of the two AWS keys set is a configuration error.
TEST(OpenObjectStoreTest, HalfOfTheCredentialsIsInvalid) {
  ScopedEnv key("AWS_ACCESS_KEY_ID", "AK"), secret("AWS_SECRET_ACCESS_KEY", nullptr);
  EXPECT_THAT(OpenObjectStore("s3://my-bucket/p"), StatusIs(StatusCode::kInvalidArgument));
}

// SigV4 canonical encoding keeps unreserved characters (and '/' in paths).
TEST(SigV4EncodeTest, EncodesLikeCanonicalRequests) {
  EXPECT_EQ(SigV4Encode("a/b c+d=e~f_g.h-i", true), "a/b%20c%2Bd%3De~f_g.h-i");
  EXPECT_EQ(SigV4Encode("a/b", false), "a%2Fb");
  EXPECT_EQ(SigV4Encode("\xc3\xa9", true), "%C3%A9");
}

class LocalStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    root_ = (tmp_.path() / "store").string();
    StatusOr<std::unique_ptr<ObjectStore>> store = OpenObjectStore("file://" + root_);
    ASSERT_THAT(store, IsOk());
    store_ = std::move(store).value();
  }
  lede::testing::TempDir tmp_;
  std::string root_;
  std::unique_ptr<ObjectStore> store_;
};

// file:// and plain paths open (and create) a local directory; url() is the
// file:// URL of its absolute root.
TEST_F(LocalStoreTest, OpensAndCreatesDirectories) {
  EXPECT_TRUE(fs::is_directory(root_));
  EXPECT_EQ(store_->url(), "file://" + root_);
  const std::string plain = (tmp_.path() / "a" / "b").string();
  StatusOr<std::unique_ptr<ObjectStore>> s = OpenObjectStore(plain);
  ASSERT_THAT(s, IsOk());
  EXPECT_TRUE(fs::is_directory(plain));
  // A regular file where the directory should be is refused.
  std::ofstream(tmp_.path() / "f") << "x";
  EXPECT_THAT(OpenObjectStore((tmp_.path() / "f").string()), StatusIs(StatusCode::kInternal));
}

// Put then Get returns the same bytes (binary, empty and replaced objects
// included), in nested folders.
TEST_F(LocalStoreTest, PutGetRoundTrip) {
  const std::string binary("\0\x01\xff payload\n", 12);
  ASSERT_THAT(store_->Put("a/b/c.bin", binary), IsOk());
  ASSERT_THAT(store_->Put("empty", ""), IsOk());
  EXPECT_EQ(*store_->Get("a/b/c.bin"), binary);
  EXPECT_EQ(*store_->Get("empty"), "");
  ASSERT_THAT(store_->Put("a/b/c.bin", "v2"), IsOk());
  EXPECT_EQ(*store_->Get("a/b/c.bin"), "v2");
  EXPECT_TRUE(fs::is_regular_file(fs::path(root_) / "a/b/c.bin"));
}

// Objects hold users' data: never world-readable, whatever the umask
// allows (shards were created 0644).
TEST_F(LocalStoreTest, ObjectsAreNotWorldReadable) {
  ASSERT_THAT(store_->Put("experience/2026-12-04/w-00000001.shard", "records"), IsOk());
  const fs::perms p = fs::status(fs::path(root_) / "experience/2026-12-04/w-00000001.shard").permissions();
  EXPECT_EQ(p & fs::perms::others_all, fs::perms::none);
  EXPECT_EQ(p & fs::perms::group_write, fs::perms::none);
  EXPECT_NE(p & fs::perms::owner_read, fs::perms::none);
}

// A missing object is kNotFound; Delete removes it and is idempotent.
TEST_F(LocalStoreTest, NotFoundAndDelete) {
  EXPECT_THAT(store_->Get("nope"), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(store_->Get("a/nope"), StatusIs(StatusCode::kNotFound));
  ASSERT_THAT(store_->Put("a/x", "1"), IsOk());
  EXPECT_THAT(store_->Delete("a/x"), IsOk());
  EXPECT_THAT(store_->Get("a/x"), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(store_->Delete("a/x"), IsOk());
  EXPECT_THAT(store_->Delete("never/was"), IsOk());
}

// Bad keys are refused by every method.
TEST_F(LocalStoreTest, BadKeysAreInvalidArguments) {
  EXPECT_THAT(store_->Put("../escape", "x"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->Put("/abs", "x"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->Put("", "x"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->Get("a/../b"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->Delete(".."), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->List("../"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_FALSE(fs::exists(tmp_.path() / "escape"));
}

// List returns keys under a string prefix, sorted, with sizes, and skips
// hidden (temporary) files and folders.
TEST_F(LocalStoreTest, ListFiltersByPrefixSortsAndSkipsTemporaryFiles) {
  ASSERT_THAT(store_->Put("exp/2024-05-02/b.lexp", "bb"), IsOk());
  ASSERT_THAT(store_->Put("exp/2024-05-01/a.lexp", "a"), IsOk());
  ASSERT_THAT(store_->Put("exp/2024-05-01/c.lexp", "ccc"), IsOk());
  ASSERT_THAT(store_->Put("expert/z", "z"), IsOk());
  ASSERT_THAT(store_->Put("other", "o"), IsOk());
  // What a writer killed mid-Put leaves behind, and a hidden folder.
  std::ofstream(fs::path(root_) / "exp/2024-05-01/.d.lexp.tmp-1-0") << "partial";
  fs::create_directories(fs::path(root_) / "exp/.hidden");
  std::ofstream(fs::path(root_) / "exp/.hidden/e.lexp") << "e";

  StatusOr<std::vector<ObjectInfo>> all = store_->List("");
  ASSERT_THAT(all, IsOk());
  EXPECT_THAT(Keys(*all), ElementsAre("exp/2024-05-01/a.lexp", "exp/2024-05-01/c.lexp",
                                      "exp/2024-05-02/b.lexp", "expert/z", "other"));
  EXPECT_EQ((*all)[1].size_bytes, 3);

  StatusOr<std::vector<ObjectInfo>> folder = store_->List("exp/");
  ASSERT_THAT(folder, IsOk());
  EXPECT_THAT(Keys(*folder), ElementsAre("exp/2024-05-01/a.lexp", "exp/2024-05-01/c.lexp",
                                         "exp/2024-05-02/b.lexp"));
  StatusOr<std::vector<ObjectInfo>> partial = store_->List("exp/2024-05-0");
  ASSERT_THAT(partial, IsOk());
  EXPECT_EQ(partial->size(), 3u);
  EXPECT_THAT(Keys(*store_->List("exp")), ElementsAre("exp/2024-05-01/a.lexp", "exp/2024-05-01/c.lexp",
                                                      "exp/2024-05-02/b.lexp", "expert/z"));
  EXPECT_THAT(Keys(*store_->List("exp/2024-05-01/c")), ElementsAre("exp/2024-05-01/c.lexp"));
  EXPECT_THAT(*store_->List("missing/"), IsEmpty());
}

// A Put leaves no temporary file behind.
TEST_F(LocalStoreTest, PutLeavesNoTemporaryFiles) {
  ASSERT_THAT(store_->Put("d/x", std::string(1 << 20, 'x')), IsOk());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fs::path(root_) / "d")) names.push_back(e.path().filename());
  EXPECT_THAT(names, ElementsAre("x"));
}

// A pid that no process has: a child that already exited and was reaped.
pid_t DeadPid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

// Sets the modification time of `path` to `seconds_ago` before now.
void Age(const std::string& path, int seconds_ago) {
  struct timespec times[2];
  ::clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= seconds_ago;
  times[1] = times[0];
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

void WriteBytes(const std::string& path, size_t n) {
  std::ofstream(path, std::ios::binary) << std::string(n, 't');
}

// Sets the modification time of `path` to `t` (nanosecond precision).
void SetModified(const std::string& path, std::chrono::system_clock::time_point t) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  struct timespec times[2];
  times[0].tv_sec = static_cast<time_t>(ns / 1000000000);
  times[0].tv_nsec = static_cast<long>(ns % 1000000000);
  times[1] = times[0];
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

// The writer of a temporary file is read from its name; other names are not
// temporaries.
TEST(TempFileWriterPidTest, ParsesAtomicWriterNames) {
  EXPECT_EQ(file::TempFileWriterPid(".w-00000001.lexp.tmp-4242-7"), 4242);
  EXPECT_EQ(file::TempFileWriterPid(".a.tmp-1-0"), 1);
  for (const char* not_temp : {"w-00000001.lexp", ".tmp-1-2", ".a.tmp-", ".a.tmp-12", ".a.tmp-x-1", ".a.tmp-1-",
                               ".a.tmp-1-2x", "a.tmp-1-2", "", ".", ".a.tmp-99999999999999999999-1"}) {
    EXPECT_EQ(file::TempFileWriterPid(not_temp), -1) << not_temp;
  }
}

// A writer killed moments before this process started (a supervisor's
// kill -9 and restart within one second; the chaos test found it) left a
// file modified in the same second as this process's start: it is still
// older than this process, so it is removed. (Whole seconds kept it until
// some later restart.) A dead writer's file modified after the start stays.
TEST_F(LocalStoreTest, RemovesTemporaryOfWriterKilledJustBeforeThisStart) {
  const fs::path dir = fs::path(root_) / "experience" / "2026-01-03";
  fs::create_directories(dir);
  const std::string just_before = (dir / (".a.lexp.tmp-" + std::to_string(DeadPid()) + "-0")).string();
  WriteBytes(just_before, 7);
  SetModified(just_before, file::ProcessStartTime() - std::chrono::milliseconds(1));
  const std::string just_after = (dir / (".b.lexp.tmp-" + std::to_string(DeadPid()) + "-0")).string();
  WriteBytes(just_after, 5);
  SetModified(just_after, file::ProcessStartTime() + std::chrono::milliseconds(1));

  StatusOr<StaleTemporaries> removed = store_->RemoveStaleTemporaries("experience/");
  ASSERT_THAT(removed, IsOk());
  EXPECT_EQ(removed->files, 1);
  EXPECT_FALSE(fs::exists(just_before));
  EXPECT_TRUE(fs::exists(just_after));
}

// A writer killed by SIGKILL in the middle of a Put()
// leaves its temporary file (2 MiB here); RemoveStaleTemporaries() at the
// next start removes it, while the in-progress file of a live writer (this
// process, or another live process even with an old mtime), visible
// objects and other hidden files stay.
TEST_F(LocalStoreTest, RemovesStaleTemporariesOfDeadWritersOnly) {
  const fs::path dir = fs::path(root_) / "experience" / "2026-01-02";
  fs::create_directories(dir);
  // A killed writer: a child starts an atomic write of a shard, appends
  // 2 MiB and is killed before Commit().
  const std::string shard = (dir / "w-00000003.lexp").string();
  const pid_t child = ::fork();
  if (child == 0) {
    auto out = file::AtomicFileWriter::Create(shard);
    if (!out.ok() || !(*out)->Append(std::string(2 << 20, 's')).ok()) ::_exit(1);
    ::raise(SIGKILL);
    ::_exit(2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  std::vector<fs::path> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path());
  ASSERT_EQ(left.size(), 1u) << "the killed writer left no temporary file";
  const std::string killed = left[0].string();
  EXPECT_EQ(file::TempFileWriterPid(left[0].filename().string()), child);
  EXPECT_EQ(fs::file_size(killed), size_t{2} << 20);
  // The kill happened before this (restarted) process started.
  Age(killed, 3600);
  // Another dead writer's file deeper down, also old.
  fs::create_directories(dir / "sub");
  const std::string dead = (dir / "sub" / (".x.lexp.tmp-" + std::to_string(DeadPid()) + "-0")).string();
  WriteBytes(dead, 10);
  Age(dead, 3600);
  // A live writer of this process, in progress now.
  auto live = file::AtomicFileWriter::Create((dir / "w-00000004.lexp").string());
  ASSERT_THAT(live, IsOk());
  ASSERT_THAT((*live)->Append("in progress"), IsOk());
  // A live writer of another process (our parent) that has been at it for
  // an hour: its pid is alive, so it stays.
  const std::string other_live = (dir / (".y.lexp.tmp-" + std::to_string(::getppid()) + "-0")).string();
  WriteBytes(other_live, 5);
  Age(other_live, 3600);
  // A dead writer's file newer than this process: not provably stale yet.
  const std::string young = (dir / (".z.lexp.tmp-" + std::to_string(DeadPid()) + "-0")).string();
  WriteBytes(young, 5);
  // Visible objects and other hidden files are never touched.
  ASSERT_THAT(store_->Put("experience/2026-01-02/w-00000001.lexp", "done"), IsOk());
  const std::string hidden = (dir / ".keep").string();
  WriteBytes(hidden, 1);
  Age(hidden, 3600);

  StatusOr<StaleTemporaries> removed = store_->RemoveStaleTemporaries("experience/");
  ASSERT_THAT(removed, IsOk());
  EXPECT_EQ(removed->files, 2);
  EXPECT_EQ(removed->bytes, (int64_t{2} << 20) + 10);
  EXPECT_FALSE(fs::exists(killed));
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists((*live)->temp_path()));
  EXPECT_TRUE(fs::exists(other_live));
  EXPECT_TRUE(fs::exists(young));
  EXPECT_TRUE(fs::exists(hidden));
  EXPECT_EQ(*store_->Get("experience/2026-01-02/w-00000001.lexp"), "done");
  ASSERT_THAT((*live)->Commit(), IsOk());
  EXPECT_EQ(*store_->Get("experience/2026-01-02/w-00000004.lexp"), "in progress");
  // A second pass finds nothing; a prefix outside the folder sees nothing.
  EXPECT_EQ(store_->RemoveStaleTemporaries("experience/")->files, 0);
  EXPECT_EQ(store_->RemoveStaleTemporaries("nothing/")->files, 0);
  EXPECT_THAT(store_->RemoveStaleTemporaries("../x/"), StatusIs(StatusCode::kInvalidArgument));
}

// List() reports each object's modification time.
TEST_F(LocalStoreTest, ListReportsModificationTimes) {
  ASSERT_THAT(store_->Put("a", "1"), IsOk());
  Age(root_ + "/a", 7200);
  StatusOr<std::vector<ObjectInfo>> listed = store_->List("");
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), 1u);
  const absl::Duration age = absl::Now() - (*listed)[0].modified;
  EXPECT_GE(age, absl::Seconds(7100));
  EXPECT_LE(age, absl::Seconds(7300 + 3600));
}

// ---------------------------------------------------------------------------
// S3 against s3rver

class S3StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!s3_.available()) GTEST_SKIP() << s3_.skip_reason();
    ASSERT_THAT(s3_.Start("lede-test"), IsOk());
  }
  StatusOr<std::unique_ptr<ObjectStore>> Open(const std::string& prefix, const std::string& extra = "") {
    return OpenObjectStore("s3://lede-test/" + prefix + "?endpoint=" + s3_.endpoint() +
                           "&region=us-east-1" + extra);
  }
  lede::testing::S3rver s3_;
  ScopedEnv key_{"AWS_ACCESS_KEY_ID", "S3RVER"};
  ScopedEnv secret_{"AWS_SECRET_ACCESS_KEY", "S3RVER"};
  ScopedEnv token_{"AWS_SESSION_TOKEN", nullptr};
};

// Put/Get/List (paginated, 2 keys a page)/Delete/NotFound through a real S3
// server, with keys that need URL encoding; the store prefix isolates keys.
TEST_F(S3StoreTest, RoundTripListPaginationDeleteAndNotFound) {
  StatusOr<std::unique_ptr<ObjectStore>> opened = Open("prefix", "&max_keys=2");
  ASSERT_THAT(opened, IsOk());
  ObjectStore& store = **opened;
  const std::string binary("\0\x01\xff bytes", 9);
  ASSERT_THAT(store.Put("exp/2024-05-01/w-00000002.lexp", binary), IsOk());
  ASSERT_THAT(store.Put("exp/2024-05-01/w-00000001.lexp", "one"), IsOk());
  ASSERT_THAT(store.Put("exp/2024-05-02/w-00000003.lexp", "three"), IsOk());
  ASSERT_THAT(store.Put("exp/odd name+plus=eq&amp%.lexp", "odd"), IsOk());
  ASSERT_THAT(store.Put("other/x", "x"), IsOk());
  StatusOr<std::unique_ptr<ObjectStore>> outside = Open("elsewhere");
  ASSERT_THAT(outside, IsOk());
  ASSERT_THAT((*outside)->Put("exp/not-mine", "n"), IsOk());

  EXPECT_EQ(*store.Get("exp/2024-05-01/w-00000002.lexp"), binary);
  EXPECT_EQ(*store.Get("exp/odd name+plus=eq&amp%.lexp"), "odd");

  StatusOr<std::vector<ObjectInfo>> listed = store.List("exp/");
  ASSERT_THAT(listed, IsOk());
  EXPECT_THAT(Keys(*listed), ElementsAre("exp/2024-05-01/w-00000001.lexp", "exp/2024-05-01/w-00000002.lexp",
                                         "exp/2024-05-02/w-00000003.lexp", "exp/odd name+plus=eq&amp%.lexp"));
  EXPECT_EQ((*listed)[1].size_bytes, 9);
  EXPECT_NE((*listed)[1].modified, absl::InfinitePast()) << "LastModified not parsed";
  EXPECT_EQ(store.List("")->size(), 5u);
  EXPECT_THAT(Keys(*store.List("exp/2024-05-01/w-00000002")), ElementsAre("exp/2024-05-01/w-00000002.lexp"));
  EXPECT_THAT(*store.List("nothing/"), IsEmpty());

  EXPECT_THAT(store.Get("exp/missing"), StatusIs(StatusCode::kNotFound));
  ASSERT_THAT(store.Delete("exp/2024-05-01/w-00000001.lexp"), IsOk());
  EXPECT_THAT(store.Get("exp/2024-05-01/w-00000001.lexp"), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(store.Delete("exp/2024-05-01/w-00000001.lexp"), IsOk());
  EXPECT_EQ(store.List("exp/")->size(), 3u);
  EXPECT_THAT(store.Put("../x", "x"), StatusIs(StatusCode::kInvalidArgument));
}

// Credentials are checked as far as s3rver checks them: an unknown access
// key is refused (403 → kPermissionDenied, with S3's error code in the
// message). s3rver 3.7.1 does not verify SigV4 signatures, so a wrong
// secret with the right key is accepted there (a real S3 refuses it).
TEST_F(S3StoreTest, UnknownAccessKeyIsPermissionDenied) {
  ScopedEnv key("AWS_ACCESS_KEY_ID", "NOT-A-KEY");
  StatusOr<std::unique_ptr<ObjectStore>> store = Open("p");
  ASSERT_THAT(store, IsOk());
  const Status put = (*store)->Put("k", "v");
  EXPECT_THAT(put, StatusIs(StatusCode::kPermissionDenied));
  EXPECT_THAT(std::string(put.message()), HasSubstr("InvalidAccessKeyId"));
  EXPECT_THAT((*store)->List(""), StatusIs(StatusCode::kPermissionDenied));

  ScopedEnv right_key("AWS_ACCESS_KEY_ID", "S3RVER"), wrong_secret("AWS_SECRET_ACCESS_KEY", "wrong");
  StatusOr<std::unique_ptr<ObjectStore>> lax = Open("p");
  ASSERT_THAT(lax, IsOk());
  EXPECT_THAT((*lax)->Put("k", "v"), IsOk()) << "s3rver now verifies SigV4: assert kPermissionDenied here";
}

// A missing bucket is kNotFound; a dead endpoint is kUnavailable.
TEST_F(S3StoreTest, MissingBucketAndDeadEndpoint) {
  StatusOr<std::unique_ptr<ObjectStore>> nobucket =
      OpenObjectStore("s3://no-such-bucket/p?endpoint=" + s3_.endpoint());
  ASSERT_THAT(nobucket, IsOk());
  EXPECT_THAT((*nobucket)->Get("k"), StatusIs(StatusCode::kNotFound));
  const int port = s3_.port();
  s3_.Stop();
  StatusOr<std::unique_ptr<ObjectStore>> dead =
      OpenObjectStore("s3://lede-test/p?endpoint=http://127.0.0.1:" + std::to_string(port));
  ASSERT_THAT(dead, IsOk());
  EXPECT_THAT((*dead)->Put("k", "v"), StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT((*dead)->List(""), StatusIs(StatusCode::kUnavailable));
}

}  // namespace
}  // namespace lede::storage
