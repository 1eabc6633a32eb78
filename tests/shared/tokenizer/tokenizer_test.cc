// File: tests/shared/tokenizer/tokenizer_test.cc
//
// Tests of shared/tokenizer/tokenizer.h, llama2c_tokenizer.h and (when built
// with libsentencepiece) sentencepiece_tokenizer.h, against the real test
// tokenizers in testdata/models (see its README.md for the golden values).
#include "shared/tokenizer/tokenizer.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/tokenizer/llama2c_tokenizer.h"
#if LEDE_HAVE_SENTENCEPIECE
#include "shared/tokenizer/sentencepiece_tokenizer.h"
#endif
#include "tests/shared/model/golden_values.h"
#include "tests/testing/test_data.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::tokenizer {
namespace {

namespace fs = std::filesystem;
using ::lede::model::testing::kBabyGreedy;
using ::lede::model::testing::kBabyPrompt;
using ::lede::model::testing::kStoriesGreedy;
using ::lede::model::testing::kStoriesPrompt;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::lede::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

constexpr char kTok512[] = "stories260K/tok512.bin";
constexpr char kTok105[] = "babyllama-tok105/tok105.model";
constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// The path of `relative` inside lede::testing::TestDataDir()/models, or "" if
// there is no such file.
std::string ModelPath(const std::string& relative) {
  const fs::path path =
      fs::path(lede::testing::TestDataDir()) / "models" / relative;
  std::error_code ec;
  return fs::is_regular_file(path, ec) ? path.lexically_normal().string() : "";
}

std::unique_ptr<Tokenizer> MustLoad(const std::string& relative) {
  const std::string path = ModelPath(relative);
  EXPECT_FALSE(path.empty())
      << relative << " not found under " << lede::testing::TestDataDir()
      << "/models";
  if (path.empty()) return nullptr;
  auto tokenizer = LoadTokenizer(path);
  EXPECT_THAT(tokenizer, IsOk());
  if (!tokenizer.ok()) return nullptr;
  return std::move(tokenizer).value();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string Int32Le(int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  return std::string{
      static_cast<char>(u & 0xFF), static_cast<char>((u >> 8) & 0xFF),
      static_cast<char>((u >> 16) & 0xFF), static_cast<char>((u >> 24) & 0xFF)};
}

// One llama2.c tokenizer record with score 0.
std::string Record(int32_t length, const std::string& bytes) {
  return Int32Le(0) + Int32Le(length) + bytes;
}

std::vector<int32_t> Concat(std::vector<int32_t> a,
                            const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Pushes `ids` through a StreamingDetokenizer and returns all it emits.
std::string Stream(const Tokenizer& tokenizer, int32_t prev_id,
                   const std::vector<int32_t>& ids) {
  StreamingDetokenizer detok(tokenizer, prev_id);
  std::string text;
  for (const int32_t id : ids) text += detok.Push(id);
  return text + detok.Flush();
}

// --- llama2.c tokenizer (stories260K tok512.bin) ---------------------------

// The README's prompt encodes to the golden ids, with and without framing.
TEST(Llama2cTokenizerTest, EncodesPromptToGoldenIds) {
  auto tok = MustLoad(kTok512);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  auto ids = tok->Encode("Once upon a time", /*add_bos=*/true,
                         /*add_eos=*/false);
  ASSERT_THAT(ids, IsOk());
  EXPECT_THAT(*ids, ElementsAreArray(kStoriesPrompt));
  auto bare = tok->Encode("Once upon a time", false, false);
  ASSERT_THAT(bare, IsOk());
  EXPECT_THAT(*bare, ElementsAre(403, 407, 261, 378));
  auto framed = tok->Encode("Once upon a time", true, true);
  ASSERT_THAT(framed, IsOk());
  EXPECT_THAT(*framed, ElementsAre(1, 403, 407, 261, 378, 2));
}

// Prompt plus the golden greedy continuation decodes to the reference text.
TEST(Llama2cTokenizerTest, DecodesGoldenGenerationToReferenceText) {
  auto tok = MustLoad(kTok512);
  ASSERT_NE(tok, nullptr);
  const std::string text =
      tok->Decode(Concat(kStoriesPrompt, kStoriesGreedy));
  EXPECT_EQ(text,
            "Once upon a time, there was a little girl named Lily. She loved "
            "to play outside in the park. One day, she saw a big, r");
  EXPECT_THAT(Stream(*tok, kStoriesPrompt.back(), kStoriesGreedy),
              StartsWith(", there was a little girl named Lily."));
}

// Empty text gets no dummy prefix: only the requested BOS / EOS.
TEST(Llama2cTokenizerTest, EmptyTextEncodesToFramingOnly) {
  auto tok = MustLoad(kTok512);
  ASSERT_NE(tok, nullptr);
  auto framed = tok->Encode("", true, true);
  ASSERT_THAT(framed, IsOk());
  EXPECT_THAT(*framed, ElementsAre(1, 2));
  auto bare = tok->Encode("", false, false);
  ASSERT_THAT(bare, IsOk());
  EXPECT_THAT(*bare, IsEmpty());
  EXPECT_EQ(tok->Decode({}), "");
}

// Decode(Encode(text)) == text for ASCII, including characters that are not
// pieces (byte fallback) and newlines.
TEST(Llama2cTokenizerTest, RoundTripsAsciiText) {
  auto tok = MustLoad(kTok512);
  ASSERT_NE(tok, nullptr);
  for (const std::string text :
       {"Once upon a time, there was a little girl named Lily.",
        "She said: \"Hi!\"\nThen {x} = 42 & ~y; # done\t@end", "a", "  two"}) {
    auto ids = tok->Encode(text, true, false);
    ASSERT_THAT(ids, IsOk()) << text;
    EXPECT_EQ(tok->Decode(*ids), text);
  }
}

// Non-ASCII text round-trips: known characters as pieces, the rest through
// Regression (tests/fuzz/llama2c_tokenizer): a tokenizer file of
// fewer than 259 tokens has no byte-fallback id for most bytes; Encode()
// emitted byte + 3 anyway and then read past the vocabulary (an ASan
// heap-buffer-overflow). Such bytes are now <unk>, and every id is in range.
TEST(Llama2cTokenizerTest, SmallVocabularyEncodesMissingBytesAsUnk) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  // The fuzzer's input: max_token_length 2570, 3 tokens (scores and lengths
  // zero but for one 0xff-scored empty piece).
  const unsigned char crash[] = {0x0a, 0x0a, 0x00, 0x00, 0x8b, 0x8b, 0x8b, 0x8b, 0x00, 0x00, 0x00, 0x00,
                                 0xff, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                 0x00, 0x00, 0x00, 0x00};
  const std::string path = (tmp.path() / "tiny.bin").string();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(crash), sizeof(crash));
  auto tok = Llama2cTokenizer::Load(path);
  ASSERT_THAT(tok, IsOk());
  ASSERT_EQ((*tok)->vocab_size(), 3);
  auto ids = (*tok)->Encode("Once upon a time", true, true);
  ASSERT_THAT(ids, IsOk());
  for (int32_t id : *ids) EXPECT_TRUE(id >= 0 && id < 3) << id;
  (void)(*tok)->Decode(*ids);

  // A clean 5-piece vocabulary: " " and "a" are pieces, "b" (fallback id
  // 101) is not and has no byte token, so it is <unk>.
  auto small = Llama2cTokenizer::FromVocab({"<unk>", "<s>", "</s>", " ", "a"}, {0, 0, 0, 0, 0}, 1);
  ASSERT_THAT(small, IsOk());
  auto small_ids = (*small)->Encode("ab", true, false);
  ASSERT_THAT(small_ids, IsOk());
  EXPECT_THAT(*small_ids, ElementsAre(1, 3, 4, 0));
}

// byte-fallback ids (byte + 3).
TEST(Llama2cTokenizerTest, RoundTripsNonAsciiTextViaByteFallback) {
  auto tok = MustLoad(kTok512);
  ASSERT_NE(tok, nullptr);
  const std::string text = "naïve café ☃ 日本";
  auto ids = tok->Encode(text, true, false);
  ASSERT_THAT(ids, IsOk());
  EXPECT_EQ(tok->Decode(*ids), text);
  // ☃ is E2 98 83 and not a piece: three byte-fallback ids.
  auto snowman = tok->Encode("☃", false, false);
  ASSERT_THAT(snowman, IsOk());
  EXPECT_THAT(*snowman, ElementsAre(410, 0xE2 + 3, 0x98 + 3, 0x83 + 3));
  // é is a piece of its own (id 485).
  auto e_acute = tok->Encode("é", false, false);
  ASSERT_THAT(e_acute, IsOk());
  EXPECT_THAT(*e_acute, ElementsAre(410, 485));
}

// TokenBytes follows run.c's decode(): the space after BOS is dropped, byte
// pieces give raw bytes, control ids and out-of-range ids give nothing.
TEST(Llama2cTokenizerTest, TokenBytesFollowsReferenceDecode) {
  auto tok = MustLoad(kTok512);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->TokenBytes(1, 403), "Once");
  EXPECT_EQ(tok->TokenBytes(403, 407), " upon");
  EXPECT_EQ(tok->TokenBytes(378, 432), ",");
  EXPECT_EQ(tok->TokenBytes(1, 0x0A + 3), "\n");
  EXPECT_EQ(tok->TokenBytes(1, 0x00 + 3), std::string(1, '\0'));
  EXPECT_EQ(tok->TokenBytes(5, 0xFF + 3), "\xFF");
  for (const int32_t id : {0, 1, 2, -1, 512, 100000}) {
    EXPECT_EQ(tok->TokenBytes(403, id), "") << id;
  }
}

// Merges take the highest-scoring adjacent pair first, the leftmost on ties.
TEST(Llama2cTokenizerTest, MergesHighestScoringPairFirst) {
  // ids: 0 <unk>, 1 <s>, 2 </s>, 3 " ", 4 a, 5 b, 6 c, 7 ab, 8 bc, 9 " a".
  auto by_score = Llama2cTokenizer::FromVocab(
      {"<unk>", "\n<s>\n", "\n</s>\n", " ", "a", "b", "c", "ab", "bc", " a"},
      {0, 0, 0, -10, -10, -10, -10, -2, -1, -3}, 2);
  ASSERT_THAT(by_score, IsOk());
  auto ids = (*by_score)->Encode("abc", false, false);
  ASSERT_THAT(ids, IsOk());
  EXPECT_THAT(*ids, ElementsAre(9, 8));  // " a" + "bc", not " " + "ab" + "c"

  auto tied = Llama2cTokenizer::FromVocab(
      {"<unk>", "\n<s>\n", "\n</s>\n", " ", "a", "b", "c", "ab", "bc"},
      {0, 0, 0, -10, -10, -10, -10, -1, -1}, 2);
  ASSERT_THAT(tied, IsOk());
  ids = (*tied)->Encode("abc", true, false);
  ASSERT_THAT(ids, IsOk());
  EXPECT_THAT(*ids, ElementsAre(1, 3, 7, 6));  // leftmost tie: "ab"
}

// Text that is not valid UTF-8 is rejected.
TEST(Llama2cTokenizerTest, EncodeRejectsInvalidUtf8) {
  auto tok = MustLoad(kTok512);
  ASSERT_NE(tok, nullptr);
  for (const std::string bad :
       {"\xFF", "abc\xC3", "\xC0\xAF", "\xED\xA0\x80", "ok \x80 no"}) {
    EXPECT_THAT(tok->Encode(bad, true, false),
                StatusIs(StatusCode::kInvalidArgument));
  }
}

// A tokenizer file cut short (in a record or in the header) is rejected.
TEST(Llama2cTokenizerTest, LoadRejectsTruncatedFile) {
  const std::string source = ModelPath(kTok512);
  ASSERT_FALSE(source.empty());
  const std::string bytes = ReadFile(source);
  ASSERT_GT(bytes.size(), 100u);
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  // Every record is >= 8 bytes, so dropping the last byte always cuts one.
  const fs::path cut = dir.path() / "cut.bin";
  WriteFile(cut, bytes.substr(0, bytes.size() - 1));
  EXPECT_THAT(LoadTokenizer(cut.string()),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Llama2cTokenizer::Load(cut.string()),
              StatusIs(StatusCode::kInvalidArgument));
  const fs::path mid = dir.path() / "mid.bin";
  WriteFile(mid, bytes.substr(0, 4 + 8 + 2));  // inside "<unk>"
  EXPECT_THAT(LoadTokenizer(mid.string()),
              StatusIs(StatusCode::kInvalidArgument));
  const fs::path header = dir.path() / "header.bin";
  WriteFile(header, bytes.substr(0, 2));
  EXPECT_THAT(LoadTokenizer(header.string()),
              StatusIs(StatusCode::kInvalidArgument));
}

// Negative lengths, lengths above max_token_length and too few tokens are
// rejected, with the file named in the message.
TEST(Llama2cTokenizerTest, LoadRejectsMalformedRecords) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string reserved =
      Record(5, "<unk>") + Record(5, "\n<s>\n") + Record(6, "\n</s>\n");
  const fs::path good = dir.path() / "good.bin";
  WriteFile(good, Int32Le(6) + reserved + Record(1, "a"));
  auto loaded = Llama2cTokenizer::Load(good.string());
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ((*loaded)->vocab_size(), 4);
  EXPECT_EQ((*loaded)->max_token_length(), 6);

  const fs::path negative = dir.path() / "negative.bin";
  WriteFile(negative, Int32Le(6) + reserved + Record(-1, ""));
  auto status = Llama2cTokenizer::Load(negative.string());
  EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(status.status().message()),
              HasSubstr(negative.string()));

  const fs::path too_long = dir.path() / "too_long.bin";
  WriteFile(too_long, Int32Le(6) + reserved + Record(7, "abcdefg"));
  EXPECT_THAT(Llama2cTokenizer::Load(too_long.string()),
              StatusIs(StatusCode::kInvalidArgument));

  const fs::path bad_max = dir.path() / "bad_max.bin";
  WriteFile(bad_max, Int32Le(-3) + reserved);
  EXPECT_THAT(Llama2cTokenizer::Load(bad_max.string()),
              StatusIs(StatusCode::kInvalidArgument));

  const fs::path too_few = dir.path() / "too_few.bin";
  WriteFile(too_few, Int32Le(6) + Record(5, "<unk>"));
  EXPECT_THAT(Llama2cTokenizer::Load(too_few.string()),
              StatusIs(StatusCode::kInvalidArgument));
}

// --- LoadTokenizer ---------------------------------------------------------

// A missing file is kNotFound, whatever its extension.
TEST(LoadTokenizerTest, MissingFileIsNotFound) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  for (const char* name : {"absent.bin", "absent.model", "absent.txt"}) {
    EXPECT_THAT(LoadTokenizer((dir.path() / name).string()),
                StatusIs(StatusCode::kNotFound))
        << name;
  }
  EXPECT_THAT(Llama2cTokenizer::Load((dir.path() / "absent.bin").string()),
              StatusIs(StatusCode::kNotFound));
}

// An existing file with an extension other than .bin / .model is rejected.
TEST(LoadTokenizerTest, UnknownExtensionIsInvalidArgument) {
  const std::string source = ModelPath(kTok512);
  ASSERT_FALSE(source.empty());
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  for (const char* name : {"tok512.txt", "tok512"}) {
    const fs::path copy = dir.path() / name;
    WriteFile(copy, ReadFile(source));
    EXPECT_THAT(LoadTokenizer(copy.string()),
                StatusIs(StatusCode::kInvalidArgument))
        << name;
  }
}

#if !LEDE_HAVE_SENTENCEPIECE
// Without libsentencepiece a .model file is kUnimplemented, not a crash.
TEST(LoadTokenizerTest, SentencePieceModelIsUnimplementedWithoutLibrary) {
  const std::string path = ModelPath(kTok105);
  ASSERT_FALSE(path.empty());
  EXPECT_THAT(LoadTokenizer(path), StatusIs(StatusCode::kUnimplemented));
}
#endif

// --- StreamingDetokenizer --------------------------------------------------

// The byte-fallback ids of ☃ emit nothing until the third byte, then ☃.
TEST(StreamingDetokenizerTest, HoldsBackPartialCharacterUntilComplete) {
  auto tok = MustLoad(kTok512);
  ASSERT_NE(tok, nullptr);
  StreamingDetokenizer detok(*tok, /*prev_id=*/403);
  EXPECT_EQ(detok.Push(410), " ");  // " "
  EXPECT_EQ(detok.Push(0xE2 + 3), "");
  EXPECT_EQ(detok.Push(0x98 + 3), "");
  EXPECT_EQ(detok.Push(0x83 + 3), "\xE2\x98\x83");  // ☃
  EXPECT_EQ(detok.Push(378), " time");
  EXPECT_EQ(detok.Flush(), "");
}

// The concatenated stream equals Decode() of the same ids, also for random
// ids whose byte tokens form invalid or truncated sequences.
TEST(StreamingDetokenizerTest, StreamEqualsDecode) {
  auto tok = MustLoad(kTok512);
  ASSERT_NE(tok, nullptr);
  auto ids = tok->Encode("naïve café ☃ 日本, and then 𝄞.", true, false);
  ASSERT_THAT(ids, IsOk());
  const std::vector<int32_t> all = Concat(*ids, kStoriesGreedy);
  EXPECT_EQ(Stream(*tok, tok->bos_id(), all), tok->Decode(all));

  std::mt19937 rng(0);
  std::uniform_int_distribution<int32_t> any_id(-2, 520);
  std::uniform_int_distribution<int32_t> byte_id(0x80 + 3, 0xFF + 3);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int32_t> random_ids;
    for (int i = 0; i < 40; ++i) {
      random_ids.push_back(i % 3 == 0 ? any_id(rng) : byte_id(rng));
    }
    const std::string decoded = tok->Decode(random_ids);
    EXPECT_TRUE(IsValidUtf8(decoded));
    EXPECT_EQ(Stream(*tok, tok->bos_id(), random_ids), decoded)
        << "trial " << trial;
  }
}

// Flush turns a dangling partial character into one U+FFFD, then is empty.
TEST(StreamingDetokenizerTest, FlushReplacesDanglingPartialCharacter) {
  auto tok = MustLoad(kTok512);
  ASSERT_NE(tok, nullptr);
  StreamingDetokenizer detok(*tok, 403);
  EXPECT_EQ(detok.Push(0xE2 + 3), "");
  EXPECT_EQ(detok.Push(0x98 + 3), "");
  EXPECT_EQ(detok.Flush(), kReplacement);
  EXPECT_EQ(detok.Flush(), "");
  // A byte that cannot continue the character ends it at once.
  EXPECT_EQ(detok.Push(0xE2 + 3), "");
  EXPECT_EQ(detok.Push(412), std::string(kReplacement) + "a");
}

// The first token's leading space is dropped only after BOS.
TEST(StreamingDetokenizerTest, PrevIdDecidesLeadingSpace) {
  auto tok = MustLoad(kTok512);
  ASSERT_NE(tok, nullptr);
  StreamingDetokenizer after_bos(*tok, tok->bos_id());
  EXPECT_EQ(after_bos.Push(403), "Once");
  StreamingDetokenizer after_word(*tok, 261);
  EXPECT_EQ(after_word.Push(403), " Once");
}

// --- UTF-8 helpers ---------------------------------------------------------

// Well-formed text up to U+10FFFF, including NUL and the surrogate
// neighbours U+D7FF / U+E000, is valid.
TEST(Utf8Test, IsValidUtf8AcceptsWellFormedText) {
  for (const std::string& text :
       {std::string(), std::string("plain ASCII"), std::string("a\0b", 3),
        std::string("\xC2\x80"), std::string("é"), std::string("☃"),
        std::string("\xED\x9F\xBF"), std::string("\xEE\x80\x80"),
        std::string("𝄞"), std::string("\xF4\x8F\xBF\xBF"),
        std::string("naïve café ☃ 日本")}) {
    EXPECT_TRUE(IsValidUtf8(text)) << ::testing::PrintToString(text);
  }
}

// Overlongs, surrogates, code points above U+10FFFF, stray continuation
// bytes, bytes never used in UTF-8 and truncated characters are invalid.
TEST(Utf8Test, IsValidUtf8RejectsMalformedSequences) {
  for (const std::string text :
       {"\xC0\xAF", "\xC1\xBF", "\xE0\x80\xAF", "\xE0\x9F\xBF",
        "\xF0\x80\x80\xAF", "\xF0\x8F\xBF\xBF", "\xED\xA0\x80", "\xED\xBF\xBF",
        "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xFE", "\xFF", "\x80", "a\xBF",
        "\xE2\x98", "\xF0\x9D\x84", "\xC3", "\xE2\x98x", "\xC3\xC3"}) {
    EXPECT_FALSE(IsValidUtf8(text)) << ::testing::PrintToString(text);
  }
}

// Each maximal subpart of an ill-formed sequence becomes one U+FFFD; valid
// text is unchanged.
TEST(Utf8Test, SanitizeReplacesEachMaximalSubpart) {
  const std::string r = kReplacement;
  EXPECT_EQ(SanitizeUtf8("naïve ☃"), "naïve ☃");
  EXPECT_EQ(SanitizeUtf8(std::string("a\xFF") + "b"), "a" + r + "b");
  EXPECT_EQ(SanitizeUtf8("\xE2\x98"), r);         // truncated: one
  EXPECT_EQ(SanitizeUtf8("\xE2\x98x"), r + "x");  // cut short: one
  EXPECT_EQ(SanitizeUtf8(std::string("\xF0\x9D\x84") + "a"), r + "a");
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF"), r + r);  // overlong: two
  EXPECT_EQ(SanitizeUtf8("\xE0\x80\xAF"), r + r + r);
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), r + r + r);  // surrogate: three
  EXPECT_EQ(SanitizeUtf8("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(SanitizeUtf8("\x80\x80"), r + r);
  EXPECT_TRUE(IsValidUtf8(SanitizeUtf8("\xC3\xC3\xE2\x98\xF0")));
}

// Only an unfinished (but so far valid) character at the end is held back;
// invalid bytes count as complete because Sanitize replaces them.
TEST(Utf8Test, CompleteUtf8PrefixHoldsBackOnlyAnUnfinishedCharacter) {
  EXPECT_EQ(CompleteUtf8Prefix(""), 0u);
  EXPECT_EQ(CompleteUtf8Prefix("abc"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("☃"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xE2"), 1u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xE2\x98"), 1u);
  EXPECT_EQ(CompleteUtf8Prefix("\xF0\x9D\x84"), 0u);
  EXPECT_EQ(CompleteUtf8Prefix("\xE2\x98\x83\xE2\x98"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xFF"), 2u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xE2x"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("\xED\xA0"), 2u);  // surrogate: never completes
  EXPECT_EQ(CompleteUtf8Prefix("\xE0\x80"), 2u);  // overlong: never completes
  EXPECT_EQ(CompleteUtf8Prefix("\xC0"), 1u);
}

#if LEDE_HAVE_SENTENCEPIECE
// --- SentencePiece tokenizer (babyllama tok105.model) ----------------------

// The README's prompt encodes to the golden ids.
TEST(SentencePieceTokenizerTest, EncodesPromptToGoldenIds) {
  auto tok = MustLoad(kTok105);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 105);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  auto ids = tok->Encode("Once upon a time", true, false);
  ASSERT_THAT(ids, IsOk());
  EXPECT_THAT(*ids, ElementsAreArray(kBabyPrompt));
  auto framed = tok->Encode("Once", false, true);
  ASSERT_THAT(framed, IsOk());
  EXPECT_EQ(framed->back(), 2);
  EXPECT_NE(framed->front(), 1);
}

// Prompt plus the golden greedy continuation decodes to the reference text.
TEST(SentencePieceTokenizerTest, DecodesGoldenGenerationToReferenceText) {
  auto tok = MustLoad(kTok105);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Decode(Concat(kBabyPrompt, kBabyGreedy)),
            "Once upon a time, there was a little gi");
  EXPECT_EQ(Stream(*tok, kBabyPrompt.back(), kBabyGreedy),
            ", there was a little gi");
}

// Decode(Encode(text)) == text for ASCII text in the model's alphabet.
TEST(SentencePieceTokenizerTest, RoundTripsAsciiText) {
  auto tok = MustLoad(kTok105);
  ASSERT_NE(tok, nullptr);
  for (const std::string text :
       {"Once upon a time, there was a little girl named Lily.",
        "She said \"Hi!\" to the big dog.", "a"}) {
    auto ids = tok->Encode(text, true, false);
    ASSERT_THAT(ids, IsOk()) << text;
    EXPECT_EQ(tok->Decode(*ids), text);
  }
}

// Characters outside the vocabulary (no byte fallback) encode to <unk>
// without an error, and <unk> decodes to nothing.
TEST(SentencePieceTokenizerTest,
     UnknownCharactersEncodeToUnkAndDecodeToNothing) {
  auto tok = MustLoad(kTok105);
  ASSERT_NE(tok, nullptr);
  auto ids = tok->Encode("naïve café ☃ 日本", true, false);
  ASSERT_THAT(ids, IsOk());
  EXPECT_THAT(*ids, ::testing::Contains(0));
  const std::string text = tok->Decode(*ids);
  EXPECT_TRUE(IsValidUtf8(text));
  EXPECT_THAT(text, StartsWith("nave caf"));
  EXPECT_EQ(Stream(*tok, tok->bos_id(), *ids), text);
  // tok105 maps "\n" to <unk>.
  auto newline = tok->Encode("a\nb", true, false);
  ASSERT_THAT(newline, IsOk());
  EXPECT_THAT(*newline, ::testing::Contains(0));
  EXPECT_EQ(tok->Decode(*newline), "ab");
}

// Control, unknown and out-of-range ids give no bytes; ▁ becomes a space
// that is dropped right after BOS.
TEST(SentencePieceTokenizerTest, TokenBytesMapsWordBoundaryAndControls) {
  auto tok = MustLoad(kTok105);
  ASSERT_NE(tok, nullptr);
  for (const int32_t id : {0, 1, 2, -1, 105, 1000}) {
    EXPECT_EQ(tok->TokenBytes(4, id), "") << id;
  }
  EXPECT_EQ(tok->TokenBytes(4, 3), " ");  // ▁
  EXPECT_EQ(tok->TokenBytes(1, 3), "");   // ▁ right after BOS
  EXPECT_EQ(tok->TokenBytes(1, 34), "O");
}

// Text that is not valid UTF-8 is rejected.
TEST(SentencePieceTokenizerTest, EncodeRejectsInvalidUtf8) {
  auto tok = MustLoad(kTok105);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("abc\xC3", true, false),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(tok->Encode("\xED\xA0\x80", true, false),
              StatusIs(StatusCode::kInvalidArgument));
}

// A .model file that does not parse (garbage, or tok105.model cut short) is
// kInvalidArgument.
TEST(SentencePieceTokenizerTest, LoadRejectsCorruptModel) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const fs::path corrupt = dir.path() / "corrupt.model";
  WriteFile(corrupt, "this is not a protobuf \xFF\xFF\xFF\xFF");
  EXPECT_THAT(LoadTokenizer(corrupt.string()),
              StatusIs(StatusCode::kInvalidArgument));
  const std::string source = ModelPath(kTok105);
  ASSERT_FALSE(source.empty());
  const std::string bytes = ReadFile(source);
  ASSERT_GT(bytes.size(), 100u);
  const fs::path cut = dir.path() / "cut.model";
  WriteFile(cut, bytes.substr(0, bytes.size() - 1));  // every field is >= 2 B
  EXPECT_THAT(LoadTokenizer(cut.string()),
              StatusIs(StatusCode::kInvalidArgument));
}

#endif  // LEDE_HAVE_SENTENCEPIECE

}  // namespace
}  // namespace lede::tokenizer
