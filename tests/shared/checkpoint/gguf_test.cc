// Tests for shared/checkpoint/gguf.h: GgufWriter and GgufFile round-trip
// metadata and F32/F16/BF16/Q8_0 tensors; Q8_0 follows the block layout
// (f16 scale + 32 int8); malformed files (bad magic or version, every
// truncation, an unsupported type, overlapping or misaligned tensors, a
// count past the end) are refused with one message naming the key or
// tensor; the llama metadata maps to ModelConfig and contradictions are
// refused naming the tensor.
#include "shared/checkpoint/gguf.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::checkpoint {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

StatusOr<std::shared_ptr<const GgufFile>> ParseBytes(const std::string& bytes) {
  auto owner = std::make_shared<std::string>(bytes);
  return GgufFile::Parse(owner, reinterpret_cast<const uint8_t*>(owner->data()), owner->size(), "mem.gguf");
}

std::vector<float> Ramp(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 37) % 29 - 14);
  return v;
}

// A small valid file: a few metadata types and one tensor of each type.
std::string SmallFile(const testing::TempDir& tmp) {
  GgufWriter w;
  w.AddString("general.architecture", "test");
  w.AddUint32("a.u32", 7);
  w.AddInt32("a.i32", -3);
  w.AddFloat32("a.f32", 0.25f);
  w.AddBool("a.bool", true);
  w.AddStringArray("a.strs", {"x", "", "zz"});
  w.AddFloat32Array("a.floats", {1.5f, -2.0f});
  w.AddInt32Array("a.ints", {1, 2, 3});
  static const std::vector<float> f32 = Ramp(6, 0.5f);
  static std::vector<uint8_t> f16, bf16, q8;
  f16 = *QuantizeFromF32(f32.data(), 6, GgmlType::kF16);
  bf16 = *QuantizeFromF32(f32.data(), 6, GgmlType::kBF16);
  static const std::vector<float> big = Ramp(64, 0.01f);
  q8 = *QuantizeFromF32(big.data(), 64, GgmlType::kQ8_0);
  EXPECT_THAT(w.AddTensor("t.f32", GgmlType::kF32, {2, 3}, f32.data(), 24), IsOk());
  EXPECT_THAT(w.AddTensor("t.f16", GgmlType::kF16, {3, 2}, f16.data(), f16.size()), IsOk());
  EXPECT_THAT(w.AddTensor("t.bf16", GgmlType::kBF16, {6}, bf16.data(), bf16.size()), IsOk());
  EXPECT_THAT(w.AddTensor("t.q8", GgmlType::kQ8_0, {2, 32}, q8.data(), q8.size()), IsOk());
  const std::string path = (tmp.path() / "small.gguf").string();
  EXPECT_THAT(w.Write(path), IsOk());
  return ReadAll(path);
}

TEST(GgufTest, RoundTripsMetadataAndTensors) {
  testing::TempDir tmp;
  const std::string bytes = SmallFile(tmp);
  auto f = ParseBytes(bytes);
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "test");
  EXPECT_EQ(*(*f)->GetInt("a.u32"), 7);
  EXPECT_EQ(*(*f)->GetInt("a.i32"), -3);
  EXPECT_EQ(*(*f)->GetFloat("a.f32"), 0.25);
  EXPECT_TRUE(*(*f)->GetBool("a.bool"));
  EXPECT_THAT(*(*f)->GetStringArray("a.strs"), ::testing::ElementsAre("x", "", "zz"));
  EXPECT_THAT(*(*f)->GetNumberArray("a.floats"), ::testing::ElementsAre(1.5, -2.0));
  EXPECT_THAT(*(*f)->GetNumberArray("a.ints"), ::testing::ElementsAre(1, 2, 3));
  EXPECT_THAT((*f)->GetInt("a.strs"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT((*f)->GetString("a.missing"), StatusIs(StatusCode::kNotFound));

  const GgufTensor* t = (*f)->FindTensor("t.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ne, (std::vector<int64_t>{3, 2}));  // ggml order: innermost first
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{2, 3}));
  std::vector<float> out(6);
  ASSERT_THAT(DequantizeToF32(*t, out.data()), IsOk());
  EXPECT_EQ(out, Ramp(6, 0.5f));
  for (const char* name : {"t.f16", "t.bf16"}) {  // halves of multiples of 0.5 are exact
    t = (*f)->FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_THAT(DequantizeToF32(*t, out.data()), IsOk());
    EXPECT_EQ(out, Ramp(6, 0.5f)) << name;
  }
  t = (*f)->FindTensor("t.q8");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, GgmlType::kQ8_0);
  EXPECT_EQ(t->nbytes, 2 * kQ8_0BlockBytes);
  for (const GgufTensor& x : (*f)->tensors()) EXPECT_EQ(x.offset % 32, 0u) << x.name;
}

// Q8_0: per block of 32, d = max|x| / 127 as f16, q = round(x / d); the
// largest magnitude maps to +-127 and the error is at most d/2 (+ f16 scale
// rounding).
TEST(GgufTest, Q8_0FollowsTheBlockLayout) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = std::sin(0.3f * i) * (i < 32 ? 1.0f : 0.01f);
  x[5] = -2.54f;  // block 0's largest magnitude
  auto q = QuantizeFromF32(x.data(), 64, GgmlType::kQ8_0);
  ASSERT_THAT(q, IsOk());
  ASSERT_EQ(q->size(), 68u);
  uint16_t dh;
  std::memcpy(&dh, q->data(), 2);
  EXPECT_NEAR(HalfToFloat(dh), 2.54f / 127.0f, 1e-5);
  EXPECT_EQ(static_cast<int8_t>((*q)[2 + 5]), -127);
  GgufTensor t;
  t.name = "q";
  t.type = GgmlType::kQ8_0;
  t.ne = {64};
  t.data = q->data();
  t.nbytes = q->size();
  std::vector<float> back(64);
  ASSERT_THAT(DequantizeToF32(t, back.data()), IsOk());
  for (int i = 0; i < 64; ++i) {
    const float d = i < 32 ? 2.54f / 127.0f : 0.01f / 127.0f;
    EXPECT_NEAR(back[i], x[i], 0.51f * d + 1e-3f * std::fabs(x[i])) << i;
  }
  EXPECT_THAT(QuantizeFromF32(x.data(), 40, GgmlType::kQ8_0), StatusIs(StatusCode::kInvalidArgument));
}

TEST(GgufTest, HalfConversionsRoundToNearestEven) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(v)), v) << v;
  }
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048.0f), 0x3c00);   // tie, even stays
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048.0f), 0x3c02);   // tie, odd rounds up
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + 1.0f / 256.0f), 0x3f80);    // tie to even
  EXPECT_EQ(FloatToBf16(1.0f + 3.0f / 256.0f), 0x3f82);
}

TEST(GgufTest, RefusesBadMagicAndVersion) {
  testing::TempDir tmp;
  std::string bytes = SmallFile(tmp);
  std::string bad = bytes;
  bad[3] = 'X';
  EXPECT_THAT(ParseBytes(bad), StatusIs(StatusCode::kInvalidArgument, HasSubstr("bad magic")));
  bad = bytes;
  bad[4] = 4;
  EXPECT_THAT(ParseBytes(bad), StatusIs(StatusCode::kInvalidArgument, HasSubstr("version 4")));
  EXPECT_THAT(ParseBytes(""), StatusIs(StatusCode::kInvalidArgument));
}

// Every proper prefix of a valid file is refused (and nothing past it is
// read: the parser sees exactly the prefix's bytes in a fresh buffer).
TEST(GgufTest, RefusesEveryTruncation) {
  testing::TempDir tmp;
  const std::string bytes = SmallFile(tmp);
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto f = ParseBytes(bytes.substr(0, n));
    ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes accepted";
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << n;
  }
  EXPECT_THAT(ParseBytes(bytes.substr(0, bytes.size() - 1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tensor t.q8")));
}

// Builds a file by hand: header, records and tensor infos as given.
std::string RawFile(uint64_t n_tensors, uint64_t n_kv, const std::string& body) {
  std::string s = "GGUF";
  auto put = [&](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  };
  put(3, 4);
  put(n_tensors, 8);
  put(n_kv, 8);
  return s + body;
}
std::string Str(const std::string& v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(static_cast<uint64_t>(v.size()) >> (8 * i)));
  return s + v;
}
std::string U32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string TensorInfo(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
  std::string s = Str(name) + U32(static_cast<uint32_t>(ne.size()));
  for (uint64_t d : ne) s += U64(d);
  return s + U32(type) + U64(offset);
}
std::string Pad(std::string s) {
  s.resize((s.size() + 31) / 32 * 32, '\0');
  return s;
}

TEST(GgufTest, RefusesUnsupportedTypesAndBadLayouts) {
  // Q4_1 (type 3, not read): named with its number.
  EXPECT_THAT(ParseBytes(Pad(RawFile(1, 0, TensorInfo("blk.0.attn_q.weight", {32}, 3, 0))) + std::string(20, '\0')),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("blk.0.attn_q.weight: unsupported tensor type 3")));
  // Q4_0 (type 2) is read; Q4_K (12) rows must be whole blocks of 256.
  EXPECT_THAT(ParseBytes(Pad(RawFile(1, 0, TensorInfo("q", {32}, 2, 0))) + std::string(32, '\0')), IsOk());
  EXPECT_THAT(ParseBytes(Pad(RawFile(1, 0, TensorInfo("k", {128}, 12, 0))) + std::string(160, '\0')),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("Q4_K row length 128 is not a multiple of 256")));
  // Q8_0 rows must be whole blocks.
  EXPECT_THAT(ParseBytes(Pad(RawFile(1, 0, TensorInfo("w", {30}, 8, 0))) + std::string(64, '\0')),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("multiple of 32")));
  // Overlapping tensors.
  EXPECT_THAT(ParseBytes(Pad(RawFile(2, 0, TensorInfo("a", {16}, 0, 0) + TensorInfo("b", {16}, 0, 32))) +
                         std::string(128, '\0')),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("overlap")));
  // An offset off the alignment.
  EXPECT_THAT(ParseBytes(Pad(RawFile(1, 0, TensorInfo("a", {4}, 0, 4))) + std::string(64, '\0')),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("alignment")));
  // A zero dim.
  EXPECT_THAT(ParseBytes(Pad(RawFile(1, 0, TensorInfo("a", {4, 0}, 0, 0))) + std::string(64, '\0')),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tensor a")));
  // A count the file cannot hold, a string past the end, an unknown value type.
  EXPECT_THAT(ParseBytes(RawFile(0, uint64_t{1} << 60, "")), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseBytes(RawFile(0, 1, Str("k") + U32(8) + U64(1000) + "abc")),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("metadata key k")));
  EXPECT_THAT(ParseBytes(RawFile(0, 1, Str("k") + U32(13) + U64(0))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("unknown value type 13")));
  EXPECT_THAT(ParseBytes(RawFile(0, 1, Str("k") + U32(9) + U32(9) + U64(1))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("arrays of arrays")));
  EXPECT_THAT(ParseBytes(RawFile(0, 2, Str("k") + U32(4) + U32(1) + Str("k") + U32(4) + U32(2))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("duplicate metadata key k")));
  // Alignment 64 from general.alignment is honoured.
  std::string aligned = RawFile(1, 1, Str("general.alignment") + U32(4) + U32(64) + TensorInfo("a", {4}, 0, 0));
  aligned.resize(128, '\0');
  aligned += std::string(16, '\0');
  auto f = ParseBytes(aligned);
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ((*f)->alignment(), 64u);
}

TEST(GgufTest, MapsNamesBothWays) {
  EXPECT_EQ(GgufToHfName("blk.11.attn_q.weight"), "model.layers.11.self_attn.q_proj.weight");
  EXPECT_EQ(GgufToHfName("blk.0.ffn_down.weight"), "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(GgufToHfName("token_embd.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(GgufToHfName("output.weight"), "lm_head.weight");
  EXPECT_EQ(GgufToHfName("output_norm.weight"), "model.norm.weight");
  EXPECT_EQ(GgufToHfName("blk.x.attn_q.weight"), "");
  EXPECT_EQ(GgufToHfName("rope_freqs.weight"), "");
  for (const char* hf : {"model.layers.3.input_layernorm.weight", "model.layers.3.self_attn.o_proj.weight",
                         "model.layers.3.post_attention_layernorm.weight", "model.layers.3.mlp.up_proj.weight",
                         "model.layers.3.mlp.gate_proj.weight", "lm_head.weight"}) {
    EXPECT_EQ(GgufToHfName(HfToGgufName(hf)), hf);
  }
}

// A llama file: metadata -> ModelConfig, and a tensor whose dims contradict
// the metadata is refused naming it.
class GgufLlamaTest : public ::testing::Test {
 protected:
  // d 64, 4 heads (2 kv), FFN 96, 2 layers, vocab 5, tied unless `untied`.
  std::string Write(bool untied, int64_t bad_ffn = 0, const std::string& arch = "llama",
                    model::RopeScaling scaling = {}, const std::vector<float>* rope_freqs = nullptr) {
    GgufWriter w;
    model::ModelConfig c;
    c.rope_scaling = scaling;
    c.dim = 64;
    c.hidden_dim = 96;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.vocab_size = 5;
    c.max_seq_len = 128;
    c.rope_theta = 500000.0;
    EXPECT_THAT(AddLlamaMetadata(c, "t", &w), IsOk());
    if (arch != "llama") w.AddString("general.architecture", arch);  // a second, contradicting record
    if (rope_freqs != nullptr) {
      EXPECT_THAT(w.AddTensor("rope_freqs.weight", GgmlType::kF32, {static_cast<int64_t>(rope_freqs->size())},
                              rope_freqs->data(), rope_freqs->size() * 4),
                  IsOk());
    }
    w.AddUint32("tokenizer.ggml.bos_token_id", 3);
    w.AddUint32("tokenizer.ggml.eos_token_id", 4);
    w.AddUint32("tokenizer.ggml.eot_token_id", 2);
    zeros_.assign(64 * 96, 0.0f);
    auto add = [&](const std::string& name, std::vector<int64_t> shape) {
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      ASSERT_THAT(w.AddTensor(name, GgmlType::kF32, shape, zeros_.data(), static_cast<size_t>(n) * 4), IsOk());
    };
    add("token_embd.weight", {5, 64});
    for (int i = 0; i < 2; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      add(p + "attn_norm.weight", {64});
      add(p + "attn_q.weight", {64, 64});
      add(p + "attn_k.weight", {32, 64});
      add(p + "attn_v.weight", {32, 64});
      add(p + "attn_output.weight", {64, 64});
      add(p + "ffn_norm.weight", {64});
      add(p + "ffn_gate.weight", {96, 64});
      add(p + "ffn_up.weight", {i == 1 && bad_ffn ? bad_ffn : 96, 64});
      add(p + "ffn_down.weight", {64, 96});
    }
    add("output_norm.weight", {64});
    if (untied) add("output.weight", {5, 64});
    const std::string path = (tmp_.path() / ("m" + std::to_string(n_++) + ".gguf")).string();
    EXPECT_THAT(w.Write(path), IsOk());
    return path;
  }
  testing::TempDir tmp_;
  std::vector<float> zeros_;
  int n_ = 0;
};

TEST_F(GgufLlamaTest, ReadsTheHyperParameters) {
  auto f = GgufFile::Open(Write(/*untied=*/false));
  ASSERT_THAT(f, IsOk());
  auto c = GgufLlamaConfig(**f);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->dim, 64);
  EXPECT_EQ(c->hidden_dim, 96);
  EXPECT_EQ(c->n_layers, 2);
  EXPECT_EQ(c->n_heads, 4);
  EXPECT_EQ(c->n_kv_heads, 2);
  EXPECT_EQ(c->vocab_size, 5);
  EXPECT_EQ(c->max_seq_len, 128);
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);  // the float32 read back as the decimal written
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope_style, model::RopeStyle::kAdjacentPairs);
  EXPECT_EQ(c->bos_id, 3);
  EXPECT_THAT(c->eos_ids, ::testing::ElementsAre(4, 2));

  f = GgufFile::Open(Write(/*untied=*/true));
  ASSERT_THAT(f, IsOk());
  c = GgufLlamaConfig(**f);
  ASSERT_THAT(c, IsOk());
  EXPECT_FALSE(c->tie_word_embeddings);
}

TEST_F(GgufLlamaTest, RefusesContradictionsNamingTheTensorOrKey) {
  auto f = GgufFile::Open(Write(false, /*bad_ffn=*/80));
  ASSERT_THAT(f, IsOk());
  EXPECT_THAT(GgufLlamaConfig(**f),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tensor blk.1.ffn_up.weight has dims [64, 80]")));
  // A duplicate general.architecture is refused by the reader itself.
  EXPECT_THAT(GgufFile::Open(Write(false, 0, "gpt2")),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("duplicate metadata key general.architecture")));
  GgufWriter w;
  w.AddString("general.architecture", "falcon");
  const std::string path = (tmp_.path() / "falcon.gguf").string();
  ASSERT_THAT(w.Write(path), IsOk());
  f = GgufFile::Open(path);
  ASSERT_THAT(f, IsOk());
  EXPECT_THAT(GgufLlamaConfig(**f),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("general.architecture is \"falcon\"")));
}

// Llama-3 RoPE scaling travels as llama.cpp's rope_freqs.weight and comes
// back as the same parameters; divisors no parameters reproduce are refused.
TEST_F(GgufLlamaTest, Llama3RopeScalingRoundTripsThroughRopeFreqs) {
  model::RopeScaling s;
  s.type = model::RopeScaling::Type::kLlama3;
  s.factor = 32.0;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 8192;
  auto f = GgufFile::Open(Write(false, 0, "llama", s));
  ASSERT_THAT(f, IsOk());
  const GgufTensor* freqs = (*f)->FindTensor("rope_freqs.weight");
  ASSERT_NE(freqs, nullptr);
  EXPECT_EQ(freqs->ne, std::vector<int64_t>{8});  // head dim 16 / 2
  std::vector<float> v(8);
  ASSERT_THAT(DequantizeToF32(*freqs, v.data()), IsOk());
  EXPECT_EQ(v.front(), 1.0f);   // the shortest wavelength is not scaled
  EXPECT_EQ(v.back(), 32.0f);   // the longest by the factor
  EXPECT_GT(v[4], 1.0f);        // 2*pi*500000^(1/2) = 4443 lies between 2048 and 8192: blended
  EXPECT_LT(v[4], 32.0f);
  auto c = GgufLlamaConfig(**f);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->rope_scaling.type, model::RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);

  const std::vector<float> odd = {1, 1, 3, 1, 5, 1, 7, 9};
  f = GgufFile::Open(Write(false, 0, "llama", model::RopeScaling{}, &odd));
  ASSERT_THAT(f, IsOk());
  EXPECT_THAT(GgufLlamaConfig(**f), StatusIs(StatusCode::kInvalidArgument, HasSubstr("rope_freqs.weight")));
}

}  // namespace
}  // namespace lede::checkpoint
