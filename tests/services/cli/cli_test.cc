// Tests of services/cli/commands.h: `lede generate --samples` (used to sample
// synthetic training stories) prints one text per seed, each reproducible by
// a single run with that seed, and refuses bad sample flags.
#include "services/cli/commands.h"

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/tokenizer/hf_tokenizer.h"
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

std::string LenmlTokenizer(const std::string& package) {
  const char* dir = std::getenv("LEDE_TOOLS_DIR");
  return (std::filesystem::path(dir != nullptr && *dir != '\0' ? dir : "/opt/lede-tools") / "node_modules" /
          "@lenml" / package / "models" / "tokenizer.json")
      .string();
}

// `lede tokenize` prints ids as a JSON list; BOS follows the file's
// post-processor (none in Llama-3's first tokenizer.json, BOS in 3.1's).
TEST(TokenizeTest, PrintsIdsAsJsonList) {
  for (const auto& [package, expected] : {std::pair<std::string, std::string>{"tokenizer-llama3", "[9906,1917]\n"},
                                          {"tokenizer-llama3_1", "[128000,9906,1917]\n"}}) {
    const std::string path = LenmlTokenizer(package);
    ASSERT_TRUE(std::filesystem::exists(path)) << path << " missing: run scripts/install_tokenizer_oracles.sh";
    std::ostringstream out, err;
    ASSERT_EQ(RunTokenize({"--tokenizer", path, "Hello world"}, out, err), 0) << err.str();
    EXPECT_EQ(out.str(), expected);
  }
}

// --chat renders the chat template beside the tokenizer and tokenizes it
// without another BOS; --decode turns ids back into text.
TEST(TokenizeTest, ChatAndDecode) {
  const std::string path = LenmlTokenizer("tokenizer-llama3_1");
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " missing: run scripts/install_tokenizer_oracles.sh";
  auto tok = tokenizer::HfTokenizer::Load(path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto expected = (*tok)->Encode(
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
      false, false);
  ASSERT_TRUE(expected.ok());
  std::ostringstream out, err;
  ASSERT_EQ(RunTokenize({"--tokenizer", path, "--chat", "--system", "Be brief.", "Hi there"}, out, err), 0) << err.str();
  std::string want = "[";
  for (size_t i = 0; i < expected->size(); ++i) want += (i ? "," : "") + std::to_string((*expected)[i]);
  EXPECT_EQ(out.str(), want + "]\n");
  EXPECT_EQ((*expected)[0], 128000);
  std::ostringstream dout, derr;
  ASSERT_EQ(RunTokenize({"--tokenizer", path, "--decode", "[128000,9906,1917,128009]"}, dout, derr), 0) << derr.str();
  EXPECT_EQ(dout.str(), "Hello world\n");
}

// Missing or bad inputs exit with 2 and a one-line error.
TEST(TokenizeTest, RejectsBadInput) {
  const std::string path = LenmlTokenizer("tokenizer-llama3");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"Hello"}, std::vector<std::string>{"--tokenizer", "/nonexistent.json", "x"},
        std::vector<std::string>{"--tokenizer", path, "--decode", "[1, 999999]"},
        std::vector<std::string>{"--tokenizer", path, "--decode", "not json"},
        std::vector<std::string>{"--tokenizer", path, "--bos", "maybe", "x"},
        std::vector<std::string>{"--tokenizer", path, "a", "b"}}) {
    std::ostringstream out, err;
    EXPECT_EQ(RunTokenize(args, out, err), 2) << args.back();
    EXPECT_EQ(out.str(), "");
    EXPECT_NE(err.str(), "");
  }
}

}  // namespace
}  // namespace lede::cli
