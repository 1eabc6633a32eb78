// Model files as untrusted input (docs/design.md §5), through the loaders
// and the real `lede` binary: the probe's hostile files are refused with
// one line naming the key and exit status 2, each under 1 GiB of peak RSS,
// and RoPE tables are sized by the context served, not by
// max_position_embeddings.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/checkpoint/model_limits.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/model/kv_cache.h"
#include "shared/model/llama.h"
#include "shared/model/loaders/load_or_exit.h"
#include "tests/shared/model/model_fixtures.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_data.h"

namespace lede::model::loaders {
namespace {

namespace fs = std::filesystem;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

int64_t PeakRssBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// lede-tiny's config.json with one field's value replaced.
std::string LedeTinyConfigWith(const std::string& key, const std::string& value) {
  std::string text = ReadAll(lede::testing::RepoRoot() + "/models/lede-tiny/config.json");
  const size_t at = text.find("\"" + key + "\": ");
  EXPECT_NE(at, std::string::npos) << key;
  const size_t begin = at + key.size() + 4, end = text.find_first_of(",\n}", begin);
  return text.substr(0, begin) + value + text.substr(end);
}

// A copy of lede-tiny (weights and tokenizer linked) with `config_json`.
std::string HostileLedeTiny(const lede::testing::TempDir& tmp, const std::string& name,
                            const std::string& config_json) {
  const fs::path dir = tmp.path() / name;
  fs::create_directories(dir);
  const fs::path src = fs::path(lede::testing::RepoRoot()) / "models/lede-tiny";
  for (const char* f : {"model.safetensors", "tokenizer.model"}) fs::create_symlink(src / f, dir / f);
  WriteText((dir / "config.json").string(), config_json);
  return dir.string();
}

TEST(HostileConfigLoadTest, LayerCountsTheWeightsDoNotHoldAreRefusedBeforeAllocating) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const int64_t rss_before = PeakRssBytes();
  EXPECT_THAT(LoadCheckpoint(HostileLedeTiny(tmp, "l31", LedeTinyConfigWith("num_hidden_layers", "2147483647"))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"num_hidden_layers\" is 2147483647, outside")));
  // Within the bound but more than the 12 layers the file holds (111 tensors).
  EXPECT_THAT(LoadCheckpoint(HostileLedeTiny(tmp, "l1000", LedeTinyConfigWith("num_hidden_layers", "1000"))),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("num_hidden_layers is 1000, but the weight files hold 111 tensors")));
  EXPECT_THAT(LoadCheckpoint(HostileLedeTiny(tmp, "ctx", LedeTinyConfigWith("max_position_embeddings", "1000000000"))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"max_position_embeddings\" is 1000000000, outside")));
  EXPECT_LT(PeakRssBytes() - rss_before, int64_t{256} << 20);
  // A config.json too large to be one is refused from its size.
  EXPECT_THAT(LoadCheckpoint(HostileLedeTiny(tmp, "big", std::string(2 << 20, ' ') + ReadAll(
                                                              lede::testing::RepoRoot() +
                                                              "/models/lede-tiny/config.json"))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("more than the 1048576 a JSON file")));
}

// A model declaring the largest window allowed (2^24 tokens) loads without
// tables for it (they would take GiBs): RoPE covers the KV cache's capacity,
// and the logits are bitwise those of the same weights with a small window.
TEST(RopeSizingTest, TablesFollowTheServedContextNotMaxPositionEmbeddings) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  checkpoint::ModelConfig small = testing::TinyConfig();
  auto random = LlamaModel::RandomInit(small, /*seed=*/3, ModelOptions{}, 0.3);
  ASSERT_THAT(random, IsOk());
  const std::string small_dir = (tmp.path() / "small").string();
  ASSERT_THAT((*random)->SaveHf(small_dir), IsOk());
  const std::string huge_dir = (tmp.path() / "huge").string();
  fs::create_directories(huge_dir);
  fs::copy_file(small_dir + "/model.safetensors", huge_dir + "/model.safetensors");
  checkpoint::ModelConfig huge = small;
  huge.max_seq_len = checkpoint::kMaxContextTokens;
  WriteText(huge_dir + "/config.json", checkpoint::ToHfConfigJson(huge));

  const int64_t rss_before = PeakRssBytes();
  for (Kernels kernels : {Kernels::kFused, Kernels::kEager}) {
    ModelOptions options;
    options.kernels = kernels;
    auto a = LlamaModel::Load(small_dir, options);
    auto b = LlamaModel::Load(huge_dir, options);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ((*b)->config().max_seq_len, checkpoint::kMaxContextTokens);
    KvCacheOptions ko;
    ko.capacity = 64;
    auto ca = KvCache::Create((*a)->config(), ko);
    auto cb = KvCache::Create((*b)->config(), ko);
    ASSERT_THAT(ca, IsOk());
    ASSERT_THAT(cb, IsOk());
    at::Tensor tokens = at::arange(0, 20, at::kLong).remainder(small.vocab_size).view({1, 20});
    at::Tensor ha = (*a)->Forward((*a)->Embed(tokens), 0, small.n_layers, 0, &*ca, 0);
    at::Tensor hb = (*b)->Forward((*b)->Embed(tokens), 0, small.n_layers, 0, &*cb, 0);
    EXPECT_TRUE(at::equal((*a)->ExitLogits(ha), (*b)->ExitLogits(hb)));
    // One more token at position 20, and a cache-free pass.
    at::Tensor next = at::full({1, 1}, 5, at::kLong);
    EXPECT_TRUE(at::equal((*a)->Forward((*a)->Embed(next), 0, small.n_layers, 20, &*ca, 0),
                          (*b)->Forward((*b)->Embed(next), 0, small.n_layers, 20, &*cb, 0)));
    EXPECT_TRUE(at::equal((*a)->Forward((*a)->Embed(tokens), 0, small.n_layers, 30, nullptr, 0),
                          (*b)->Forward((*b)->Embed(tokens), 0, small.n_layers, 30, nullptr, 0)));
  }
  // Tables for 2^24 positions would take 2^24 * 8 * 4 * 2 = 1 GiB (and 3x
  // that while built in float64).
  EXPECT_LT(PeakRssBytes() - rss_before, int64_t{256} << 20);
}

// Runs `argv` with stdout and stderr to files; returns the exit status (or
// 128 + signal) and the child's peak RSS in bytes.
int RunBinary(const std::vector<std::string>& argv, const std::string& err_path, int64_t* peak_rss) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int devnull = ::open("/dev/null", O_WRONLY);
    const int err = ::open(err_path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    dup2(devnull, 1);
    dup2(err, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  rusage u{};
  wait4(pid, &status, 0, &u);
  *peak_rss = static_cast<int64_t>(u.ru_maxrss) * 1024;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Writes `head` and extends the file to `apparent_bytes` with a hole.
bool WriteSparse(const std::string& path, const std::string& head, uint64_t apparent_bytes) {
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) return false;
  const bool ok = ::write(fd, head.data(), head.size()) == static_cast<ssize_t>(head.size()) &&
                  ::ftruncate(fd, static_cast<off_t>(apparent_bytes)) == 0;
  ::close(fd);
  return ok;
}

std::string U32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

// The probe, through the real binary: `lede generate` on each hostile file
// exits 2 with one line naming the key, under 1 GiB of peak RSS.
TEST(HostileFilesBinaryTest, LedeGenerateExitsTwoWithOneLineUnderOneGiB) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  struct Case {
    std::string model, expect;
  };
  std::vector<Case> cases = {
      {HostileLedeTiny(tmp, "layers", LedeTinyConfigWith("num_hidden_layers", "2147483647")), "num_hidden_layers"},
      {HostileLedeTiny(tmp, "window", LedeTinyConfigWith("max_position_embeddings", "1000000000")),
       "max_position_embeddings"},
  };
  const std::string tensors = (tmp.path() / "tensors.gguf").string();
  const std::string array = (tmp.path() / "array.gguf").string();
  const std::string header = "GGUF" + U32(3);
  if (WriteSparse(tensors, header + U64(uint64_t{1} << 36) + U64(0), uint64_t{1} << 41)) {
    cases.push_back({tensors, "tensor count 68719476736"});
  }
  if (WriteSparse(array,
                  header + U64(0) + U64(1) + U64(21) + "tokenizer.ggml.tokens" + U32(9) + U32(0) +
                      U64(uint64_t{1} << 40),
                  (uint64_t{1} << 40) + 4096)) {
    cases.push_back({array, "array of 1099511627776 elements"});
  }
  for (const Case& c : cases) {
    const std::string err_path = (tmp.path() / "stderr.txt").string();
    int64_t peak = 0;
    const int code =
        RunBinary({LEDE_CLI_BINARY, "generate", "--model", c.model, "--prompt", "Once", "--max-new-tokens", "4"},
                  err_path, &peak);
    const std::string err = ReadAll(err_path);
    EXPECT_EQ(code, kExitLoadFailure) << c.model << "\n" << err;
    EXPECT_THAT(err, StartsWith("lede: ")) << c.model;
    EXPECT_THAT(err, HasSubstr(c.expect)) << c.model;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << c.model << ": " << err;
    EXPECT_LT(peak, int64_t{1} << 30) << c.model;
  }
}

TEST(LoadOrExitTest, OneLineMessageKeepsTheFirstLine) {
  EXPECT_EQ(OneLineMessage(InvalidArgumentError("a: b\nException raised from x at y\nframe 1")), "a: b");
  EXPECT_EQ(OneLineMessage(InvalidArgumentError("tab\there")), "tab here");
  EXPECT_EQ(OneLineMessage(OkStatus()), "");
}

}  // namespace
}  // namespace lede::model::loaders
