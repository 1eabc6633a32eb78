// shared/file: ReadFile and the atomic write (AtomicFileWriter,
// WriteFileAtomically).
#include "shared/file/file.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::file {
namespace {

namespace fs = std::filesystem;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

// The names in `dir`, sorted.
std::vector<std::string> Entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(tmp_.path().empty()); }
  std::string Path(const std::string& name) const { return (tmp_.path() / name).string(); }
  lede::testing::TempDir tmp_;
};

// A new file gets exactly the bytes written, binary zeros included.
TEST_F(FileTest, WriteCreatesFileWithContent) {
  const std::string bytes("a\0b\nc", 5);
  ASSERT_THAT(WriteFileAtomically(Path("x.bin"), bytes), IsOk());
  StatusOr<std::string> read = ReadFile(Path("x.bin"));
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, bytes);
}

// Writing over an existing file replaces its content (a shorter new content
// leaves no tail of the old one) and leaves no temporary file behind.
TEST_F(FileTest, WriteReplacesContentAndLeavesNoTemporaryFile) {
  ASSERT_THAT(WriteFileAtomically(Path("f.json"), "old content, long"), IsOk());
  ASSERT_THAT(WriteFileAtomically(Path("f.json"), "new"), IsOk());
  EXPECT_EQ(*ReadFile(Path("f.json")), "new");
  EXPECT_EQ(Entries(tmp_.path()), std::vector<std::string>{"f.json"});
}

// Pieces appended to a writer appear only at Commit(); until then the
// destination keeps its old content and the temporary file is hidden.
TEST_F(FileTest, WriterPublishesOnlyOnCommit) {
  ASSERT_THAT(WriteFileAtomically(Path("s"), "before"), IsOk());
  StatusOr<std::unique_ptr<AtomicFileWriter>> out = AtomicFileWriter::Create(Path("s"));
  ASSERT_THAT(out, IsOk());
  ASSERT_THAT((*out)->Append("one,"), IsOk());
  ASSERT_THAT((*out)->Append("two", 3), IsOk());
  EXPECT_EQ(*ReadFile(Path("s")), "before");
  EXPECT_EQ(fs::path((*out)->temp_path()).parent_path(), tmp_.path());
  EXPECT_EQ(fs::path((*out)->temp_path()).filename().string().front(), '.');
  EXPECT_TRUE(fs::exists((*out)->temp_path()));
  ASSERT_THAT((*out)->Commit(), IsOk());
  EXPECT_EQ(*ReadFile(Path("s")), "one,two");
  EXPECT_EQ(Entries(tmp_.path()), std::vector<std::string>{"s"});
  EXPECT_THAT((*out)->Commit(), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT((*out)->Append("x"), StatusIs(StatusCode::kFailedPrecondition));
}

// A writer destroyed without Commit() removes its temporary file and leaves
// the destination as it was.
TEST_F(FileTest, AbandonedWriterLeavesDestinationUnchanged) {
  ASSERT_THAT(WriteFileAtomically(Path("keep"), "kept"), IsOk());
  {
    StatusOr<std::unique_ptr<AtomicFileWriter>> out = AtomicFileWriter::Create(Path("keep"));
    ASSERT_THAT(out, IsOk());
    ASSERT_THAT((*out)->Append("partial"), IsOk());
  }
  EXPECT_EQ(*ReadFile(Path("keep")), "kept");
  EXPECT_EQ(Entries(tmp_.path()), std::vector<std::string>{"keep"});
}

// A destination whose directory cannot hold files fails with kInternal
// naming the path, creates nothing, and leaves the old file intact.
TEST_F(FileTest, UnwritableDirectoryFailsCleanly) {
  // Missing directory.
  Status missing = WriteFileAtomically(Path("no/such/dir/f"), "x");
  EXPECT_THAT(missing, StatusIs(StatusCode::kInternal));
  EXPECT_THAT(std::string(missing.message()), HasSubstr(Path("no/such/dir")));
  // "Directory" that is a regular file (ENOTDIR, refused even for root).
  ASSERT_THAT(WriteFileAtomically(Path("plain"), "p"), IsOk());
  EXPECT_THAT(WriteFileAtomically(Path("plain/f"), "x"), StatusIs(StatusCode::kInternal));
  EXPECT_EQ(Entries(tmp_.path()), std::vector<std::string>{"plain"});
  // A read-only directory (root bypasses permissions, so only when not root).
  if (::geteuid() != 0) {
    const fs::path ro = tmp_.path() / "ro";
    fs::create_directory(ro);
    ASSERT_THAT(WriteFileAtomically((ro / "f").string(), "old"), IsOk());
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_THAT(WriteFileAtomically((ro / "f").string(), "new"), StatusIs(StatusCode::kInternal));
    fs::permissions(ro, fs::perms::owner_all);
    EXPECT_EQ(*ReadFile((ro / "f").string()), "old");
    EXPECT_EQ(Entries(ro), std::vector<std::string>{"f"});
  }
}

// ReadFile of a missing file or a directory is kNotFound.
TEST_F(FileTest, ReadMissingFileIsNotFound) {
  EXPECT_THAT(ReadFile(Path("absent")), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(ReadFile(tmp_.path().string()), StatusIs(StatusCode::kNotFound));
}

}  // namespace
}  // namespace lede::file
