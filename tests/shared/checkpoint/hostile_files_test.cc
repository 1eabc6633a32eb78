// Model files as untrusted input (docs/design.md §5): the probe's hostile
// files (issue "every file is hostile input") are refused with one message
// naming the key, before anything is sized by the count they declare.
//  - GGUF whose counts fit the file's apparent size: the file is sparse
//    (ftruncate), so a tensor count of 2^36 or a metadata array of 2^40 (or
//    2^28) elements costs no disk, and the reader must refuse it from the
//    count alone (it used to reserve for it: bad_alloc, or 2.4 GB).
//  - config.json with num_hidden_layers 2^31-1 or max_position_embeddings
//    1e9 (it used to be refused after 8 GB, or not at all).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/checkpoint/gguf.h"
#include "shared/checkpoint/model_config.h"
#include "shared/checkpoint/model_limits.h"
#include "shared/checkpoint/safetensors.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::checkpoint {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

std::string U32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string Str(const std::string& v) { return U64(v.size()) + v; }
std::string Header(uint64_t n_tensors, uint64_t n_kv) { return "GGUF" + U32(3) + U64(n_tensors) + U64(n_kv); }

// Peak resident set of this process so far, in bytes.
int64_t PeakRssBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// Writes `head` and extends the file to `apparent_bytes` with a hole (no
// disk used). False where the file system cannot hold a file that large.
bool WriteSparse(const std::string& path, const std::string& head, uint64_t apparent_bytes) {
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) return false;
  bool ok = ::write(fd, head.data(), head.size()) == static_cast<ssize_t>(head.size()) &&
            ::ftruncate(fd, static_cast<off_t>(apparent_bytes)) == 0;
  ::close(fd);
  return ok;
}

class HostileGgufTest : public ::testing::Test {
 protected:
  // Opens a sparse file of `apparent_bytes` starting with `head` (skips the
  // test where the file system refuses the size).
  StatusOr<std::shared_ptr<const GgufFile>> OpenSparse(const std::string& head, uint64_t apparent_bytes) {
    const std::string path = (tmp_.path() / ("f" + std::to_string(n_++) + ".gguf")).string();
    if (!WriteSparse(path, head, apparent_bytes)) return UnavailableError("sparse file too large here");
    return GgufFile::Open(path);
  }
  testing::TempDir tmp_;
  int n_ = 0;
};

TEST_F(HostileGgufTest, TensorCountThatFitsASparseFileIsRefusedFromTheCount) {
  // 2^36 tensor records of 32 bytes fit a 2^41-byte (2 TiB) sparse file.
  const int64_t rss_before = PeakRssBytes();
  auto f = OpenSparse(Header(uint64_t{1} << 36, 0), uint64_t{1} << 41);
  if (f.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << f.status();
  EXPECT_THAT(f, StatusIs(StatusCode::kInvalidArgument, HasSubstr("tensor count 68719476736 exceeds the limit")));
  EXPECT_LT(PeakRssBytes() - rss_before, int64_t{64} << 20);
}

TEST_F(HostileGgufTest, MetadataArraysBeyondTheDecodedBudgetAreRefusedFromTheirLength) {
  const int64_t rss_before = PeakRssBytes();
  // 2^40 uint8 elements in a sparse file of 2^40 + 4096 bytes (1 TiB).
  const std::string big = Header(0, 1) + Str("tokenizer.ggml.token_type") + U32(9) + U32(0) + U64(uint64_t{1} << 40);
  auto f = OpenSparse(big, (uint64_t{1} << 40) + 4096);
  if (f.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << f.status();
  EXPECT_THAT(f, StatusIs(StatusCode::kInvalidArgument,
                          HasSubstr("metadata key tokenizer.ggml.token_type: array of 1099511627776 elements "
                                    "exceeds the metadata limit")));
  // 2^28 elements (the probe's 2.4 GB case): 2 GiB once widened to doubles.
  const std::string mid = Header(0, 1) + Str("a.bytes") + U32(9) + U32(0) + U64(uint64_t{1} << 28);
  f = OpenSparse(mid, (uint64_t{1} << 28) + 4096);
  if (f.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << f.status();
  EXPECT_THAT(f, StatusIs(StatusCode::kInvalidArgument, HasSubstr("metadata key a.bytes: array of 268435456")));
  // 2^26 empty strings: 2 GiB of std::string.
  const std::string strs = Header(0, 1) + Str("tokenizer.ggml.tokens") + U32(9) + U32(8) + U64(uint64_t{1} << 26);
  f = OpenSparse(strs, (uint64_t{1} << 29) + 4096);
  if (f.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << f.status();
  EXPECT_THAT(f, StatusIs(StatusCode::kInvalidArgument, HasSubstr("metadata key tokenizer.ggml.tokens: array of")));
  EXPECT_LT(PeakRssBytes() - rss_before, int64_t{64} << 20);
}

TEST_F(HostileGgufTest, StringLengthsAndCountsHaveTheSpecsBounds) {
  // A key longer than 65535 bytes (ggml's docs/gguf.md), a string value
  // larger than the whole metadata budget, 2^17 keys, a 65-byte tensor name.
  auto f = OpenSparse(Header(0, 1) + U64(65536), uint64_t{1} << 20);
  EXPECT_THAT(f, StatusIs(StatusCode::kInvalidArgument, HasSubstr("metadata key #0: length 65536")));
  f = OpenSparse(Header(0, 1) + Str("general.name") + U32(8) + U64(uint64_t{1} << 30), (uint64_t{1} << 30) + 4096);
  if (f.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << f.status();
  EXPECT_THAT(f, StatusIs(StatusCode::kInvalidArgument, HasSubstr("metadata key general.name: length 1073741824")));
  f = OpenSparse(Header(0, uint64_t{1} << 17), uint64_t{1} << 24);
  EXPECT_THAT(f, StatusIs(StatusCode::kInvalidArgument, HasSubstr("metadata count 131072 exceeds the limit")));
  f = OpenSparse(Header(1, 0) + Str(std::string(65, 'x')), 4096);
  EXPECT_THAT(f, StatusIs(StatusCode::kInvalidArgument, HasSubstr("tensor name #0: length 65")));
}

// A llama header whose block count or context window is absurd: refused
// naming the key, before the list of required tensors is sized by it.
TEST_F(HostileGgufTest, LlamaBlockCountAndContextAreBounded) {
  auto write = [&](uint32_t block_count, uint32_t context) {
    GgufWriter w;
    w.AddString("general.architecture", "llama");
    w.AddUint32("llama.context_length", context);
    w.AddUint32("llama.embedding_length", 64);
    w.AddUint32("llama.block_count", block_count);
    w.AddUint32("llama.feed_forward_length", 96);
    w.AddUint32("llama.attention.head_count", 4);
    w.AddFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    static const std::vector<float> zeros(64 * 5, 0.0f);
    EXPECT_THAT(w.AddTensor("token_embd.weight", GgmlType::kF32, {5, 64}, zeros.data(), zeros.size() * 4), IsOk());
    EXPECT_THAT(w.AddTensor("output_norm.weight", GgmlType::kF32, {64}, zeros.data(), 64 * 4), IsOk());
    const std::string path = (tmp_.path() / ("llama" + std::to_string(n_++) + ".gguf")).string();
    EXPECT_THAT(w.Write(path), IsOk());
    auto f = GgufFile::Open(path);
    EXPECT_THAT(f, IsOk());
    return GgufLlamaConfig(**f);
  };
  EXPECT_THAT(write(0x7fffffff, 128), StatusIs(StatusCode::kInvalidArgument,
                                               HasSubstr("metadata key llama.block_count is 2147483647, outside")));
  EXPECT_THAT(write(1000, 128),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("llama.block_count is 1000, but the file holds 2 tensors (each block needs 9)")));
  EXPECT_THAT(write(2, 1000000000), StatusIs(StatusCode::kInvalidArgument,
                                             HasSubstr("metadata key llama.context_length is 1000000000, outside")));
}

std::string ConfigJson(int64_t layers, int64_t context) {
  return R"({"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": )" + std::to_string(layers) +
         R"(, "num_attention_heads": 4, "vocab_size": 5, "max_position_embeddings": )" + std::to_string(context) +
         "}";
}

TEST(HostileConfigTest, LayerCountAndContextWindowAreBoundedNamingTheKey) {
  EXPECT_THAT(model::ParseHfConfig(ConfigJson(2, 128), "config.json"), IsOk());
  EXPECT_THAT(model::ParseHfConfig(ConfigJson(2147483647, 128), "config.json"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("config.json: field \"num_hidden_layers\" is 2147483647, outside [1, 65536]")));
  EXPECT_THAT(model::ParseHfConfig(ConfigJson(2, 1000000000), "config.json"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("field \"max_position_embeddings\" is 1000000000, outside [1, 16777216]")));
  // The bound itself is accepted: a 16M-token window is a real (if large) model.
  EXPECT_THAT(model::ParseHfConfig(ConfigJson(2, model::kMaxContextTokens), "config.json"), IsOk());
  EXPECT_THAT(model::ParseHfConfig(R"({"hidden_size": 2097152, "intermediate_size": 96, "num_hidden_layers": 2,
                                       "num_attention_heads": 4, "vocab_size": 5, "max_position_embeddings": 8})",
                                   "config.json"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("field \"hidden_size\" is 2097152")));
  // Validate holds the same bounds for configs made elsewhere.
  auto c = model::ParseHfConfig(ConfigJson(2, 128), "config.json");
  ASSERT_THAT(c, IsOk());
  c->max_seq_len = model::kMaxContextTokens + 1;
  EXPECT_THAT(c->Validate(), StatusIs(StatusCode::kInvalidArgument, HasSubstr("ModelConfig.max_seq_len")));
}

// A safetensors header is JSON of up to 100 MiB, which a DOM parse would
// blow up some 100-fold when it is deeply nested or made of tiny values:
// both are refused from a scan of the text before parsing.
TEST(HostileSafetensorsTest, HeaderNestingAndValueCountAreBoundedBeforeParsing) {
  testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  auto write = [&](const std::string& name, std::string header) {
    header.resize((header.size() + 7) / 8 * 8, ' ');
    const std::string path = (tmp.path() / name).string();
    std::ofstream(path, std::ios::binary) << U64(header.size()) << header;
    return path;
  };
  const int64_t rss_before = PeakRssBytes();
  EXPECT_THAT(SafetensorsFile::Open(write("nested.safetensors", "{\"a\":" + std::string(1000, '[') +
                                                                  std::string(1000, ']') + "}")),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("header nests deeper than 8 levels")));
  std::string many = "{";
  for (int i = 0; i < (1 << 21); ++i) many += "\"" + std::to_string(i) + "\":{},";
  many.back() = '}';
  EXPECT_THAT(SafetensorsFile::Open(write("many.safetensors", many)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("holds more than 2097152 JSON values")));
  EXPECT_LT(PeakRssBytes() - rss_before, int64_t{128} << 20);
  // Brackets and colons inside strings do not count.
  const std::string quoted = R"({"__metadata__": {"note": "[[[[[[[[[[:,:,{{{{{{{{{{\"]"}})";
  EXPECT_THAT(SafetensorsFile::Open(write("quoted.safetensors", quoted)), IsOk());
}

}  // namespace
}  // namespace lede::checkpoint
