// Tests of shared/model/cpu/cpu_ggml_kernels.h: the fused products over
// llama.cpp's block types equal the dequantize-then-multiply reference
// within the activation rounding, for every type, 1, 3 and 8 rows, each
// instruction set, mixed-type matrices and sub-ranges of the output rows;
// and a row's product does not depend on the rows beside it.
#include "shared/model/cpu/cpu_ggml_kernels.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/checkpoint/ggml_quants.h"
#include "shared/checkpoint/gguf.h"
#include "shared/model/loaders/weight_format.h"

namespace lede::model::cpu {
namespace {

using checkpoint::GgmlType;

constexpr GgmlType kTypes[] = {GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ8_0,
                               GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

std::vector<float> Random(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

// Y = X W^T in double over the dequantized W (the eager reference), and
// the scale sum_i |x_i w_i| each element's tolerance is relative to.
void Reference(const std::vector<float>& x, int64_t n, const std::vector<float>& w, int64_t out, int64_t in,
               std::vector<double>* y, std::vector<double>* mag) {
  y->assign(static_cast<size_t>(n * out), 0.0);
  mag->assign(static_cast<size_t>(n * out), 0.0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double s = 0, m = 0;
      for (int64_t i = 0; i < in; ++i) {
        s += static_cast<double>(x[r * in + i]) * w[o * in + i];
        m += std::fabs(static_cast<double>(x[r * in + i]) * w[o * in + i]);
      }
      (*y)[r * out + o] = s, (*mag)[r * out + o] = m;
    }
  }
}

// Every instruction set this CPU runs: portable, AVX2, AVX-512 VNNI (each
// has its own kernels for some types, and the best one is not the only one
// users get: LEDE_CPU_KERNELS caps it).
std::vector<QuantIsa> Isas() {
  std::vector<QuantIsa> isas;
  for (QuantIsa isa : {QuantIsa::kPortable, QuantIsa::kAvx2, QuantIsa::kAvx512}) {
    if (isa <= BestQuantIsa()) isas.push_back(isa);
  }
  return isas;
}

// The activation rounding (int8, amax / 127 per block) bounds the error at
// a fraction of a percent of sum |x w| (observed below 0.2%).
constexpr double kRelTol = 0.005;

// Each type alone, 1, 3 and 8 rows, portable and the best ISA.
TEST(GgmlKernelsTest, FusedEqualsDequantizedReferenceForEachType) {
  const int64_t in = 512, out = 13;
  for (GgmlType type : kTypes) {
    std::vector<float> wf = Random(out * in, 11, 0.05f);
    GgmlMatrix w(in);
    ASSERT_TRUE(w.AppendQuantized(type, wf.data(), out));
    std::vector<float> deq(static_cast<size_t>(out * in));
    UnpackRowsGgml(w, 0, out, deq.data());
    for (int64_t n : {1, 3, 8}) {
      std::vector<float> x = Random(n * in, 3 + static_cast<uint32_t>(n), 1.0f);
      std::vector<double> ref, mag;
      Reference(x, n, deq, out, in, &ref, &mag);
      for (QuantIsa isa : Isas()) {
        std::vector<float> y(static_cast<size_t>(n * out), -7.0f);
        MatMulRowsGgml(x.data(), n, in, w, 0, out, y.data(), out, /*accumulate=*/false, isa);
        for (int64_t k = 0; k < n * out; ++k) {
          ASSERT_NEAR(y[k], ref[k], kRelTol * mag[k] + 1e-6)
              << checkpoint::GgmlTypeName(type) << " n=" << n << " " << QuantIsaName(isa) << " at " << k;
        }
      }
    }
  }
}

// A row of X gets the same product (bitwise) whatever rows are beside it:
// 6 and 7 rows (through the kernels 4 and 2, or 4 and 3 at a time) over 37
// weight rows (more than one tile of weight rows) equal each row alone, so
// a verification or a prefill chunk computes what decoding computes.
TEST(GgmlKernelsTest, RowsDoNotDependOnTheRowsBesideThem) {
  const int64_t in = 512, out = 37;
  for (GgmlType type : kTypes) {
    std::vector<float> wf = Random(out * in, 17, 0.05f);
    GgmlMatrix w(in);
    ASSERT_TRUE(w.AppendQuantized(type, wf.data(), out));
    for (int64_t n : {6, 7}) {
      std::vector<float> x = Random(n * in, 19, 1.0f);
      for (QuantIsa isa : Isas()) {
        std::vector<float> y(static_cast<size_t>(n * out)), one(static_cast<size_t>(out));
        MatMulRowsGgml(x.data(), n, in, w, 0, out, y.data(), out, /*accumulate=*/false, isa);
        for (int64_t r = 0; r < n; ++r) {
          MatMulRowsGgml(x.data() + r * in, 1, in, w, 0, out, one.data(), out, /*accumulate=*/false, isa);
          for (int64_t o = 0; o < out; ++o) {
            ASSERT_EQ(y[r * out + o], one[o]) << checkpoint::GgmlTypeName(type) << " " << QuantIsaName(isa) << " n="
                                              << n << " row " << r << " weight row " << o;
          }
        }
      }
    }
  }
}

// The 32-value types on rows of 1 to 7 blocks (the AVX2 Q4_0 kernel takes
// blocks two at a time, its last block alone; the VNNI one four at a
// time, a last group of 1-3 with masked loads): equal to the portable
// kernel's integer sums to float summation order, and to the reference
// within the activation rounding (looser than kRelTol: over 32 to 224
// values the rounding errors average out less).
TEST(GgmlKernelsTest, OddBlockCountsMatchReference) {
  const int64_t out = 5;
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ8_0}) {
    for (int64_t in : {32, 64, 96, 160, 224}) {
      std::vector<float> wf = Random(out * in, 41 + static_cast<uint32_t>(in), 0.05f);
      GgmlMatrix w(in);
      ASSERT_TRUE(w.AppendQuantized(type, wf.data(), out));
      std::vector<float> deq(static_cast<size_t>(out * in));
      UnpackRowsGgml(w, 0, out, deq.data());
      for (int64_t n : {1, 3, 8}) {
        std::vector<float> x = Random(n * in, 50 + static_cast<uint32_t>(n), 1.0f);
        std::vector<double> ref, mag;
        Reference(x, n, deq, out, in, &ref, &mag);
        std::vector<float> portable(static_cast<size_t>(n * out));
        MatMulRowsGgml(x.data(), n, in, w, 0, out, portable.data(), out, false, QuantIsa::kPortable);
        std::vector<float> y(static_cast<size_t>(n * out), -7.0f);
        MatMulRowsGgml(x.data(), n, in, w, 0, out, y.data(), out, false, BestQuantIsa());
        for (int64_t k = 0; k < n * out; ++k) {
          ASSERT_NEAR(y[k], ref[k], 4 * kRelTol * mag[k] + 1e-6)
              << checkpoint::GgmlTypeName(type) << " in=" << in << " n=" << n << " at " << k;
          ASSERT_NEAR(y[k], portable[k], 1e-4 * (std::fabs(portable[k]) + 1.0))
              << checkpoint::GgmlTypeName(type) << " in=" << in << " n=" << n << " at " << k;
        }
      }
    }
  }
}

// The ISAs compute the same integer sums: their results agree to float
// summation order (far tighter than the reference tolerance), for every
// type at 1 to 24 blocks a row (the VNNI Q4_K and Q4_0 kernels read 4
// blocks at a time: full groups, tails of 1 to 3 and rows shorter than a
// group) and the row counts of a decode, a verification and a prefill tail.
TEST(GgmlKernelsTest, IsasAgreeAtEveryBlockCount) {
  const int64_t out = 6;
  for (GgmlType type : kTypes) {
    for (int64_t nb : {1, 2, 3, 4, 5, 6, 7, 9, 24}) {
      const int64_t in = nb * checkpoint::GgmlBlockValues(type);
      std::vector<float> wf = Random(out * in, 61 + static_cast<uint32_t>(nb), 0.05f);
      GgmlMatrix w(in);
      ASSERT_TRUE(w.AppendQuantized(type, wf.data(), out));
      for (int64_t n : {1, 3, 5}) {
        std::vector<float> x = Random(n * in, 70 + static_cast<uint32_t>(n), 1.0f);
        std::vector<float> a(static_cast<size_t>(n * out)), b(a.size());
        MatMulRowsGgml(x.data(), n, in, w, 0, out, a.data(), out, false, QuantIsa::kPortable);
        for (QuantIsa isa : Isas()) {
          MatMulRowsGgml(x.data(), n, in, w, 0, out, b.data(), out, false, isa);
          for (size_t k = 0; k < a.size(); ++k) {
            ASSERT_NEAR(a[k], b[k], 1e-4 * (std::fabs(a[k]) + 1.0))
                << checkpoint::GgmlTypeName(type) << " " << QuantIsaName(isa) << " blocks=" << nb << " n=" << n
                << " at " << k;
          }
        }
      }
    }
  }
}

// A matrix of rows in several types (a fused q/k/v of a Q4_K_M file),
// multiplied over a sub-range of its rows into a strided Y, accumulating.
TEST(GgmlKernelsTest, MixedTypesSubRangeAndAccumulate) {
  const int64_t in = 256, n = 3;
  GgmlMatrix w(in);
  std::vector<float> wf;
  int64_t rows = 0;
  const std::pair<GgmlType, int64_t> runs[] = {
      {GgmlType::kQ4_K, 8}, {GgmlType::kQ6_K, 4}, {GgmlType::kQ5_0, 4}, {GgmlType::kQ8_0, 5}, {GgmlType::kQ4_K, 3}};
  for (const auto& [type, r] : runs) {
    std::vector<float> part = Random(r * in, 30 + static_cast<uint32_t>(rows), 0.05f);
    ASSERT_TRUE(w.AppendQuantized(type, part.data(), r));
    wf.insert(wf.end(), part.begin(), part.end());
    rows += r;
  }
  ASSERT_EQ(w.rows(), rows);
  EXPECT_EQ(w.runs().size(), 5u);
  EXPECT_EQ(w.type_of(9), GgmlType::kQ6_K);
  std::vector<float> deq(static_cast<size_t>(rows * in));
  UnpackRowsGgml(w, 0, rows, deq.data());
  std::vector<float> x = Random(n * in, 40, 1.0f);
  std::vector<double> ref, mag;
  Reference(x, n, deq, rows, in, &ref, &mag);
  const int64_t o0 = 4, o1 = 19, ldy = 32;
  for (QuantIsa isa : Isas()) {
    std::vector<float> y(static_cast<size_t>(n * ldy), 1.5f);
    MatMulRowsGgml(x.data(), n, in, w, o0, o1, y.data(), ldy, /*accumulate=*/true, isa);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t o = 0; o < ldy; ++o) {
        const float v = y[r * ldy + o];
        if (o < o1 - o0) {
          ASSERT_NEAR(v, 1.5 + ref[r * rows + o0 + o], kRelTol * mag[r * rows + o0 + o] + 1e-6) << r << " " << o;
        } else {
          ASSERT_EQ(v, 1.5f) << "wrote past its rows at " << r << " " << o;
        }
      }
    }
  }
}

// The file's blocks are kept bit for bit, and a row's values are those of
// checkpoint::DequantizeGgmlRow.
TEST(GgmlKernelsTest, AppendBlocksKeepsTheFileBytes) {
  const int64_t in = 256;
  std::vector<float> wf = Random(2 * in, 50, 0.1f);
  std::vector<uint8_t> blocks(checkpoint::GgmlTypeBytes(GgmlType::kQ6_K, 2 * in));
  ASSERT_TRUE(checkpoint::QuantizeGgmlRow(GgmlType::kQ6_K, wf.data(), 2 * in, blocks.data()));
  GgmlMatrix w(in);
  ASSERT_TRUE(w.AppendBlocks(GgmlType::kQ6_K, blocks.data(), 2));
  EXPECT_EQ(w.nbytes(), blocks.size());
  EXPECT_EQ(std::vector<uint8_t>(w.data(), w.data() + w.nbytes()), blocks);
  EXPECT_FALSE(w.AppendBlocks(GgmlType::kF32, blocks.data(), 1));
  GgmlMatrix odd(96);
  EXPECT_FALSE(odd.AppendQuantized(GgmlType::kQ4_K, wf.data(), 1));  // 96 is not whole 256-blocks
  EXPECT_TRUE(odd.AppendQuantized(GgmlType::kQ5_0, wf.data(), 1));
}

// llama.cpp's Q4_K_M mix: Q6_K head and the more-bits layers' attn_v /
// ffn_down, Q4_K elsewhere, Q5_0 / Q8_0 for rows not a multiple of 256.
TEST(GgmlKernelsTest, LlamaCppMixPicksTypesAsLlamaCpp) {
  using R = loaders::TensorRole;
  const loaders::WeightFormat m = loaders::WeightFormat::kQ4_K_M;
  EXPECT_EQ(loaders::LlamaCppTensorType(m, R::kOutput, 12, 12, 1536), GgmlType::kQ6_K);
  EXPECT_EQ(loaders::LlamaCppTensorType(m, R::kOutput, 12, 12, 192), GgmlType::kQ8_0);
  EXPECT_EQ(loaders::LlamaCppTensorType(m, R::kAttnQ, 5, 12, 1536), GgmlType::kQ4_K);
  // n = 12: n/8 = 1, 7n/8 = 10; more bits at 0, 10, 11 and (i - 1) % 3 == 2: 3, 6, 9.
  for (int64_t i = 0; i < 12; ++i) {
    const bool more = i == 0 || i >= 10 || (i - 1) % 3 == 2;
    EXPECT_EQ(loaders::LlamaCppTensorType(m, R::kAttnV, i, 12, 1536), more ? GgmlType::kQ6_K : GgmlType::kQ4_K) << i;
    EXPECT_EQ(loaders::LlamaCppTensorType(m, R::kFfnDown, i, 12, 4096), more ? GgmlType::kQ6_K : GgmlType::kQ4_K) << i;
    EXPECT_EQ(loaders::LlamaCppTensorType(m, R::kFfnDown, i, 12, 512 + 32), more ? GgmlType::kQ8_0 : GgmlType::kQ5_0) << i;
  }
  EXPECT_EQ(loaders::LlamaCppTensorType(loaders::WeightFormat::kQ4_0, R::kFfnUp, 3, 12, 1536), GgmlType::kQ4_0);
  EXPECT_EQ(loaders::LlamaCppTensorType(loaders::WeightFormat::kQ4_0, R::kOutput, 12, 12, 1536), GgmlType::kQ6_K);
  EXPECT_EQ(loaders::LlamaCppTensorType(m, R::kAttnQ, 0, 12, 100), GgmlType::kF32);
}

}  // namespace
}  // namespace lede::model::cpu
