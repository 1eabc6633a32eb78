// FlagSet (CLI11 underneath), ExpandConfigFile, and the user-visible reply
// to a bad flag: one line on stderr naming it, exit code 2.
#include "shared/flags/flags.h"

#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::flags {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// One flag of each type, with defaults.
struct Targets {
  std::string model = "default-model";
  int64_t n = 64;
  double temperature = 0.5;
  bool chat = false;
  void AddTo(FlagSet& f) {
    f.Add("model", &model, "checkpoint", /*required=*/false);
    f.Add("max-new-tokens", &n, "tokens to generate");
    f.Add("temperature", &temperature, "0 = greedy");
    f.Add("chat", &chat, "chat mode");
  }
};

// Every flag type parses in both spellings; flags not given keep defaults.
TEST(FlagSetTest, ParsesEveryType) {
  Targets t;
  FlagSet f;
  t.AddTo(f);
  ASSERT_THAT(f.Parse({"--model", "m.bin", "--max-new-tokens=7", "--temperature", "-0.25", "--chat"}), IsOk());
  EXPECT_EQ(t.model, "m.bin");
  EXPECT_EQ(t.n, 7);
  EXPECT_DOUBLE_EQ(t.temperature, -0.25);
  EXPECT_TRUE(t.chat);

  Targets d;
  FlagSet g;
  d.AddTo(g);
  ASSERT_THAT(g.Parse({"--max-new-tokens", "-3"}), IsOk());
  EXPECT_EQ(d.n, -3);
  EXPECT_EQ(d.model, "default-model");
  EXPECT_DOUBLE_EQ(d.temperature, 0.5);
  EXPECT_FALSE(d.chat);
}

// A boolean takes an explicit value after '='; the last occurrence of any
// flag wins (so the command line overrides a config file).
TEST(FlagSetTest, BooleanValuesAndLastOccurrenceWins) {
  Targets t;
  FlagSet f;
  t.AddTo(f);
  ASSERT_THAT(f.Parse({"--chat", "--chat=false", "--max-new-tokens=1", "--max-new-tokens=2"}), IsOk());
  EXPECT_FALSE(t.chat);
  EXPECT_EQ(t.n, 2);
  ASSERT_THAT(f.Parse({"--chat=true"}), IsOk());
  EXPECT_TRUE(t.chat);
}

// Every kind of bad input is one kInvalidArgument line naming the flag.
TEST(FlagSetTest, ErrorsAreOneLineNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string names;
  };
  const std::vector<Case> cases = {
      {{"--bogus", "1"}, "unknown flag --bogus"},
      {{"--bogus=1"}, "unknown flag --bogus"},
      {{"--max-new-tokens", "many"}, "--max-new-tokens"},
      {{"--temperature=warm"}, "--temperature"},
      {{"--chat=maybe"}, "--chat"},
      {{"--model"}, "--model"},
      {{"stray"}, "unexpected argument 'stray'"},
  };
  for (const Case& c : cases) {
    Targets t;
    FlagSet f;
    t.AddTo(f);
    Status s = f.Parse(c.args);
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument)) << c.args.front();
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.names)) << c.args.front();
    EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos) << s.message();
  }
}

// A required flag that is missing is named.
TEST(FlagSetTest, MissingRequiredFlagIsNamed) {
  std::string model;
  FlagSet f;
  f.Add("model", &model, "checkpoint", /*required=*/true);
  Status s = f.Parse({});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--model is required"));
  EXPECT_THAT(f.Parse({"--model=x"}), IsOk());
  // A typo is reported as the unknown flag, not as the required one it missed.
  FlagSet g;
  g.Add("model", &model, "checkpoint", /*required=*/true);
  EXPECT_THAT(std::string(g.Parse({"--modle=x"}).message()), HasSubstr("unknown flag --modle"));
}

// Usage lists every flag with its help and current default.
TEST(FlagSetTest, UsageListsFlagsAndDefaults) {
  Targets t;
  FlagSet f;
  t.AddTo(f);
  const std::string usage = f.Usage();
  EXPECT_THAT(usage, HasSubstr("  --model  checkpoint (default: default-model)\n"));
  EXPECT_THAT(usage, HasSubstr("  --max-new-tokens  tokens to generate (default: 64)\n"));
  EXPECT_THAT(usage, HasSubstr("  --temperature  0 = greedy (default: 0.5)\n"));
  EXPECT_THAT(usage, HasSubstr("  --chat  chat mode\n"));
}

class ConfigFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    EXPECT_FALSE(tmp_.path().empty());
    const std::string path = (tmp_.path() / "x.conf").string();
    std::ofstream(path) << text;
    return path;
  }
  lede::testing::TempDir tmp_;
};

// A config file's lines ("name = value", "name: value", bare booleans,
// comments) come first, the command line after them, so it wins.
TEST_F(ConfigFileTest, FileFlagsComeFirstAndCommandLineWins) {
  const std::string path = Write(
      "# a comment\n"
      "model = /from/file   # trailing comment\n"
      "\n"
      "max-new-tokens: 9\n"
      "--temperature = 0.75\n"
      "chat\n");
  auto expanded = ExpandConfigFile({"--max-new-tokens=11", "--config", path});
  ASSERT_THAT(expanded, IsOk());
  EXPECT_THAT(*expanded, ElementsAre("--model=/from/file", "--max-new-tokens=9", "--temperature=0.75",
                                     "--chat", "--max-new-tokens=11"));
  Targets t;
  FlagSet f;
  t.AddTo(f);
  ASSERT_THAT(f.Parse(*expanded), IsOk());
  EXPECT_EQ(t.model, "/from/file");
  EXPECT_EQ(t.n, 11);
  EXPECT_DOUBLE_EQ(t.temperature, 0.75);
  EXPECT_TRUE(t.chat);
}

// A value with spaces, '=' and ',' stays one value (URLs, prompts, lists).
TEST_F(ConfigFileTest, ValuesKeepSpacesEqualsAndCommas) {
  const std::string path = Write("model = s3://b/p?endpoint=http://h:9000&region=x\nprompt = Once upon, a time\n");
  auto expanded = ExpandConfigFile({"--config=" + path});
  ASSERT_THAT(expanded, IsOk());
  EXPECT_THAT(*expanded, ElementsAre("--model=s3://b/p?endpoint=http://h:9000&region=x",
                                     "--prompt=Once upon, a time"));
  std::string model, prompt;
  FlagSet f;
  f.Add("model", &model, "");
  f.Add("prompt", &prompt, "");
  ASSERT_THAT(f.Parse(*expanded), IsOk());
  EXPECT_EQ(model, "s3://b/p?endpoint=http://h:9000&region=x");
  EXPECT_EQ(prompt, "Once upon, a time");
}

// A missing file is kNotFound; a malformed line is named by file and line;
// an unknown name in the file is an unknown flag.
TEST_F(ConfigFileTest, BadFilesAreNamed) {
  EXPECT_THAT(ExpandConfigFile({"--config", "/no/such.conf"}), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(ExpandConfigFile({"--config"}), StatusIs(StatusCode::kInvalidArgument));
  const std::string bad = Write("model = x\ntwo words = y\n");
  auto expanded = ExpandConfigFile({"--config", bad});
  EXPECT_THAT(expanded, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(expanded.status().message()), HasSubstr(bad + ":2"));
  const std::string unknown = Write("bogus = 1\n");
  auto ok = ExpandConfigFile({"--config", unknown});
  ASSERT_THAT(ok, IsOk());
  Targets t;
  FlagSet f;
  t.AddTo(f);
  EXPECT_THAT(std::string(f.Parse(*ok).message()), HasSubstr("unknown flag --bogus"));
}

// Helpers beside the parser.
TEST(FlagHelpersTest, HelpListsAndIntegers) {
  EXPECT_TRUE(WantsHelp({"--x", "--help"}));
  EXPECT_TRUE(WantsHelp({"-h"}));
  EXPECT_FALSE(WantsHelp({"--helpful"}));
  EXPECT_THAT(SplitList("a,b,,c"), ElementsAre("a", "b", "c"));
  auto ints = ParseIntList("exits", "2,4,6");
  ASSERT_THAT(ints, IsOk());
  EXPECT_THAT(*ints, ElementsAre(2, 4, 6));
  EXPECT_THAT(ParseIntList("exits", "2,x"), StatusIs(StatusCode::kInvalidArgument));
}

struct Outcome {
  int exit_code = -1;
  std::string stderr_text;
};

// Runs `command` with stderr captured; stdout discarded.
Outcome RunBinary(const std::string& command) {
  lede::testing::TempDir tmp;
  const std::string err_path = (tmp.path() / "stderr").string();
  const int rc = std::system((command + " >/dev/null 2>" + err_path).c_str());
  Outcome o;
  if (rc != -1 && WIFEXITED(rc)) o.exit_code = WEXITSTATUS(rc);
  std::ifstream in(err_path);
  std::stringstream ss;
  ss << in.rdbuf();
  o.stderr_text = ss.str();
  return o;
}

// The real binaries answer a bad flag with exit code 2 and one stderr line
// that names it.
TEST(FlagsExitCodeTest, BadFlagExitsTwoWithOneLine) {
  std::vector<std::string> commands = {std::string(LEDE_CLI_BINARY) + " generate --model x --prompt y --bogus-flag 1",
                                       std::string(LEDE_CLI_BINARY) + " generate --max-new-tokens=lots"};
#ifdef LEDE_COORDINATOR_BINARY
  commands.push_back(std::string(LEDE_COORDINATOR_BINARY) + " --bogus-flag=1");
#endif
  for (const std::string& command : commands) {
    const Outcome o = RunBinary(command);
    EXPECT_EQ(o.exit_code, 2) << command;
    ASSERT_FALSE(o.stderr_text.empty()) << command;
    EXPECT_EQ(o.stderr_text.find('\n'), o.stderr_text.size() - 1) << o.stderr_text;
    EXPECT_THAT(o.stderr_text, ::testing::AnyOf(HasSubstr("--bogus-flag"), HasSubstr("--max-new-tokens")))
        << command;
  }
}

}  // namespace
}  // namespace lede::flags
