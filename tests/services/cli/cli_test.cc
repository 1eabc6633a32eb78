// Tests of services/cli/commands.h: `lede generate --samples` (used to sample
// synthetic training stories) prints one text per seed, each reproducible by
// a single run with that seed, and refuses bad sample flags.
#include "services/cli/commands.h"

#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/shared_dir.h"

namespace lede::cli {
namespace {

std::vector<std::string> GenerateArgs(int64_t seed) {
  return {"--model", ::lede::testing::SharedDir() + "/models/stories260K", "--prompt", "Once upon a time",
          "--mode", "ar", "--max-new-tokens", "24", "--temperature", "0.9", "--seed", std::to_string(seed),
          "--threads", "1"};
}

std::vector<std::string> Split(const std::string& text, const std::string& separator_line) {
  std::vector<std::string> parts;
  size_t begin = 0;
  for (size_t at; (at = text.find(separator_line, begin)) != std::string::npos; begin = at + separator_line.size()) {
    parts.push_back(text.substr(begin, at - begin));
  }
  parts.push_back(text.substr(begin));
  return parts;
}

TEST(GenerateTest, SamplesAreTheSingleRunsOfConsecutiveSeeds) {
  std::vector<std::string> args = GenerateArgs(7);
  args.insert(args.end(), {"--samples", "3", "--separator", "<|doc|>"});
  std::ostringstream out, err;
  ASSERT_EQ(RunGenerate(args, out, err), 0) << err.str();
  const std::vector<std::string> parts = Split(out.str(), "<|doc|>\n");
  ASSERT_EQ(parts.size(), 4u) << out.str();  // three texts, each followed by the separator line
  EXPECT_EQ(parts[3], "");
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(parts[i].rfind("Once upon a time", 0), 0u) << parts[i];
    std::ostringstream single, single_err;
    ASSERT_EQ(RunGenerate(GenerateArgs(7 + i), single, single_err), 0) << single_err.str();
    EXPECT_EQ(parts[i], single.str()) << "sample " << i;
  }
  EXPECT_NE(parts[0], parts[1]);
}

TEST(GenerateTest, RejectsBadSampleCounts) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--samples", "0"}, std::vector<std::string>{"--samples", "2", "--repeat", "2"}}) {
    std::vector<std::string> args = GenerateArgs(1);
    args.insert(args.end(), extra.begin(), extra.end());
    std::ostringstream out, err;
    EXPECT_EQ(RunGenerate(args, out, err), 2);
    EXPECT_NE(err.str().find("--samples"), std::string::npos) << err.str();
    EXPECT_EQ(out.str(), "");
  }
}

}  // namespace
}  // namespace lede::cli
