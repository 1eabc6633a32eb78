// Tests of services/cli/commands.h: `lede generate --samples` (used to sample
// synthetic training stories) prints one text per seed, each reproducible by
// a single run with that seed, and refuses bad sample flags.
#include "services/cli/commands.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/test_data.h"
#include "tests/testing/temp_dir.h"

namespace lede::cli {
namespace {

std::vector<std::string> GenerateArgs(int64_t seed) {
  return {"--model", ::lede::testing::Stories260KDir(), "--prompt", "Once upon a time",
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

// --calibration prices a lede policy: the features it shows are printed with
// the file they came from, decoding stays lossless; any other mode refuses
// the flag naming it, before the model loads.
TEST(GenerateTest, CalibrationPricesTheLedePolicyAndOnlyIt) {
  const std::vector<std::string> base = {"--model", "models/lede-tiny", "--prompt", "Once upon a time",
                                         "--max-new-tokens", "16", "--threads", "1"};
  std::vector<std::string> lede = base, ar = base, refused = base;
  lede.insert(lede.end(), {"--mode", "lede", "--calibration", "models/lede-tiny/calibration-cpu.json"});
  ar.insert(ar.end(), {"--mode", "ar"});
  refused.insert(refused.end(), {"--mode", "static", "--calibration", "models/lede-tiny/calibration-cpu.json"});
  std::ostringstream lede_out, lede_err, ar_out, ar_err, refused_out, refused_err;
  ASSERT_EQ(RunGenerate(lede, lede_out, lede_err), 0) << lede_err.str();
  EXPECT_NE(lede_err.str().find("[lede] policy priced by models/lede-tiny/calibration-cpu.json: probe "),
            std::string::npos)
      << lede_err.str();
  ASSERT_EQ(RunGenerate(ar, ar_out, ar_err), 0) << ar_err.str();
  EXPECT_EQ(lede_out.str(), ar_out.str());
  EXPECT_EQ(RunGenerate(refused, refused_out, refused_err), 2);
  EXPECT_NE(refused_err.str().find("--calibration: only --mode lede"), std::string::npos) << refused_err.str();
  EXPECT_EQ(refused_out.str(), "");
}

// --kv-dtype: speculation is lossless against autoregressive decoding on the
// same K/V dtype, bfloat16 (the default, as the model service's) and
// float32 alike; another value is a usage error naming the flag.
TEST(GenerateTest, KvDtypeKeepsSpeculationLossless) {
  const std::vector<std::string> base = {"--model", "models/lede-tiny", "--prompt", "Once upon a time",
                                         "--max-new-tokens", "24", "--threads", "1"};
  for (const std::string dtype : {"bfloat16", "float32"}) {
    std::vector<std::string> spec = base, ar = base;
    spec.insert(spec.end(), {"--kv-dtype", dtype, "--mode", "static", "--exit-layer", "2", "--draft-len", "3"});
    ar.insert(ar.end(), {"--kv-dtype", dtype, "--mode", "ar"});
    std::ostringstream spec_out, spec_err, ar_out, ar_err;
    ASSERT_EQ(RunGenerate(spec, spec_out, spec_err), 0) << spec_err.str();
    ASSERT_EQ(RunGenerate(ar, ar_out, ar_err), 0) << ar_err.str();
    EXPECT_EQ(spec_out.str(), ar_out.str()) << dtype;
    EXPECT_FALSE(ar_out.str().empty());
  }
  std::vector<std::string> bad = base;
  bad.insert(bad.end(), {"--kv-dtype", "int8"});
  std::ostringstream out, err;
  EXPECT_EQ(RunGenerate(bad, out, err), 2);
  EXPECT_NE(err.str().find("--kv-dtype: must be bfloat16, float32 or auto"), std::string::npos) << err.str();
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

// A request the engine refuses (an exit layer past L, a generation past the
// context window) exits 2 with only its error: the prompt is echoed with the
// first generated tokens, so stdout stays empty. A mode `lede generate` does
// not run is refused naming --mode before the model loads.
TEST(GenerateTest, RefusedRequestsPrintOnlyTheirError) {
  struct Bad {
    std::vector<std::string> flags;
    std::string names;
  };
  for (const Bad& bad : {Bad{{"--mode", "static", "--exit-layer", "99"}, "exit_layer"},
                         Bad{{"--mode", "static", "--max-new-tokens", "100000"}, "context"},
                         Bad{{"--mode", "threshold"}, "--mode"}}) {
    std::vector<std::string> args = {"--model", ::lede::testing::Stories260KDir(), "--prompt", "Once upon a time",
                                     "--threads", "1"};
    args.insert(args.end(), bad.flags.begin(), bad.flags.end());
    std::ostringstream out, err;
    EXPECT_EQ(RunGenerate(args, out, err), 2) << err.str();
    EXPECT_NE(err.str().find(bad.names), std::string::npos) << err.str();
    EXPECT_EQ(out.str(), "") << bad.names;
  }
}

// `lede generate --graphs on` (the graph-safe decode step, run eagerly on
// the CPU) prints the text the default path prints, for greedy
// autoregressive and static decoding; a bad mode is refused naming --graphs.
TEST(GenerateTest, GraphsOnGivesTheSameTextAndBadModesAreRefused) {
  for (const char* mode : {"ar", "static"}) {
    std::vector<std::string> args = {"--model", ::lede::testing::Stories260KDir(), "--prompt",
                                     "Once upon a time", "--mode", mode, "--max-new-tokens", "32", "--threads", "1",
                                     "--exit-layer", "3", "--draft-len", "3"};
    std::ostringstream off, off_err, on, on_err;
    ASSERT_EQ(RunGenerate(args, off, off_err), 0) << off_err.str();
    args.insert(args.end(), {"--graphs", "on"});
    ASSERT_EQ(RunGenerate(args, on, on_err), 0) << on_err.str();
    EXPECT_EQ(on.str(), off.str()) << mode;
    EXPECT_GT(on.str().size(), std::string("Once upon a time").size()) << "it generated text";
  }
  std::vector<std::string> bad = GenerateArgs(1);
  bad.insert(bad.end(), {"--graphs", "sometimes"});
  std::ostringstream out, err;
  EXPECT_EQ(RunGenerate(bad, out, err), 2);
  EXPECT_NE(err.str().find("--graphs"), std::string::npos) << err.str();
  EXPECT_EQ(out.str(), "");
}

// `lede generate --weights bf16|q8_0`: greedy static speculation
// prints the autoregressive text at each weight format (lossless at the
// same precision), and a bad format is refused naming --weights.
TEST(GenerateTest, WeightFormatsAreLosslessAndBadFormatsAreRefused) {
  for (const char* weights : {"bf16", "q8_0"}) {
    std::string texts[2];
    int i = 0;
    for (const char* mode : {"ar", "static"}) {
      std::vector<std::string> args = {"--model", "models/lede-tiny", "--prompt", "Once upon a time", "--mode", mode,
                                       "--max-new-tokens", "32", "--threads", "1", "--exit-layer", "3",
                                       "--draft-len", "3", "--weights", weights};
      std::ostringstream out, err;
      ASSERT_EQ(RunGenerate(args, out, err), 0) << err.str();
      texts[i++] = out.str();
    }
    EXPECT_EQ(texts[0], texts[1]) << weights;
    EXPECT_GT(texts[0].size(), std::string("Once upon a time").size() + 20) << "it generated text";
  }
  std::vector<std::string> bad = GenerateArgs(1);
  bad.insert(bad.end(), {"--weights", "int4"});
  std::ostringstream out, err;
  EXPECT_EQ(RunGenerate(bad, out, err), 2);
  EXPECT_NE(err.str().find("--weights"), std::string::npos) << err.str();
  EXPECT_EQ(out.str(), "");
}

// `lede generate --prompt-file` (benchmarks: one model load for many
// prompts) prints, for each line, the text a single --prompt run prints,
// each followed by the separator, one stats line per prompt and repeat;
// an empty file or both prompt flags are refused.
TEST(GenerateTest, PromptFileGivesEachPromptsSingleRunText) {
  ::lede::testing::TempDir dir;
  const std::string file = (dir.path() / "prompts.txt").string();
  const std::vector<std::string> prompts = {"Once upon a time", "The cat sat on the"};
  std::ofstream(file) << prompts[0] << "\n\n" << prompts[1] << "\n";
  std::vector<std::string> base = {"--model", ::lede::testing::Stories260KDir(), "--mode", "static",
                                   "--max-new-tokens", "24", "--threads", "1", "--exit-layer", "3", "--draft-len", "3"};
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--prompt-file", file, "--separator", "<|end|>", "--repeat", "2"});
  std::ostringstream out, err;
  ASSERT_EQ(RunGenerate(args, out, err), 0) << err.str();
  const std::vector<std::string> parts = Split(out.str(), "<|end|>\n");
  ASSERT_EQ(parts.size(), 3u) << out.str();
  EXPECT_EQ(parts[2], "");
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<std::string> single = base;
    single.insert(single.end(), {"--prompt", prompts[i]});
    std::ostringstream one, one_err;
    ASSERT_EQ(RunGenerate(single, one, one_err), 0) << one_err.str();
    EXPECT_EQ(parts[i], one.str()) << "prompt " << i;
  }
  size_t stats_lines = 0;
  for (size_t at = 0; (at = err.str().find(" tokens/s, ", at)) != std::string::npos; ++at) ++stats_lines;
  EXPECT_EQ(stats_lines, 4u) << err.str();

  const std::string empty = (dir.path() / "empty.txt").string();
  std::ofstream(empty) << "\n";
  for (const std::vector<std::string>& extra : {std::vector<std::string>{"--prompt-file", empty},
                                                std::vector<std::string>{"--prompt-file", file, "--prompt", "x"}}) {
    std::vector<std::string> bad = base;
    bad.insert(bad.end(), extra.begin(), extra.end());
    std::ostringstream o, e;
    EXPECT_EQ(RunGenerate(bad, o, e), 2);
    EXPECT_NE(e.str().find("prompt"), std::string::npos) << e.str();
    EXPECT_EQ(o.str(), "");
  }
}

// `lede calibrate` writes the kernel tables and the round table the
// measured cost model prices rounds from, and refuses bad round flags.
TEST(CalibrateTest, WritesARoundTableAndRefusesBadRoundFlags) {
  ::lede::testing::TempDir dir;
  const std::string path = (dir.path() / "calibration.json").string();
  const std::string model = ::lede::testing::Stories260KDir();
  std::ostringstream out, err;
  ASSERT_EQ(RunCalibrate({"--model", model, "--threads", "1", "--repeats", "2", "--round-passes", "1",
                          "--round-max-draft-len", "2", "--out", path},
                         out, err),
            0)
      << err.str();
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  const int64_t L = j.at("n_layers").get<int64_t>();
  ASSERT_EQ(j.at("round_us").size(), static_cast<size_t>(L - 1));
  EXPECT_EQ(j.at("round_us")[0].size(), 2u);
  EXPECT_GT(j.at("ar_step_us").get<double>(), 0.0);
  EXPECT_NE(err.str().find("rounds timed in context"), std::string::npos) << err.str();
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--round-passes", "-1"},
                                              std::vector<std::string>{"--round-max-draft-len", "0"},
                                              std::vector<std::string>{"--round-max-draft-len", "17"}}) {
    std::vector<std::string> args = {"--model", model};
    args.insert(args.end(), bad.begin(), bad.end());
    std::ostringstream o, e;
    EXPECT_EQ(RunCalibrate(args, o, e), 2);
    EXPECT_NE(e.str().find(bad[0]), std::string::npos) << e.str();
  }
}

// --base adds the batch tables (the cost model at a load) to an existing
// calibration and keeps the rest; bad batch flags and a calibration of
// another model are refused naming the flag.
TEST(CalibrateTest, BaseAddsBatchTablesAndKeepsTheRest) {
  ::lede::testing::TempDir dir;
  const std::string model = ::lede::testing::Stories260KDir();
  const std::string base = (dir.path() / "base.json").string(), path = (dir.path() / "batched.json").string();
  std::ostringstream out, err;
  ASSERT_EQ(RunCalibrate({"--model", model, "--threads", "1", "--repeats", "2", "--round-passes", "0",
                          "--batch-sizes", "", "--out", base},
                         out, err),
            0)
      << err.str();
  nlohmann::json before = nlohmann::json::parse(std::ifstream(base));
  EXPECT_FALSE(before.contains("batch_sizes"));
  ASSERT_EQ(RunCalibrate({"--model", model, "--threads", "1", "--repeats", "2", "--base", base,
                          "--batch-sizes", "1,2,4", "--round-max-draft-len", "3", "--out", path},
                         out, err),
            0)
      << err.str();
  nlohmann::json after = nlohmann::json::parse(std::ifstream(path));
  EXPECT_EQ(after.at("batch_sizes"), nlohmann::json({1, 2, 4}));
  ASSERT_EQ(after.at("batch_verify_us").size(), 3u);
  EXPECT_EQ(after.at("batch_verify_us")[0].size(), 3u);
  EXPECT_EQ(after.at("batch_exit_layer"), 2);
  for (const char* kept : {"step_us", "block_us", "head_us", "signals_us"}) EXPECT_EQ(after.at(kept), before.at(kept));
  EXPECT_NE(err.str().find("batched steps at E=2"), std::string::npos) << err.str();
  struct Bad {
    std::vector<std::string> flags;
    std::string names;
  };
  for (const Bad& bad : {Bad{{"--model", model, "--base", base, "--batch-sizes", "2,4"}, "--batch-sizes"},
                         Bad{{"--model", model, "--base", base, "--batch-exit-layer", "9"}, "--batch-exit-layer"},
                         Bad{{"--model", model, "--base", base, "--batch-sizes", ""}, "--base"},
                         Bad{{"--model", model, "--base", (dir.path() / "none.json").string()}, "--base"}}) {
    std::ostringstream o, e;
    EXPECT_EQ(RunCalibrate(bad.flags, o, e), 2) << e.str();
    EXPECT_NE(e.str().find(bad.names), std::string::npos) << e.str();
  }
}

// --prompts: the rounds are timed in whole generations of the file's
// prompts; a line that is not a prompt is refused naming the file and line.
TEST(CalibrateTest, TimesRoundsOnAPromptFileAndRefusesABadLine) {
  ::lede::testing::TempDir dir;
  const std::string model = ::lede::testing::Stories260KDir();
  const std::string prompts = (dir.path() / "prompts.jsonl").string();
  std::ofstream(prompts) << "{\"prompt\": \"Once upon a time\"}\n\n{\"prompt\": \"Lily had a red ball\"}\n";
  const std::string path = (dir.path() / "calibration.json").string();
  std::ostringstream out, err;
  ASSERT_EQ(RunCalibrate({"--model", model, "--threads", "1", "--repeats", "2", "--round-passes", "1",
                          "--round-max-draft-len", "3", "--prompts", prompts, "--new-tokens", "16", "--out", path},
                         out, err),
            0)
      << err.str();
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j.at("round_us").size(), static_cast<size_t>(j.at("n_layers").get<int64_t>() - 1));
  EXPECT_EQ(j.at("round_us")[0].size(), 3u);
  const std::string bad = (dir.path() / "bad.jsonl").string();
  std::ofstream(bad) << "{\"prompt\": \"fine\"}\n{\"text\": 3}\n";
  std::ostringstream o, e;
  EXPECT_EQ(RunCalibrate({"--model", model, "--prompts", bad}, o, e), 2);
  EXPECT_NE(e.str().find("bad.jsonl line 2"), std::string::npos) << e.str();
  std::ostringstream o2, e2;
  EXPECT_EQ(RunCalibrate({"--model", model, "--prompts", prompts, "--new-tokens", "1"}, o2, e2), 2);
  EXPECT_NE(e2.str().find("--new-tokens"), std::string::npos) << e2.str();
  // No prompt leaves room for the generation: a usage error naming the flags.
  std::ostringstream o3, e3;
  EXPECT_EQ(RunCalibrate({"--model", model, "--threads", "1", "--repeats", "2", "--round-passes", "1", "--prompts",
                          prompts, "--new-tokens", "100000"},
                         o3, e3),
            2);
  EXPECT_NE(e3.str().find("--prompts"), std::string::npos) << e3.str();
  EXPECT_NE(e3.str().find("context window"), std::string::npos) << e3.str();
}

// A tiny byte-level tokenizer.json (one token per byte, ids = byte values,
// no merges; <|bos|> = 256 added by the post-processor, <|eot|> = 257) with
// a tokenizer_config.json holding a chat template: the CLI's plumbing
// without the cost of a 128k vocabulary (the real files are checked in
// tests/shared/tokenizer).
std::string WriteTinyTokenizer(const std::filesystem::path& dir) {
  nlohmann::json vocab = nlohmann::json::object();
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const uint32_t cp = printable ? b : next++;
    std::string key;
    if (cp < 0x80) {
      key.push_back(static_cast<char>(cp));
    } else {
      key.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      key.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    vocab[key] = b;
  }
  nlohmann::json tok = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", nlohmann::json::array({{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
                                          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}}},
      {"added_tokens", nlohmann::json::array({{{"id", 256}, {"content", "<|bos|>"}, {"special", true}},
                                              {{"id", 257}, {"content", "<|eot|>"}, {"special", true}}})}};
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  nlohmann::json config = {
      {"bos_token", "<|bos|>"},
      {"eos_token", "<|eot|>"},
      {"chat_template",
       "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}<|eot|>{% endfor %}"
       "{% if add_generation_prompt %}<a>{% endif %}"}};
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  return (dir / "tokenizer.json").string();
}

std::string Ids(const std::string& bytes, std::vector<int> prefix = {}, std::vector<int> suffix = {}) {
  std::string out = "[";
  auto add = [&](int id) { out += (out.size() > 1 ? "," : "") + std::to_string(id); };
  for (int id : prefix) add(id);
  for (unsigned char c : bytes) add(c);
  for (int id : suffix) add(id);
  return out + "]\n";
}

// `lede tokenize` prints ids as a JSON list, with BOS when the
// post-processor asks for it (--bos auto) and as --bos says otherwise.
TEST(TokenizeTest, PrintsIdsAsJsonList) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string path = WriteTinyTokenizer(tmp.path());
  std::ostringstream out, err;
  ASSERT_EQ(RunTokenize({"--tokenizer", path, "Hi <|eot|>"}, out, err), 0) << err.str();
  EXPECT_EQ(out.str(), Ids("Hi ", {256}, {257}));
  std::ostringstream out2, err2;
  ASSERT_EQ(RunTokenize({"--model", tmp.path().string(), "--bos", "false", "--text", "Hi"}, out2, err2), 0)
      << err2.str();
  EXPECT_EQ(out2.str(), Ids("Hi"));
}

// --chat renders the chat template beside the tokenizer and tokenizes it
// without another BOS; --decode turns ids back into text (special tokens
// give nothing).
TEST(TokenizeTest, ChatAndDecode) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string path = WriteTinyTokenizer(tmp.path());
  std::ostringstream out, err;
  ASSERT_EQ(RunTokenize({"--tokenizer", path, "--chat", "--system", "S", " Hi "}, out, err), 0) << err.str();
  EXPECT_EQ(out.str(), "[256," + Ids("<system>S").substr(1, Ids("<system>S").size() - 3) + ",257," +
                           Ids("<user>Hi").substr(1, Ids("<user>Hi").size() - 3) + ",257," +
                           Ids("<a>").substr(1));
  std::ofstream(tmp.path() / "other.jinja") << "[{{ messages[-1].content }}]";
  std::ostringstream out2, err2;
  ASSERT_EQ(RunTokenize({"--tokenizer", path, "--chat", "--chat-template", (tmp.path() / "other.jinja").string(), "x"},
                        out2, err2),
            0)
      << err2.str();
  EXPECT_EQ(out2.str(), Ids("[x]"));
  std::ostringstream dout, derr;
  ASSERT_EQ(RunTokenize({"--tokenizer", path, "--decode", "[256,72,105,257]"}, dout, derr), 0) << derr.str();
  EXPECT_EQ(dout.str(), "Hi\n");
}

// Missing or bad inputs exit with 2 and a one-line error.
TEST(TokenizeTest, RejectsBadInput) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string path = WriteTinyTokenizer(tmp.path());
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"Hello"}, std::vector<std::string>{"--tokenizer", "/nonexistent.json", "x"},
        std::vector<std::string>{"--tokenizer", path, "--decode", "[1, 999999]"},
        std::vector<std::string>{"--tokenizer", path, "--decode", "not json"},
        std::vector<std::string>{"--tokenizer", path, "--bos", "maybe", "x"},
        std::vector<std::string>{"--tokenizer", path, "\xff"},
        std::vector<std::string>{"--tokenizer", path, "a", "b"}}) {
    std::ostringstream out, err;
    EXPECT_EQ(RunTokenize(args, out, err), 2) << args.back();
    EXPECT_EQ(out.str(), "");
    EXPECT_NE(err.str(), "");
  }
}

// `lede bench` and `lede collect` moved to `lede-bench`: they exit with 2
// and one stderr line naming the new command.
TEST(MainTest, BenchAndCollectNameTheirNewCommand) {
  for (std::string command : {"bench", "collect"}) {
    std::string argv0 = "lede";
    std::vector<char*> argv = {argv0.data(), command.data()};
    ::testing::internal::CaptureStderr();
    const int code = Main(static_cast<int>(argv.size()), argv.data());
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(code, 2) << command;
    EXPECT_NE(err.find("lede-bench " + command), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), err.size() - 1) << err;
  }
}

}  // namespace
}  // namespace lede::cli
