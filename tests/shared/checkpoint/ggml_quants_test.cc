// Tests of shared/checkpoint/ggml_quants.h: llama.cpp's block layouts,
// decoded from hand-built blocks against values computed here from the
// format's definition, quantizers that round-trip within the format's
// step, and GGUF files holding the K-quant types.
#include "shared/checkpoint/ggml_quants.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/checkpoint/gguf.h"
#include "shared/checkpoint/number_formats.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::checkpoint {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;

void PutHalf(uint8_t* p, float f) {
  const uint16_t h = FloatToHalf(f);
  std::memcpy(p, &h, 2);
}

TEST(GgmlQuantsTest, TypeTableMatchesLlamaCppBlockSizes) {
  EXPECT_EQ(GgmlBlockValues(GgmlType::kQ4_0), 32);
  EXPECT_EQ(GgmlBlockBytes(GgmlType::kQ4_0), 18u);
  EXPECT_EQ(GgmlBlockBytes(GgmlType::kQ5_0), 22u);
  EXPECT_EQ(GgmlBlockBytes(GgmlType::kQ8_0), 34u);
  EXPECT_EQ(GgmlBlockValues(GgmlType::kQ4_K), 256);
  EXPECT_EQ(GgmlBlockBytes(GgmlType::kQ4_K), 144u);
  EXPECT_EQ(GgmlBlockBytes(GgmlType::kQ5_K), 176u);
  EXPECT_EQ(GgmlBlockBytes(GgmlType::kQ6_K), 210u);
  EXPECT_EQ(GgmlTypeBytes(GgmlType::kQ4_K, 512), 288u);
  EXPECT_TRUE(IsKnownGgmlType(14));
  EXPECT_FALSE(IsKnownGgmlType(3));  // Q4_1: not read
  EXPECT_STREQ(GgmlTypeName(GgmlType::kQ6_K), "Q6_K");
}

// Q4_0: value j = d (low nibble of byte j - 8), value j + 16 = d (high - 8).
TEST(GgmlQuantsTest, DequantizesHandBuiltQ4_0Block) {
  uint8_t b[18];
  PutHalf(b, 0.5f);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>((j & 15) | ((15 - j) << 4));
  float y[32];
  ASSERT_TRUE(DequantizeGgmlRow(GgmlType::kQ4_0, b, 32, y));
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (j - 8)) << j;
    EXPECT_EQ(y[j + 16], 0.5f * (15 - j - 8)) << j;
  }
}

// Q5_0: the fifth bit of value j is bit j of the 32-bit qh, value = d (q - 16).
TEST(GgmlQuantsTest, DequantizesHandBuiltQ5_0Block) {
  uint8_t b[22];
  PutHalf(b, 0.25f);
  const uint32_t h = 0xA5C3F00Fu;
  std::memcpy(b + 2, &h, 4);
  for (int j = 0; j < 16; ++j) b[6 + j] = static_cast<uint8_t>(((3 * j) & 15) | (((5 * j + 1) & 15) << 4));
  float y[32];
  ASSERT_TRUE(DequantizeGgmlRow(GgmlType::kQ5_0, b, 32, y));
  for (int j = 0; j < 16; ++j) {
    const int lo = ((3 * j) & 15) + 16 * ((h >> j) & 1);
    const int hi = ((5 * j + 1) & 15) + 16 * ((h >> (j + 16)) & 1);
    EXPECT_EQ(y[j], 0.25f * (lo - 16)) << j;
    EXPECT_EQ(y[j + 16], 0.25f * (hi - 16)) << j;
  }
}

// Q4_K: sub-block s has a 6-bit scale and min (the 12-byte packing),
// value = d sc q - dmin m; chunk c's bytes hold sub-blocks 2c (low nibbles)
// and 2c + 1 (high nibbles).
TEST(GgmlQuantsTest, DequantizesHandBuiltQ4_KBlock) {
  uint8_t b[144];
  PutHalf(b, 0.125f);
  PutHalf(b + 2, 0.0625f);
  const uint8_t sc[8] = {1, 63, 17, 40, 5, 33, 62, 9}, m[8] = {0, 7, 63, 21, 48, 2, 30, 11};
  // The packing written out by hand: j < 4 in the low 6 bits of bytes j
  // and j + 4; j >= 4: low nibbles in byte j + 4, top 2 bits in the top
  // bits of bytes j - 4 and j.
  for (int j = 0; j < 4; ++j) {
    b[4 + j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    b[4 + j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    b[4 + j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
  for (int i = 0; i < 128; ++i) b[16 + i] = static_cast<uint8_t>((i * 7 + 3) & 255);
  float y[256];
  ASSERT_TRUE(DequantizeGgmlRow(GgmlType::kQ4_K, b, 256, y));
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = b[16 + 32 * (s / 2) + l];
      const int q = s % 2 == 0 ? (byte & 15) : (byte >> 4);
      EXPECT_FLOAT_EQ(y[32 * s + l], 0.125f * sc[s] * q - 0.0625f * m[s]) << s << " " << l;
    }
  }
  uint8_t packed[12];
  PackKScaleMin(sc, m, packed);
  EXPECT_EQ(std::memcmp(packed, b + 4, 12), 0);
}

// Q5_K: as Q4_K, plus bit s of qh[l] adds 16 to value l of sub-block s.
TEST(GgmlQuantsTest, DequantizesHandBuiltQ5_KBlock) {
  uint8_t b[176];
  PutHalf(b, 0.5f);
  PutHalf(b + 2, 0.25f);
  const uint8_t sc[8] = {3, 1, 4, 1, 5, 9, 2, 6}, m[8] = {2, 7, 1, 8, 2, 8, 1, 8};
  PackKScaleMin(sc, m, b + 4);
  for (int l = 0; l < 32; ++l) b[16 + l] = static_cast<uint8_t>(l * 37 + 11);
  for (int i = 0; i < 128; ++i) b[48 + i] = static_cast<uint8_t>(i * 13 + 5);
  float y[256];
  ASSERT_TRUE(DequantizeGgmlRow(GgmlType::kQ5_K, b, 256, y));
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = b[48 + 32 * (s / 2) + l];
      const int q = (s % 2 == 0 ? (byte & 15) : (byte >> 4)) + 16 * ((b[16 + l] >> s) & 1);
      EXPECT_FLOAT_EQ(y[32 * s + l], 0.5f * sc[s] * q - 0.25f * m[s]) << s << " " << l;
    }
  }
}

// Q6_K: value i = d scales[i / 16] (q - 32); q's low 4 bits from ql, high
// 2 bits from qh, per half of 128 values and quarter k of 32.
TEST(GgmlQuantsTest, DequantizesHandBuiltQ6_KBlock) {
  uint8_t b[210];
  for (int i = 0; i < 128; ++i) b[i] = static_cast<uint8_t>(i * 29 + 1);
  for (int i = 0; i < 64; ++i) b[128 + i] = static_cast<uint8_t>(i * 53 + 7);
  for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(s * 17 - 128 + 3));
  PutHalf(b + 208, 0.03125f);
  float y[256];
  ASSERT_TRUE(DequantizeGgmlRow(GgmlType::kQ6_K, b, 256, y));
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128, k = (i % 128) / 32, l = i % 32;
    const uint8_t low = b[64 * h + l + (k % 2 == 1 ? 32 : 0)];
    const int lo4 = k < 2 ? (low & 15) : (low >> 4);
    const int hi2 = (b[128 + 32 * h + l] >> (2 * k)) & 3;
    const auto scale = static_cast<int8_t>(b[192 + i / 16]);
    EXPECT_FLOAT_EQ(y[i], 0.03125f * scale * ((lo4 | (hi2 << 4)) - 32)) << i;
  }
}

// Every quantizer round-trips within its format's step (values in
// [-1, 1]): |x - deq(q(x))| at most one step (the symmetric types clip the
// end opposite the largest value at q = 7 / 15 / 31 of -8 / -16 / -32, as
// llama.cpp's do), root-mean-square error about a third of a step.
TEST(GgmlQuantsTest, QuantizersRoundTripWithinTheirStep) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.4f);
  std::vector<float> x(1024);
  for (float& v : x) v = std::max(-1.0f, std::min(1.0f, normal(rng)));
  const std::pair<GgmlType, float> cases[] = {{GgmlType::kQ4_0, 1.0f / 8},  {GgmlType::kQ5_0, 1.0f / 16},
                                              {GgmlType::kQ8_0, 1.0f / 127}, {GgmlType::kQ4_K, 2.0f / 15},
                                              {GgmlType::kQ5_K, 2.0f / 31},  {GgmlType::kQ6_K, 1.0f / 32}};
  for (const auto& [type, step] : cases) {
    std::vector<uint8_t> q(GgmlTypeBytes(type, 1024));
    ASSERT_TRUE(QuantizeGgmlRow(type, x.data(), 1024, q.data())) << GgmlTypeName(type);
    std::vector<float> y(1024);
    ASSERT_TRUE(DequantizeGgmlRow(type, q.data(), 1024, y.data()));
    double err2 = 0, max_err = 0;
    for (int i = 0; i < 1024; ++i) {
      err2 += (x[i] - y[i]) * (x[i] - y[i]);
      max_err = std::max<double>(max_err, std::fabs(x[i] - y[i]));
    }
    EXPECT_LE(max_err, 1.0 * step) << GgmlTypeName(type);
    EXPECT_LE(std::sqrt(err2 / 1024), 0.35 * step) << GgmlTypeName(type);
  }
  EXPECT_FALSE(QuantizeGgmlRow(GgmlType::kQ4_K, x.data(), 100, nullptr));  // not whole blocks
  EXPECT_FALSE(QuantizeGgmlRow(GgmlType::kF32, x.data(), 32, nullptr));
}

// A GGUF file with K-quant tensors is written, opened and dequantized; a
// Q4_K tensor whose rows are not a multiple of 256 is refused, naming it.
TEST(GgmlQuantsTest, GgufHoldsKQuantTensors) {
  lede::testing::TempDir tmp;
  const std::string path = (tmp.path() / "k.gguf").string();
  std::vector<float> w(2 * 512);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.37f * static_cast<float>(i));
  GgufWriter writer;
  std::vector<std::vector<uint8_t>> keep;
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    auto bytes = QuantizeFromF32(w.data(), static_cast<int64_t>(w.size()), t);
    ASSERT_THAT(bytes, IsOk());
    ASSERT_THAT(writer.AddTensor(std::string("w.") + GgmlTypeName(t), t, {2, 512}, std::move(*bytes)), IsOk());
  }
  EXPECT_THAT(writer.AddTensor("bad", GgmlType::kQ4_K, {2, 96}, std::vector<uint8_t>(2 * 144)),
              StatusIs(StatusCode::kInvalidArgument));
  ASSERT_THAT(writer.Write(path), IsOk());
  auto file = GgufFile::Open(path);
  ASSERT_THAT(file, IsOk());
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    const GgufTensor* g = (*file)->FindTensor(std::string("w.") + GgmlTypeName(t));
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->type, t);
    EXPECT_EQ(g->nbytes, GgmlTypeBytes(t, 1024));
    std::vector<float> y(1024), direct(1024);
    ASSERT_THAT(DequantizeToF32(*g, y.data()), IsOk());
    ASSERT_TRUE(DequantizeGgmlRow(t, g->data, 1024, direct.data()));
    EXPECT_EQ(y, direct);
    for (int i = 0; i < 1024; ++i) ASSERT_NEAR(y[i], w[i], 0.2) << GgmlTypeName(t) << " " << i;
  }
}

}  // namespace
}  // namespace lede::checkpoint
