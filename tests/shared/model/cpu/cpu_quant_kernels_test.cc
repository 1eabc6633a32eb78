// Tests of cpu_quant_kernels.h: the float16 / bfloat16
// conversions, llama.cpp's Q8_0 quantization rule, and the packed bf16 and
// Q8_0 few-row products on every instruction set this CPU runs, against
// double-precision references, with every kind of tail (out % 4, in % 16,
// n), accumulation, a split of the output rows at a multiple of 4, and
// rows independent of the rows beside them (bitwise).
#include "shared/model/cpu/cpu_quant_kernels.h"
#include "shared/model/cpu/cpu_kernels.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "shared/model/loaders/weight_format.h"
#include "tests/testing/status_matchers.h"

namespace lede::model::cpu {
namespace {

using ::lede::testing::StatusIs;

std::vector<float> Normal(int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<QuantIsa> Isas() {
  std::vector<QuantIsa> isas = {QuantIsa::kPortable};
  if (BestQuantIsa() >= QuantIsa::kAvx2) isas.push_back(QuantIsa::kAvx2);
  if (BestQuantIsa() >= QuantIsa::kAvx512) isas.push_back(QuantIsa::kAvx512);
  return isas;
}

TEST(WeightFormatTest, ParsesAndNamesEveryFormat) {
  for (loaders::WeightFormat f : {loaders::WeightFormat::kAuto, loaders::WeightFormat::kF32, loaders::WeightFormat::kBf16, loaders::WeightFormat::kQ8_0}) {
    auto parsed = loaders::ParseWeightFormat(loaders::WeightFormatName(f));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, f);
  }
  EXPECT_THAT(loaders::ParseWeightFormat("int4"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_DOUBLE_EQ(loaders::WeightFormatBytes(loaders::WeightFormat::kQ8_0), 34.0 / 32.0);
}

TEST(CpuQuantKernelsTest, HalfConversionsRoundToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);                  // the tie above the largest half: infinity
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie: to even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie: to even (up)
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every half but NaNs round-trips
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << h;
  }
  EXPECT_FLOAT_EQ(HalfToFloat(0x3555), 0.333251953125f);
}

TEST(CpuQuantKernelsTest, Bf16ConversionsRoundToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie: to even
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie: to even (up)
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -7)), 0x3f81);      // exact
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
  EXPECT_FLOAT_EQ(Bf16ToFloat(FloatToBf16(-3.5f)), -3.5f);
}

// llama.cpp's Q8_0: d = amax / 127 as float16, q = round(w / d); the block's
// largest |w| maps to +-127; every value within d / 2 (+ float16 rounding of
// d) of w; a zero block is all zeros.
TEST(CpuQuantKernelsTest, QuantizeQ8_0FollowsLlamaCppRule) {
  std::mt19937 rng(3);
  const int64_t rows = 3, in = 96;
  std::vector<float> w = Normal(rows * in, rng);
  for (int64_t i = 64; i < 96; ++i) w[i] = 0.0f;  // row 0, block 2: zeros
  std::vector<BlockQ8_0> b(rows * in / 32);
  QuantizeRowsQ8_0(w.data(), rows, in, b.data());
  std::vector<float> back(rows * in);
  DequantizeRowsQ8_0(b.data(), rows, in, back.data());
  for (int64_t blk = 0; blk < rows * in / 32; ++blk) {
    float amax = 0.0f;
    int max_q = 0;
    for (int i = 0; i < 32; ++i) {
      amax = std::max(amax, std::fabs(w[blk * 32 + i]));
      max_q = std::max(max_q, std::abs(int{b[blk].qs[i]}));
    }
    EXPECT_EQ(b[blk].d, FloatToHalf(amax / 127.0f));
    EXPECT_EQ(max_q, amax > 0 ? 127 : 0);
    const float d = HalfToFloat(b[blk].d);
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(back[blk * 32 + i], d * b[blk].qs[i]);
      EXPECT_NEAR(back[blk * 32 + i], w[blk * 32 + i], 0.5f * d + 128 * std::fabs(d - amax / 127.0f) + 1e-7f);
    }
  }
  // -128 (never written by the quantizer, possible in a foreign file) reads
  // as -127 in both the dequantized values and the packed layout.
  b[0].qs[5] = -128;
  DequantizeRowsQ8_0(b.data(), rows, in, back.data());
  EXPECT_EQ(back[5], -127 * HalfToFloat(b[0].d));
  std::vector<uint8_t> packed(PackedQ8_0Bytes(rows, in));
  PackRowsQ8_0(b.data(), rows, in, packed.data());
  EXPECT_EQ(static_cast<int8_t>(packed[8 + 5]), -127);
}

// The products over packed bf16 W against a double reference over the
// rounded weights, on every ISA; rows of a multi-row call bitwise those of
// one-row calls; a split of W's rows at a multiple of 4 through the offsets.
TEST(CpuQuantKernelsTest, PackedBf16ProductMatchesReference) {
  std::mt19937 rng(5);
  for (QuantIsa isa : Isas()) {
    for (int64_t out : {1, 4, 7, 33}) {
      for (int64_t in : {8, 24, 64, 200}) {
        for (int64_t n : {1, 2, 3, 5, 9}) {
          std::vector<float> w = Normal(out * in, rng), x = Normal(n * in, rng), y0 = Normal(n * out, rng);
          std::vector<uint16_t> p(PackedRowsPadded(out) * in);
          PackRowsBf16(w.data(), out, in, p.data());
          std::vector<float> y = y0, y_acc = y0;
          MatMulRowsPackedBf16(x.data(), n, in, p.data(), out, y.data(), out, false, isa);
          MatMulRowsPackedBf16(x.data(), n, in, p.data(), out, y_acc.data(), out, true, isa);
          for (int64_t r = 0; r < n; ++r) {
            std::vector<float> one(out);
            MatMulRowsPackedBf16(x.data() + r * in, 1, in, p.data(), out, one.data(), out, false, isa);
            for (int64_t o = 0; o < out; ++o) {
              double ref = 0;
              for (int64_t i = 0; i < in; ++i) ref += double(Bf16ToFloat(FloatToBf16(w[o * in + i]))) * x[r * in + i];
              ASSERT_NEAR(y[r * out + o], ref, 1e-5 * std::sqrt(double(in)) * 4)
                  << QuantIsaName(isa) << " " << out << "x" << in << " n=" << n;
              ASSERT_NEAR(y_acc[r * out + o], ref + y0[r * out + o], 1e-4);
              ASSERT_EQ(one[o], y[r * out + o]) << "row " << r << " depends on the other rows";
            }
          }
          if (out > 4) {  // rows [4, out) alone, from the offset of row 4
            std::vector<float> part(n * out, 0.0f);
            MatMulRowsPackedBf16(x.data(), n, in, p.data() + PackedBf16Offset(4, in), out - 4, part.data() + 4, out,
                                 false, isa);
            for (int64_t r = 0; r < n; ++r) {
              for (int64_t o = 4; o < out; ++o) ASSERT_EQ(part[r * out + o], y[r * out + o]);
            }
          }
        }
      }
    }
  }
}

// The products over packed Q8_0 W: against a double reference of the same
// integer arithmetic (weights and activations quantized) to float rounding,
// and against the float product of the dequantized weights within the
// activation rounding; rows independent of the others; split through the
// offsets; every ISA.
TEST(CpuQuantKernelsTest, PackedQ8_0ProductMatchesReference) {
  std::mt19937 rng(6);
  for (QuantIsa isa : Isas()) {
    for (int64_t out : {1, 4, 7, 33}) {
      for (int64_t in : {32, 64, 160}) {
        for (int64_t n : {1, 2, 3, 5, 9}) {
          std::vector<float> w = Normal(out * in, rng), x = Normal(n * in, rng), y0 = Normal(n * out, rng);
          std::vector<BlockQ8_0> b(out * in / 32);
          QuantizeRowsQ8_0(w.data(), out, in, b.data());
          std::vector<float> wq(out * in);
          DequantizeRowsQ8_0(b.data(), out, in, wq.data());
          std::vector<uint8_t> p(PackedQ8_0Bytes(out, in));
          PackRowsQ8_0(b.data(), out, in, p.data());
          std::vector<float> y = y0, y_acc = y0;
          MatMulRowsPackedQ8_0(x.data(), n, in, p.data(), out, y.data(), out, false, isa);
          MatMulRowsPackedQ8_0(x.data(), n, in, p.data(), out, y_acc.data(), out, true, isa);
          for (int64_t r = 0; r < n; ++r) {
            std::vector<int8_t> xq(in);
            std::vector<float> xd(in / 32);
            QuantizeActivationQ8(x.data() + r * in, in, xq.data(), xd.data());
            std::vector<float> one(out);
            MatMulRowsPackedQ8_0(x.data() + r * in, 1, in, p.data(), out, one.data(), out, false, isa);
            for (int64_t o = 0; o < out; ++o) {
              double exact = 0, fp = 0, norm = 0;
              for (int64_t i = 0; i < in; ++i) {
                exact += double(wq[o * in + i]) * xq[i] * xd[i / 32];
                fp += double(wq[o * in + i]) * x[r * in + i];
                norm += double(wq[o * in + i]) * wq[o * in + i];
              }
              ASSERT_NEAR(y[r * out + o], exact, 2e-6 * std::sqrt(norm * in) + 1e-6)
                  << QuantIsaName(isa) << " " << out << "x" << in << " n=" << n;
              // Activation rounding: |x - xq xd| <= xd / 2 per element.
              double bound = 0;
              for (int64_t i = 0; i < in; ++i) bound += std::fabs(wq[o * in + i]) * xd[i / 32] * 0.5;
              ASSERT_LE(std::fabs(y[r * out + o] - fp), bound + 1e-5);
              ASSERT_NEAR(y_acc[r * out + o], y[r * out + o] + y0[r * out + o], 1e-4);
              ASSERT_EQ(one[o], y[r * out + o]) << "row " << r << " depends on the other rows";
            }
          }
          if (out > 4) {
            std::vector<float> part(n * out, 0.0f);
            MatMulRowsPackedQ8_0(x.data(), n, in, p.data() + PackedQ8_0Offset(4, in), out - 4, part.data() + 4, out,
                                 false, isa);
            for (int64_t r = 0; r < n; ++r) {
              for (int64_t o = 4; o < out; ++o) ASSERT_EQ(part[r * out + o], y[r * out + o]);
            }
          }
        }
      }
    }
  }
}

// The activation quantization: per block of 32, d = amax / 127, q within
// [-127, 127], x - q d within d / 2.
TEST(CpuQuantKernelsTest, ActivationQuantizationIsPerBlock) {
  std::mt19937 rng(8);
  std::vector<float> x = Normal(96, rng, 3.0f);
  for (int i = 32; i < 64; ++i) x[i] *= 1e-3f;  // a small block keeps its own scale
  std::vector<int8_t> q(96);
  std::vector<float> d(3);
  QuantizeActivationQ8(x.data(), 96, q.data(), d.data());
  EXPECT_LT(d[1], d[0] * 1e-2f);
  for (int i = 0; i < 96; ++i) {
    EXPECT_LE(std::abs(int{q[i]}), 127);
    EXPECT_NEAR(q[i] * d[i / 32], x[i], 0.5f * d[i / 32] * (1 + 1e-5f));
  }
}

// The vectorized SwiGLU against double precision, over gates from -100 to
// 100 (exp(-|g|) never overflows) and a scalar tail (F % 8 != 0).
TEST(CpuKernelsTest, SiluMulMatchesReference) {
  for (int64_t F : {8, 21, 2560}) {
    std::vector<float> h13(2 * 2 * F), out(2 * F);
    for (int64_t i = 0; i < 2 * F; ++i) {
      h13[(i / F) * 2 * F + i % F] = -100.0f + 200.0f * i / (2 * F - 1);  // gates
      h13[(i / F) * 2 * F + F + i % F] = 0.5f + 0.001f * i;                 // ups
    }
    SiluMul(h13.data(), 2, F, out.data());
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t f = 0; f < F; ++f) {
        const double g = h13[r * 2 * F + f], u = h13[r * 2 * F + F + f];
        const double ref = g / (1.0 + std::exp(-g)) * u;
        ASSERT_NEAR(out[r * F + f], ref, 1e-6 * std::fabs(ref) + 1e-30) << "g=" << g;
      }
    }
  }
}

}  // namespace
}  // namespace lede::model::cpu
