// Tests of the fused CPU decode path (llama.h Kernels::kFused,
// cpu_kernels.h) against the eager libtorch reference: the kernels one by
// one, logits within 1e-4 and identical greedy ids on both real models,
// lede-tiny and a random GQA checkpoint (prefill, one-position steps and
// multi-position verification shapes), ragged batches against separate
// single-segment eager calls, and lossless speculation on both paths.
#include <algorithm>
#include <cstdio>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include "gtest/gtest.h"
#include "shared/model/cpu/cpu_kernels.h"
#include "shared/model/cpu/cpu_quant_kernels.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/model/decoding.h"
#include "shared/model/kv_cache.h"
#include "shared/model/internal/step_graphs.h"
#include "shared/model/llama.h"
#include "tests/shared/model/model_fixtures.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::model {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using testing::LoadOrDie;

constexpr float kLogitTolerance = 1e-4f;  // fused and eager logits within 1e-4 (fp32)
constexpr char kLedeTinyDir[] = "models/lede-tiny";

std::vector<float> RandomVector(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// The vectorized matrix-vector loop, the BLAS one and sgemm agree with a
// double-precision reference on sizes with every kind of tail.
TEST(CpuKernelsTest, MatrixProductsMatchReference) {
  std::mt19937 rng(1);
  for (int64_t out : {1, 3, 4, 7, 33}) {
    for (int64_t in : {1, 5, 8, 13, 64, 172}) {
      for (int64_t n : {1, 2, 5, 30}) {
        std::vector<float> w = RandomVector(out * in, rng), x = RandomVector(n * in, rng);
        std::vector<float> y0 = RandomVector(n * out, rng);
        std::vector<float> y = y0, y_acc = y0;
        cpu::MatMulNT(x.data(), n, in, w.data(), out, y.data(), false);
        cpu::MatMulNT(x.data(), n, in, w.data(), out, y_acc.data(), true);
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t o = 0; o < out; ++o) {
            double ref = 0;
            for (int64_t i = 0; i < in; ++i) ref += double(w[o * in + i]) * x[r * in + i];
            EXPECT_NEAR(y[r * out + o], ref, 1e-4) << out << "x" << in << " n=" << n;
            EXPECT_NEAR(y_acc[r * out + o], ref + y0[r * out + o], 1e-4);
          }
        }
        if (n == 1) {
          std::vector<float> yb(out);
          cpu::MatVecBlas(w.data(), out, in, x.data(), yb.data(), false);
          for (int64_t o = 0; o < out; ++o) EXPECT_NEAR(yb[o], y[o], 1e-4);
        }
      }
    }
  }
}

// The packed layout gives bitwise the row-major result, for every row count
// of the few-row kernel, with and without a tail of rows (out % 4), with
// accumulation, and over a split of the output rows at a multiple of 4
// (as the threaded product splits it).
TEST(CpuKernelsTest, PackedProductIsBitwiseTheRowMajorOne) {
  std::mt19937 rng(4);
  EXPECT_FALSE(cpu::Packable(172));
  for (int64_t out : {4, 7, 33, 320}) {
    for (int64_t in : {8, 64, 192}) {
      ASSERT_TRUE(cpu::Packable(in));
      std::vector<float> w = RandomVector(out * in, rng), packed(out * in);
      cpu::PackRows(w.data(), out, in, packed.data());
      // With one chunk of 8 per row the interleaving is the identity.
      if (in > 8) {
        EXPECT_NE(packed, w) << "the layout is interleaved, not a copy";
      }
      // Every row count of one pass (up to 12 rows per pass with 512-bit
      // registers, 3 with AVX2) and several passes with a tail (48: the
      // prefill's row tile).
      std::vector<int64_t> counts;
      for (int64_t n = 1; n <= cpu::kMaxRowsWithoutBlas; ++n) counts.push_back(n);
      for (int64_t n : {13, 25, 48}) counts.push_back(n);
      for (int64_t n : counts) {
        for (bool accumulate : {false, true}) {
          std::vector<float> x = RandomVector(n * in, rng), y0 = RandomVector(n * out, rng);
          std::vector<float> rows = y0, pk = y0, split = y0;
          cpu::MatMulRows(x.data(), n, in, w.data(), out, rows.data(), accumulate);
          cpu::MatMulRowsPacked(x.data(), n, in, packed.data(), out, pk.data(), out, accumulate);
          const int64_t o0 = out / 8 * 4;  // a multiple of 4; the second part takes the tail
          cpu::MatMulRowsPacked(x.data(), n, in, packed.data(), o0, split.data(), out, accumulate);
          cpu::MatMulRowsPacked(x.data(), n, in, packed.data() + o0 * in, out - o0, split.data() + o0,
                                out, accumulate);
          ASSERT_EQ(pk, rows) << out << "x" << in << " n=" << n << " accumulate=" << accumulate;
          ASSERT_EQ(split, rows) << out << "x" << in << " n=" << n << " split at " << o0;
        }
      }
    }
  }
}

// One attention row equals softmax(q K^T) V computed naively in double, for
// the head dimensions with a register path (32, 64, 128) and others, key
// counts with and without a tail of 8, and queries large enough that most
// keys' weights underflow (scores far below the max).
TEST(CpuKernelsTest, AttendOneMatchesReference) {
  std::mt19937 rng(2);
  for (int64_t hd : {12, 32, 64, 128}) {
    for (int64_t S : {1, 7, 9, 16, 300}) {
      for (float scale : {1.0f, 30.0f}) {
        std::vector<float> q = RandomVector(hd, rng), k = RandomVector(S * hd, rng);
        std::vector<float> v = RandomVector(S * hd, rng);
        for (float& x : q) x *= scale;
        std::vector<float> scores(S), out(hd);
        cpu::AttendOne(q.data(), k.data(), v.data(), S, hd, scores.data(), out.data());
        std::vector<double> p(S);
        double m = -1e30, z = 0;
        for (int64_t j = 0; j < S; ++j) {
          p[j] = 0;
          for (int64_t i = 0; i < hd; ++i) p[j] += double(q[i]) * k[j * hd + i];
          m = std::max(m, p[j]);
        }
        for (double& x : p) z += (x = std::exp(x - m));
        for (int64_t i = 0; i < hd; ++i) {
          double ref = 0;
          for (int64_t j = 0; j < S; ++j) ref += p[j] / z * v[j * hd + i];
          ASSERT_NEAR(out[i], ref, 2e-5 * (1.0 + scale)) << "hd=" << hd << " S=" << S << " scale=" << scale;
        }
      }
    }
  }
}

// Paged attention over blocks scattered through a pool (a block table in
// reverse order, the last block partly used) is bitwise AttendOne over the
// same keys laid out contiguously; over bfloat16 blocks it is AttendOne over
// the keys and values rounded to bfloat16 and widened back (to float32
// rounding: the compiler may contract the scalar tail's multiply-adds
// differently in the two kernels).
TEST(CpuKernelsTest, AttendPagedMatchesAttendOneOnTheSameKeys) {
  std::mt19937 rng(3);
  for (int64_t hd : {12, 64}) {
    for (int64_t n_keys : {1, 8, 21, 64}) {
      const int64_t P = 8, n_blocks = (n_keys + P - 1) / P, stride = 2 * P * hd;  // 2 heads per block
      std::vector<float> q = RandomVector(hd, rng), k = RandomVector(n_keys * hd, rng);
      std::vector<float> v = RandomVector(n_keys * hd, rng);
      std::vector<int64_t> blocks(n_blocks);
      for (int64_t b = 0; b < n_blocks; ++b) blocks[b] = n_blocks - 1 - b;
      // Head 1 of each block holds the keys; head 0 is noise.
      std::vector<float> kp = RandomVector(n_blocks * stride, rng), vp = RandomVector(n_blocks * stride, rng);
      std::vector<uint16_t> kb(kp.size()), vb(vp.size());
      std::vector<float> k16(k.size()), v16(v.size());
      for (int64_t j = 0; j < n_keys; ++j) {
        for (int64_t i = 0; i < hd; ++i) {
          const int64_t at = blocks[j / P] * stride + (P + j % P) * hd + i;
          kp[at] = k[j * hd + i];
          vp[at] = v[j * hd + i];
        }
      }
      for (size_t i = 0; i < kp.size(); ++i) {
        kb[i] = cpu::FloatToBf16(kp[i]);
        vb[i] = cpu::FloatToBf16(vp[i]);
      }
      for (int64_t j = 0; j < n_keys; ++j) {
        for (int64_t i = 0; i < hd; ++i) {
          const int64_t at = blocks[j / P] * stride + (P + j % P) * hd + i;
          k16[j * hd + i] = cpu::Bf16ToFloat(kb[at]);
          v16[j * hd + i] = cpu::Bf16ToFloat(vb[at]);
        }
      }
      std::vector<float> scores(n_keys), want(hd), got(hd), want16(hd), got16(hd);
      cpu::AttendOne(q.data(), k.data(), v.data(), n_keys, hd, scores.data(), want.data());
      cpu::AttendPaged(q.data(), kp.data() + P * hd, vp.data() + P * hd, blocks.data(), stride, P, n_keys, hd,
                       scores.data(), got.data());
      cpu::AttendOne(q.data(), k16.data(), v16.data(), n_keys, hd, scores.data(), want16.data());
      cpu::AttendPagedBf16(q.data(), kb.data() + P * hd, vb.data() + P * hd, blocks.data(), stride, P, n_keys, hd,
                           scores.data(), got16.data());
      EXPECT_EQ(got, want) << "hd=" << hd << " n_keys=" << n_keys;
      for (int64_t i = 0; i < hd; ++i) {
        EXPECT_NEAR(got16[i], want16[i], 1e-6 * (1.0 + std::abs(want16[i]))) << "hd=" << hd << " n_keys=" << n_keys;
      }
    }
  }
}

// Grouped-query attention over R rows: AttendPagedRows is AttendPaged for
// each row and head (row r sees n_keys0 + r keys), on float32 and bfloat16
// blocks, for the head dimensions of the vector path and one that goes a
// head at a time; and each row's output is bitwise the same as when that
// row attends alone (R = 1), so a verification sees what decoding sees.
TEST(CpuKernelsTest, AttendPagedRowsIsAttendPagedPerRowAndHead) {
  std::mt19937 rng(4);
  for (int64_t hd : {12, 32, 64, 128}) {
    for (int64_t G : {1, 4}) {
      for (int64_t n_keys0 : {1, 5, 21}) {
        const int64_t P = 8, R = 11, n_blocks = 5, stride = P * hd;  // 5 blocks hold n_keys0 + R - 1 <= 31 keys
        const std::vector<int64_t> blocks = {2, 0, 4, 1, 3};
        const int64_t q_stride = G * hd + 3, out_stride = G * hd + 5;  // rows padded apart
        std::vector<float> q = RandomVector(R * q_stride, rng), k = RandomVector(n_blocks * stride, rng);
        std::vector<float> v = RandomVector(n_blocks * stride, rng);
        std::vector<uint16_t> kb(k.size()), vb(v.size());
        for (size_t i = 0; i < k.size(); ++i) {
          kb[i] = cpu::FloatToBf16(k[i]);
          vb[i] = cpu::FloatToBf16(v[i]);
        }
        std::vector<float> got(R * out_stride), got16(R * out_stride), alone(G * hd), alone16(G * hd);
        cpu::AttendPagedRows(q.data(), q_stride, R, G, k.data(), v.data(), blocks.data(), stride, P, n_keys0, hd,
                             got.data(), out_stride);
        cpu::AttendPagedRowsBf16(q.data(), q_stride, R, G, kb.data(), vb.data(), blocks.data(), stride, P, n_keys0,
                                 hd, got16.data(), out_stride);
        std::vector<float> scores(n_keys0 + R), want(hd), want16(hd);
        for (int64_t r = 0; r < R; ++r) {
          const int64_t n_keys = n_keys0 + r;
          cpu::AttendPagedRows(q.data() + r * q_stride, q_stride, 1, G, k.data(), v.data(), blocks.data(), stride, P,
                               n_keys, hd, alone.data(), G * hd);
          cpu::AttendPagedRowsBf16(q.data() + r * q_stride, q_stride, 1, G, kb.data(), vb.data(), blocks.data(),
                                   stride, P, n_keys, hd, alone16.data(), G * hd);
          for (int64_t g = 0; g < G; ++g) {
            const float* qg = q.data() + r * q_stride + g * hd;
            cpu::AttendPaged(qg, k.data(), v.data(), blocks.data(), stride, P, n_keys, hd, scores.data(), want.data());
            cpu::AttendPagedBf16(qg, kb.data(), vb.data(), blocks.data(), stride, P, n_keys, hd, scores.data(),
                                 want16.data());
            for (int64_t i = 0; i < hd; ++i) {
              const int64_t at = r * out_stride + g * hd + i;
              SCOPED_TRACE(::testing::Message() << "hd=" << hd << " G=" << G << " n_keys0=" << n_keys0 << " r=" << r);
              EXPECT_NEAR(got[at], want[i], 1e-6 * (1.0 + std::abs(want[i])));
              EXPECT_NEAR(got16[at], want16[i], 1e-6 * (1.0 + std::abs(want16[i])));
              EXPECT_EQ(got[at], alone[g * hd + i]);
              EXPECT_EQ(got16[at], alone16[g * hd + i]);
            }
          }
        }
      }
    }
  }
}

// --kernels values parse, and anything else is kInvalidArgument.
TEST(CpuKernelsTest, ParseKernels) {
  EXPECT_EQ(*ParseKernels("eager"), Kernels::kEager);
  EXPECT_EQ(*ParseKernels("fused"), Kernels::kFused);
  EXPECT_THAT(ParseKernels("fast"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_STREQ(KernelsName(Kernels::kEager), "eager");
}

at::Tensor Ids(const std::vector<int64_t>& ids) { return at::tensor(ids, at::kLong).view({1, -1}); }

float MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<float>();
}

// Runs the same decoding on a model `m` (fused, or with graphs) and an eager
// model (same weights):
// prefill of `prompt`, `n_steps` greedy one-position steps (both fed the
// eager model's argmax), then verification-shaped passes of 2..9 positions
// and an exit probe at a shallow layer. Every logit within 1e-4 and every
// argmax identical.
void ExpectMatchesEager(const LlamaModel& fused, const LlamaModel& eager, const std::vector<int64_t>& prompt,
                        int64_t n_steps, float tolerance = kLogitTolerance, float* max_diff = nullptr,
                        bool relative = false) {
  float worst = 0.0f;
  // relative: differences in units of the reference's largest |value| (at least 1).
  auto diff = [&](const at::Tensor& a, const at::Tensor& b) {
    const float d = MaxAbsDiff(a, b) / (relative ? std::max(1.0f, b.abs().max().item<float>()) : 1.0f);
    worst = std::max(worst, d);
    if (max_diff != nullptr) *max_diff = worst;
    return d;
  };
  ASSERT_FALSE(eager.fused());
  ASSERT_FALSE(eager.graphs());
  c10::InferenceMode guard;
  KvCacheOptions ko;
  ko.capacity = std::min<int64_t>(fused.config().max_seq_len, 256);
  auto cf = KvCache::Create(fused.config(), ko);
  auto ce = KvCache::Create(eager.config(), ko);
  ASSERT_THAT(cf, IsOk());
  ASSERT_THAT(ce, IsOk());
  const int64_t L = fused.n_layers(), P = static_cast<int64_t>(prompt.size());
  auto run = [&](const LlamaModel& m, KvCache& c, const std::vector<int64_t>& ids, int64_t pos,
                 int64_t last) {
    return m.ExitLogits(m.Forward(m.Embed(Ids(ids)), 0, last, pos, &c, 0));
  };
  at::Tensor lf = run(fused, *cf, prompt, 0, L), le = run(eager, *ce, prompt, 0, L);
  EXPECT_LT(diff(lf, le), tolerance) << "prefill";
  int64_t pos = P;
  std::vector<int64_t> generated;
  for (int64_t i = 0; i < n_steps && pos < ko.capacity - 10; ++i, ++pos) {
    const int64_t ef = lf[0][-1].argmax().item<int64_t>(), ee = le[0][-1].argmax().item<int64_t>();
    ASSERT_EQ(ef, ee) << "greedy id at step " << i;
    generated.push_back(ee);
    lf = run(fused, *cf, {ee}, pos, L);
    le = run(eager, *ce, {ee}, pos, L);
    ASSERT_LT(diff(lf, le), tolerance) << "step " << i;
  }
  // Verification shapes (T = 2..9 at the committed length, as a round of
  // D_max + 1 positions) and the exit probe at layer 1 and L/2.
  for (int64_t T = 2; T <= 9; ++T) {
    std::vector<int64_t> ids(generated.begin(), generated.begin() + std::min<int64_t>(T, generated.size()));
    while (static_cast<int64_t>(ids.size()) < T) ids.push_back(1);
    for (int64_t last : {int64_t{1}, std::max<int64_t>(1, L / 2), L}) {
      at::Tensor vf = run(fused, *cf, ids, pos, last), ve = run(eager, *ce, ids, pos, last);
      EXPECT_LT(diff(vf, ve), tolerance) << "T=" << T << " exit " << last;
      EXPECT_TRUE(at::equal(vf.argmax(-1), ve.argmax(-1))) << "T=" << T << " exit " << last;
    }
  }
  // The K/V both wrote agree too.
  for (int64_t l = 0; l < L; ++l) {
    EXPECT_LT(diff(cf->k(l), ce->k(l)), tolerance) << "K of layer " << l;
    EXPECT_LT(diff(cf->v(l), ce->v(l)), tolerance) << "V of layer " << l;
  }
}

void ExpectFusedMatchesEagerOnFile(const std::string& path, const std::vector<int64_t>& prompt,
                                   int64_t n_steps) {
  std::unique_ptr<LlamaModel> fused = LoadOrDie(path, Kernels::kFused);
  std::unique_ptr<LlamaModel> eager = LoadOrDie(path, Kernels::kEager);
  ASSERT_NE(fused, nullptr);
  ASSERT_NE(eager, nullptr);
  ASSERT_TRUE(fused->fused());
  ExpectMatchesEager(*fused, *eager, prompt, n_steps);
}

// stories260K (llama2.c, GQA 8/4, head_dim 8): 64 greedy steps.
TEST(FusedKernelsTest, MatchesEagerOnStories260K) {
  ExpectFusedMatchesEagerOnFile(lede::testing::Stories260KDir(), {1, 403, 407, 261, 378}, 64);
}

// babyllama (vocabulary 105, hidden 352).
TEST(FusedKernelsTest, MatchesEagerOnBabyLlama) {
  ExpectFusedMatchesEagerOnFile(lede::testing::BabyLlamaDir() + "/model5000.bin",
                                {1, 3, 34, 9, 22, 4, 3, 18, 20, 7, 9, 3, 5, 3, 6, 10, 16, 4}, 64);
}

// lede-tiny (Hugging Face safetensors, 12 layers, untied head, GQA 6/2).
TEST(FusedKernelsTest, MatchesEagerOnLedeTiny) {
  ExpectFusedMatchesEagerOnFile(kLedeTinyDir, {1, 400, 31, 52, 7, 90}, 64);
}

// A random GQA checkpoint (n_kv_heads < n_heads, odd sizes) through RandomInit.
StatusOr<std::unique_ptr<LlamaModel>> RandomGqa(const ModelOptions& options) {
  checkpoint::ModelConfig c = testing::TinyConfig();
  c.dim = 48;
  c.hidden_dim = 100;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  return LlamaModel::RandomInit(c, 11, options, 0.3);
}

TEST(FusedKernelsTest, MatchesEagerOnRandomGqa) {
  ModelOptions fo, eo;
  eo.kernels = Kernels::kEager;
  auto fused = RandomGqa(fo);
  auto eager = RandomGqa(eo);
  ASSERT_THAT(fused, IsOk());
  ASSERT_THAT(eager, IsOk());
  ASSERT_TRUE((*fused)->fused());
  ExpectMatchesEager(**fused, **eager, {1, 7, 3, 9, 20, 11}, 64);
}

// A ragged batch (three slots, segments of 1, 5 and 3 positions at
// different start positions, in an order unlike the slots') gives the rows
// and the K/V that separate single-segment eager calls give.
TEST(FusedKernelsTest, RaggedBatchMatchesSeparateEagerCalls) {
  checkpoint::ModelConfig c = testing::TinyConfig();
  ModelOptions fo, eo;
  eo.kernels = Kernels::kEager;
  auto fused = LlamaModel::RandomInit(c, 5, fo, 0.3);
  auto eager = LlamaModel::RandomInit(c, 5, eo, 0.3);
  ASSERT_THAT(fused, IsOk());
  ASSERT_THAT(eager, IsOk());
  const LlamaModel& f = **fused;
  const LlamaModel& e = **eager;
  c10::InferenceMode guard;
  KvCacheOptions ko;
  ko.n_slots = 4;
  auto cf = KvCache::Create(c, ko);
  auto ce = KvCache::Create(c, ko);
  ASSERT_THAT(cf, IsOk());
  ASSERT_THAT(ce, IsOk());
  // Histories of different lengths in slots 0, 1 and 3 (slot 2 stays empty).
  const std::vector<std::vector<int64_t>> prompts = {{1, 5, 9}, {1, 2, 3, 4, 5, 6, 7}, {}, {1, 40}};
  for (int64_t s = 0; s < 4; ++s) {
    if (prompts[s].empty()) continue;
    f.Forward(f.Embed(Ids(prompts[s])), 0, c.n_layers, 0, &*cf, s);
    e.Forward(e.Embed(Ids(prompts[s])), 0, c.n_layers, 0, &*ce, s);
  }
  const std::vector<RaggedSegment> segments = {{3, 2, 1}, {1, 7, 5}, {0, 3, 3}, {2, 0, 2}};
  std::vector<int64_t> ids = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21};
  at::Tensor batch = f.Embed(Ids(ids)).view({-1, c.dim});  // [11, d]
  for (auto [first, last] : {std::pair<int64_t, int64_t>{0, 2}, {2, c.n_layers}}) {
    at::Tensor rows = f.ForwardRagged(batch, first, last, segments, *cf);
    ASSERT_EQ(rows.sizes(), batch.sizes());
    int64_t row = 0;
    for (const RaggedSegment& s : segments) {
      at::Tensor in = batch.narrow(0, row, s.n_positions).unsqueeze(0);
      at::Tensor ref = e.Forward(in, first, last, s.start_pos, &*ce, s.slot);
      EXPECT_LT(MaxAbsDiff(rows.narrow(0, row, s.n_positions), ref.squeeze(0)), 1e-4)
          << "slot " << s.slot << " layers [" << first << ", " << last << ")";
      row += s.n_positions;
    }
    batch = rows;  // the next range starts from these rows on both paths
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    EXPECT_LT(MaxAbsDiff(cf->k(l), ce->k(l)), 1e-4) << "K of layer " << l;
    EXPECT_LT(MaxAbsDiff(cf->v(l), ce->v(l)), 1e-4) << "V of layer " << l;
  }
}

// The eager model's ForwardRagged (the per-segment fallback) equals the fused one.
TEST(FusedKernelsTest, EagerRaggedFallbackMatchesFused) {
  checkpoint::ModelConfig c = testing::TinyConfig();
  ModelOptions fo, eo;
  eo.kernels = Kernels::kEager;
  auto fused = LlamaModel::RandomInit(c, 9, fo, 0.3);
  auto eager = LlamaModel::RandomInit(c, 9, eo, 0.3);
  ASSERT_THAT(fused, IsOk());
  ASSERT_THAT(eager, IsOk());
  c10::InferenceMode guard;
  KvCacheOptions ko;
  ko.n_slots = 2;
  auto cf = KvCache::Create(c, ko);
  auto ce = KvCache::Create(c, ko);
  const std::vector<RaggedSegment> segments = {{1, 0, 4}, {0, 0, 2}};
  at::Tensor batch = (*fused)->Embed(Ids({3, 4, 5, 6, 7, 8})).view({-1, c.dim});
  at::Tensor a = (*fused)->ForwardRagged(batch, 0, c.n_layers, segments, *cf);
  at::Tensor b = (*eager)->ForwardRagged(batch, 0, c.n_layers, segments, *ce);
  EXPECT_LT(MaxAbsDiff(a, b), 1e-4);
}

// Under autograd (training) the fused model records the eager graph: the
// gradient reaches the weights.
TEST(FusedKernelsTest, AutogradUsesEagerPath) {
  auto m = LlamaModel::RandomInit(testing::TinyConfig(), 3, ModelOptions{}, 0.3);
  ASSERT_THAT(m, IsOk());
  std::vector<at::Tensor> params = (*m)->Parameters();
  for (at::Tensor& p : params) p.requires_grad_(true);
  KvCacheOptions ko;
  auto cache = KvCache::Create((*m)->config(), ko);
  at::Tensor h = (*m)->Forward((*m)->Embed(Ids({1, 2, 3})), 0, 4, 0, &*cache, 0);
  (*m)->ExitLogits(h).sum().backward();
  ASSERT_TRUE(params[4].grad().defined());
  EXPECT_GT(params[4].grad().abs().sum().item<float>(), 0.0f);
}

// The fused path reads weights packed at load; an in-place update of a
// weight (an optimizer step) makes the packed copy stale, and the fused
// path then follows the updated tensor: fused and eager agree after it.
TEST(FusedKernelsTest, InPlaceWeightUpdateIsSeenByTheFusedPath) {
  ModelOptions fo, eo;
  eo.kernels = Kernels::kEager;
  auto f = LlamaModel::RandomInit(testing::TinyConfig(), 5, fo, 0.3);
  auto e = LlamaModel::RandomInit(testing::TinyConfig(), 5, eo, 0.3);
  ASSERT_THAT(f, IsOk());
  ASSERT_THAT(e, IsOk());
  ASSERT_TRUE((*f)->fused());
  KvCacheOptions ko;
  auto cf = KvCache::Create((*f)->config(), ko);
  auto ce = KvCache::Create((*e)->config(), ko);
  ASSERT_THAT(cf, IsOk());
  ASSERT_THAT(ce, IsOk());
  auto logits = [&](const LlamaModel& m, KvCache& c) {
    c10::InferenceMode guard;
    return m.ExitLogits(m.Forward(m.Embed(Ids({1, 2})), 0, m.n_layers(), 0, &c, 0));
  };
  const at::Tensor before = logits(**f, *cf);
  EXPECT_LT(MaxAbsDiff(before, logits(**e, *ce)), kLogitTolerance);
  std::vector<at::Tensor> pf = (*f)->Parameters(), pe = (*e)->Parameters();
  ASSERT_EQ(pf.size(), pe.size());
  for (size_t i = 0; i < pf.size(); ++i) {
    if (pf[i].dim() < 2) continue;
    c10::NoGradGuard no_grad;
    pf[i].mul_(1.5);  // every matrix, the LM head included
    pe[i].mul_(1.5);
  }
  const at::Tensor after = logits(**f, *cf);
  EXPECT_GT(MaxAbsDiff(before, after), 1e-2) << "the update changes the logits";
  EXPECT_LT(MaxAbsDiff(after, logits(**e, *ce)), kLogitTolerance);
}

// Greedy autoregressive and static self-speculative decoding through the
// Engine (prefill, steps, verification) with model `m` emit the ids and the
// acceptance of the eager model, on lede-tiny (non-vacuous: drafts are
// accepted).
void ExpectEngineMatchesEager(std::shared_ptr<const LlamaModel> m) {
  std::shared_ptr<const LlamaModel> eager = LoadOrDie(kLedeTinyDir, Kernels::kEager);
  ASSERT_NE(m, nullptr);
  ASSERT_NE(eager, nullptr);
  auto em = Engine::Create(m, KvCacheOptions{});
  auto ee = Engine::Create(eager, KvCacheOptions{});
  ASSERT_THAT(em, IsOk());
  ASSERT_THAT(ee, IsOk());
  const std::vector<int32_t> prompt = {1, 400, 31, 52};
  for (SpeculationMode mode : {SpeculationMode::kAutoregressive, SpeculationMode::kStatic}) {
    GenerateOptions o;
    o.max_new_tokens = 64;
    o.stop_at_eos = false;
    o.mode = mode;
    o.exit_layer = 3;
    o.draft_len = 4;
    auto a = (*em)->Generate(prompt, o);
    auto b = (*ee)->Generate(prompt, o);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ(a->tokens, b->tokens);
    EXPECT_EQ(a->stats.n_accepted, b->stats.n_accepted);
    if (mode == SpeculationMode::kStatic) {
      EXPECT_GT(b->stats.n_accepted, 0) << "the comparison covers accepted drafts";
    }
  }
}

TEST(FusedKernelsTest, EngineGreedyIdsIdenticalOnLedeTiny) {
  ExpectEngineMatchesEager(LoadOrDie(kLedeTinyDir, Kernels::kFused));
}

// --- the graph-safe decode step (llama.h GraphMode, StaticForward) -------
// On this CPU the recorded steps run eagerly from their static buffers: the
// data flow a CUDA graph replays (positions, slot and lengths read from the
// buffers, never from the host) is what these tests check.

std::unique_ptr<LlamaModel> LoadWithGraphs(const std::string& path) {
  ModelOptions o;
  o.graphs = GraphMode::kOn;
  auto m = LlamaModel::Load(path, o);
  EXPECT_THAT(m, IsOk());
  return m.ok() ? std::move(*m) : nullptr;
}

TEST(StepGraphsTest, ParseGraphModeAndDefaults) {
  EXPECT_EQ(*ParseGraphMode("auto"), GraphMode::kAuto);
  EXPECT_EQ(*ParseGraphMode("on"), GraphMode::kOn);
  EXPECT_EQ(*ParseGraphMode("off"), GraphMode::kOff);
  EXPECT_THAT(ParseGraphMode("yes"), StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("graphs")));
  EXPECT_STREQ(GraphModeName(GraphMode::kOn), "on");
  // auto is off on the CPU: the fused path serves it.
  std::unique_ptr<LlamaModel> cpu = LoadOrDie(kLedeTinyDir);
  ASSERT_NE(cpu, nullptr);
  EXPECT_FALSE(cpu->graphs());
  EXPECT_EQ(cpu->n_graphs(), 0);
}

TEST(StepGraphsTest, ContextBucketsArePowersOfTwoWithinCapacity) {
  using internal::StepGraphs;
  EXPECT_EQ(StepGraphs::ContextBucket(1, 512), 64);
  EXPECT_EQ(StepGraphs::ContextBucket(64, 512), 64);
  EXPECT_EQ(StepGraphs::ContextBucket(65, 512), 128);
  EXPECT_EQ(StepGraphs::ContextBucket(300, 512), 512);
  EXPECT_EQ(StepGraphs::ContextBucket(300, 320), 320);  // capped at the pool
  EXPECT_EQ(StepGraphs::ContextBucket(10, 32), 32);
}

// Prefill, 64 steps, verification shapes and exit probes through the graph
// path equal the eager ones; the steps reuse their buckets.
TEST(StepGraphsTest, MatchesEagerOnLedeTiny) {
  std::unique_ptr<LlamaModel> g = LoadWithGraphs(kLedeTinyDir);
  std::unique_ptr<LlamaModel> eager = LoadOrDie(kLedeTinyDir, Kernels::kEager);
  ASSERT_NE(g, nullptr);
  ASSERT_NE(eager, nullptr);
  ASSERT_TRUE(g->graphs());
  ExpectMatchesEager(*g, *eager, {1, 400, 31, 52, 7, 90}, 64);
  // The prefill (6 rows, context 64), the steps at positions 6..69 (contexts
  // 64 and 128) and 8 verification widths x 3 exits at position 70 (context
  // 128): 1 + 2 + 24 buckets, however many calls.
  EXPECT_EQ(g->n_graphs(), 27);
}

TEST(StepGraphsTest, MatchesEagerOnStories260KAndRandomGqa) {
  std::unique_ptr<LlamaModel> g = LoadWithGraphs(lede::testing::Stories260KDir());
  std::unique_ptr<LlamaModel> eager = LoadOrDie(lede::testing::Stories260KDir(), Kernels::kEager);
  ASSERT_NE(g, nullptr);
  ASSERT_NE(eager, nullptr);
  ExpectMatchesEager(*g, *eager, {1, 403, 407, 261, 378}, 64);
  EXPECT_GT(g->n_graphs(), 0);

  ModelOptions go, eo;
  go.graphs = GraphMode::kOn;
  eo.kernels = Kernels::kEager;
  auto gm = RandomGqa(go);
  auto em = RandomGqa(eo);
  ASSERT_THAT(gm, IsOk());
  ASSERT_THAT(em, IsOk());
  ExpectMatchesEager(**gm, **em, {1, 7, 3, 9, 20, 11}, 64);
  EXPECT_GT((*gm)->n_graphs(), 0);
}

// Two sequences in slots 1 and 0, stepped in turn: a bucket recorded for
// one slot serves the other (the slot comes from the buffer), and each
// step writes only its own slot's K/V.
TEST(StepGraphsTest, OneBucketServesEverySlot) {
  std::unique_ptr<LlamaModel> g = LoadWithGraphs(kLedeTinyDir);
  std::unique_ptr<LlamaModel> eager = LoadOrDie(kLedeTinyDir, Kernels::kEager);
  ASSERT_NE(g, nullptr);
  ASSERT_NE(eager, nullptr);
  c10::InferenceMode guard;
  KvCacheOptions ko;
  ko.n_slots = 2;
  ko.capacity = 128;
  auto cg = KvCache::Create(g->config(), ko);
  auto ce = KvCache::Create(eager->config(), ko);
  ASSERT_THAT(cg, IsOk());
  ASSERT_THAT(ce, IsOk());
  const int64_t L = g->n_layers();
  auto run = [&](const LlamaModel& m, KvCache& c, int64_t id, int64_t pos, int64_t slot) {
    return m.ExitLogits(m.Forward(m.Embed(Ids({id})), 0, L, pos, &c, slot));
  };
  std::vector<int64_t> next = {400, 31};  // slot 0 and slot 1 start apart
  for (int64_t pos = 0; pos < 20; ++pos) {
    for (int64_t slot : {1, 0}) {
      at::Tensor lg = run(*g, *cg, next[slot], pos, slot), le = run(*eager, *ce, next[slot], pos, slot);
      ASSERT_LT(MaxAbsDiff(lg, le), kLogitTolerance) << "slot " << slot << " pos " << pos;
      next[slot] = le[0][-1].argmax().item<int64_t>();
    }
  }
  EXPECT_EQ(g->n_graphs(), 1);  // one bucket (T 1, context 64) for both slots
  for (int64_t l = 0; l < L; ++l) {
    EXPECT_LT(MaxAbsDiff(cg->k(l), ce->k(l)), 1e-4) << "K of layer " << l;
    EXPECT_LT(MaxAbsDiff(cg->v(l), ce->v(l)), 1e-4) << "V of layer " << l;
  }
  // Nothing was written past position 20 of either slot.
  EXPECT_EQ(cg->k(0).narrow(2, 20, 108).abs().max().item<float>(), 0.0f);
}

// The Engine's decoding through the graph path emits the eager ids
// (lossless speculation on the path a GPU replays).
TEST(StepGraphsTest, EngineGreedyIdsIdenticalOnLedeTiny) {
  std::shared_ptr<const LlamaModel> g = LoadWithGraphs(kLedeTinyDir);
  ExpectEngineMatchesEager(g);
  ASSERT_NE(g, nullptr);
  EXPECT_GT(g->n_graphs(), 3) << "the steps went through the graph path";
}

// --- weight formats (--weights bf16 | q8_0) ---------------------
// The eager path computes with the dequantized weights (the reference);
// the fused path reads the packed bf16 / Q8_0 copies. bf16: the same
// products in float32 (only the summation order differs): 1e-4 as f32.
// q8_0: the fused kernels also round each activation row to int8 blocks
// (llama.cpp's Q8_0 x Q8_0 dot product, about 0.4% of a block's largest
// |x| per element), an error that grows along the context; so q8_0 is
// compared relative to the reference's largest |logit| (and |K|, |V|).
// Measured, the largest relative difference over prefill, the steps, the
// verification shapes and the exit probes: 1.9% on lede-tiny (48 steps),
// 3.4% on babyllama (32 steps; K/V included), greedy ids identical at every
// step on both: tolerance 5%.
constexpr float kBf16LogitTolerance = 1e-4f;
constexpr float kQ8LogitTolerance = 0.25f;     // absolute, a random model's logits (|logit| < 5)
constexpr float kQ8RelativeTolerance = 0.05f;  // of the largest |logit| of each compared pass

std::unique_ptr<LlamaModel> LoadAs(const std::string& path, Kernels kernels, loaders::WeightFormat weights) {
  ModelOptions o;
  o.kernels = kernels;
  o.weights = weights;
  auto m = LlamaModel::Load(path, o);
  EXPECT_THAT(m, IsOk());
  return m.ok() ? std::move(*m) : nullptr;
}

void ExpectFormatMatchesEager(const std::string& path, loaders::WeightFormat f, const std::vector<int64_t>& prompt,
                              int64_t n_steps) {
  std::unique_ptr<LlamaModel> fused = LoadAs(path, Kernels::kFused, f);
  std::unique_ptr<LlamaModel> eager = LoadAs(path, Kernels::kEager, f);
  ASSERT_NE(fused, nullptr);
  ASSERT_NE(eager, nullptr);
  ASSERT_TRUE(fused->fused());
  EXPECT_EQ(fused->weight_format(), f);
  EXPECT_EQ(eager->weight_format(), f);
  float worst = 0.0f;
  const bool q8 = f == loaders::WeightFormat::kQ8_0;
  ExpectMatchesEager(*fused, *eager, prompt, n_steps, q8 ? kQ8RelativeTolerance : kBf16LogitTolerance, &worst, q8);
  std::printf("[%s] %s: largest |fused - eager| %s %.3g\n", loaders::WeightFormatName(f), path.c_str(),
              q8 ? "relative to the largest |logit|" : "logit", worst);
}

TEST(WeightFormatModelTest, Bf16FusedMatchesDequantizedEagerOnLedeTiny) {
  ExpectFormatMatchesEager(kLedeTinyDir, loaders::WeightFormat::kBf16, {1, 400, 31, 52, 7, 90}, 48);
}

TEST(WeightFormatModelTest, Q8FusedMatchesDequantizedEagerOnLedeTiny) {
  ExpectFormatMatchesEager(kLedeTinyDir, loaders::WeightFormat::kQ8_0, {1, 400, 31, 52, 7, 90}, 48);
}

TEST(WeightFormatModelTest, FormatsMatchDequantizedEagerOnBabyLlama) {
  for (loaders::WeightFormat f : {loaders::WeightFormat::kBf16, loaders::WeightFormat::kQ8_0}) {
    ExpectFormatMatchesEager(lede::testing::BabyLlamaDir() + "/model5000.bin", f,
                             {1, 3, 34, 9, 22, 4, 3, 18, 20, 7, 9, 3, 5, 3, 6, 10, 16, 4}, 32);
  }
}

// The stored weights are the format's values: every matrix of the model
// (the eager reference's tensors) is a fixed point of the format's rounding
// and differs from the float32 checkpoint (non-vacuous); packed bytes shrink.
TEST(WeightFormatModelTest, MatricesHoldTheFormatsValues) {
  std::unique_ptr<LlamaModel> f32 = LoadAs(kLedeTinyDir, Kernels::kFused, loaders::WeightFormat::kAuto);
  ASSERT_NE(f32, nullptr);
  EXPECT_EQ(f32->weight_format(), loaders::WeightFormat::kF32);  // lede-tiny is F32 on disk
  const auto reference = f32->NamedTensors();
  for (loaders::WeightFormat f : {loaders::WeightFormat::kBf16, loaders::WeightFormat::kQ8_0}) {
    std::unique_ptr<LlamaModel> m = LoadAs(kLedeTinyDir, Kernels::kFused, f);
    ASSERT_NE(m, nullptr);
    EXPECT_LT(m->packed_weight_bytes(), f32->packed_weight_bytes() * (f == loaders::WeightFormat::kBf16 ? 0.51 : 0.27));
    for (const auto& [name, t] : m->NamedTensors()) {
      if (t.dim() != 2 || name == "model.embed_tokens.weight") continue;
      at::Tensor again;
      if (f == loaders::WeightFormat::kBf16) {
        again = t.to(at::kBFloat16).to(at::kFloat);
      } else {
        const int64_t rows = t.size(0), in = t.size(1);
        std::vector<cpu::BlockQ8_0> b(rows * in / 32);
        cpu::QuantizeRowsQ8_0(t.data_ptr<float>(), rows, in, b.data());
        again = at::empty({rows, in}, at::kFloat);
        cpu::DequantizeRowsQ8_0(b.data(), rows, in, again.data_ptr<float>());
      }
      EXPECT_TRUE(at::equal(again, t)) << loaders::WeightFormatName(f) << " " << name;
      EXPECT_FALSE(at::equal(reference.at(name), t)) << loaders::WeightFormatName(f) << " " << name;
      EXPECT_LT(MaxAbsDiff(reference.at(name), t), 0.02f * reference.at(name).abs().max().item<float>());
    }
  }
}

// Bytes of one matrix [out, in] packed in format f (cpu_quant_kernels.h).
int64_t PackedBytes(loaders::WeightFormat f, int64_t out, int64_t in) {
  return f == loaders::WeightFormat::kBf16 ? cpu::PackedRowsPadded(out) * in * 2
                                  : static_cast<int64_t>(cpu::PackedQ8_0Bytes(out, in));
}

// What a fused bf16 / q8_0 model should hold: the packed matrices, the
// float32 norms, and an untied embedding table of embed_bytes_per_weight.
int64_t ExpectedPackedOnlyBytes(const checkpoint::ModelConfig& c, loaders::WeightFormat f, int64_t embed_bytes_per_weight) {
  const int64_t d = c.dim, hd = c.head_dim(), F = c.hidden_dim, V = c.vocab_size;
  int64_t total = PackedBytes(f, V, d) + d * 4;  // LM head, final norm
  if (!c.tie_word_embeddings) total += V * d * embed_bytes_per_weight;
  total += c.n_layers * (PackedBytes(f, (c.n_heads + 2 * c.n_kv_heads) * hd, d) + PackedBytes(f, d, c.n_heads * hd) +
                         PackedBytes(f, 2 * F, d) + PackedBytes(f, d, F) + 2 * d * 4);
  return total;
}

// Checks a packed-only fused model: no float32 copy of any packed matrix is
// held; its logits are bitwise those of a fused model of the same weights
// that keeps float32 tensors beside the packed ones (`kept`: writable
// weights, the layout that keeps both copies); at bf16 they agree
// with the eager reference (`eager`) within 1e-4 at every step,
// verification shape, exit probe and K/V (q8_0's activation rounding is far
// coarser on this 32-wide random model: its agreement with the reference is
// checked on real models above, Q8FusedMatchesDequantizedEagerOnLedeTiny and
// FormatsMatchDequantizedEagerOnBabyLlama, which load packed only too);
// the eager path on the fused model itself (a cache-free pass) runs on the
// same dequantized weights as the reference, and NamedTensors() gives the
// reference's values without keeping a copy.
void ExpectPackedOnly(const LlamaModel& fused, const LlamaModel& kept, const LlamaModel& eager, loaders::WeightFormat f,
                      int64_t embed_bytes_per_weight) {
  ASSERT_TRUE(fused.fused());
  ASSERT_TRUE(kept.fused());
  ASSERT_EQ(fused.weight_format(), f);
  ASSERT_EQ(kept.weight_format(), f);
  const checkpoint::ModelConfig& c = fused.config();
  const int64_t expected = ExpectedPackedOnlyBytes(c, f, embed_bytes_per_weight);
  EXPECT_EQ(fused.resident_weight_bytes(), expected) << loaders::WeightFormatName(f);
  const int64_t norms = (2 * c.n_layers + 1) * c.dim * 4;
  const int64_t embed = c.tie_word_embeddings ? 0 : c.vocab_size * c.dim * embed_bytes_per_weight;
  EXPECT_EQ(fused.packed_weight_bytes(), expected - norms - embed);
  EXPECT_EQ(kept.packed_weight_bytes(), fused.packed_weight_bytes());
  EXPECT_GT(kept.resident_weight_bytes(), 2 * fused.packed_weight_bytes()) << "float32 tensors beside";
  const int64_t L = fused.n_layers();
  {
    c10::InferenceMode guard;
    KvCacheOptions ko;
    ko.capacity = 64;
    auto ca = KvCache::Create(c, ko);
    auto cb = KvCache::Create(c, ko);
    auto ce = KvCache::Create(c, ko);
    ASSERT_THAT(ca, IsOk());
    ASSERT_THAT(cb, IsOk());
    ASSERT_THAT(ce, IsOk());
    auto run = [&](const LlamaModel& m, KvCache& cache, const std::vector<int64_t>& ids, int64_t pos) {
      return m.ExitLogits(m.Forward(m.Embed(Ids(ids)), 0, L, pos, &cache, 0));
    };
    std::vector<int64_t> ids = {1, 5, 9, 3, 17, 2};
    int64_t pos = 0;
    for (int step = 0; step < 8; ++step) {
      at::Tensor a = run(fused, *ca, ids, pos), b = run(kept, *cb, ids, pos), e = run(eager, *ce, ids, pos);
      EXPECT_TRUE(at::equal(a, b)) << loaders::WeightFormatName(f) << " step " << step;
      pos += static_cast<int64_t>(ids.size());
      ids = {e[0][-1].argmax().item<int64_t>()};
      if (step == 3) ids = {4, 8, 15, 16};  // a verification-shaped pass
    }
  }
  if (f == loaders::WeightFormat::kBf16) {
    ExpectMatchesEager(fused, eager, {1, 5, 9, 3, 17, 2}, 24, kBf16LogitTolerance);
  }
  const auto a = fused.NamedTensors(), b = eager.NamedTensors();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : b) EXPECT_TRUE(at::equal(a.at(name), t)) << loaders::WeightFormatName(f) << " " << name;
  EXPECT_EQ(fused.resident_weight_bytes(), expected) << "NamedTensors() keeps no copy";
  {
    c10::InferenceMode guard;
    at::Tensor ids = Ids({1, 7, 11, 4});
    at::Tensor hf = fused.Forward(fused.Embed(ids), 0, L, 0, nullptr, 0);  // cache-free: the eager blocks
    at::Tensor he = eager.Forward(eager.Embed(ids), 0, L, 0, nullptr, 0);
    EXPECT_LT(MaxAbsDiff(hf, he), 1e-5) << loaders::WeightFormatName(f) << ": cache-free (eager) pass";
  }
  EXPECT_GT(fused.resident_weight_bytes(), expected) << "the eager pass materialized float32 matrices";
}

// bf16 / q8_0 on the fused path keep only the packed matrices (a
// bf16 Llama-3.2-1B fits in its bf16 bytes): tied and untied heads.
TEST(WeightFormatModelTest, FusedPackedModelHoldsNoFloat32Matrices) {
  for (bool tied : {true, false}) {
    for (loaders::WeightFormat f : {loaders::WeightFormat::kBf16, loaders::WeightFormat::kQ8_0}) {
      ModelOptions fo, ko, eo;
      fo.weights = ko.weights = eo.weights = f;
      ko.writable_weights = true;
      eo.kernels = Kernels::kEager;
      auto fused = LlamaModel::RandomInit(testing::TinyConfig(tied), 11, fo, 0.3);
      auto kept = LlamaModel::RandomInit(testing::TinyConfig(tied), 11, ko, 0.3);
      auto eager = LlamaModel::RandomInit(testing::TinyConfig(tied), 11, eo, 0.3);
      ASSERT_THAT(fused, IsOk());
      ASSERT_THAT(kept, IsOk());
      ASSERT_THAT(eager, IsOk());
      SCOPED_TRACE(tied ? "tied" : "untied");
      ExpectPackedOnly(**fused, **kept, **eager, f, /*embed_bytes_per_weight=*/4);  // an f32 source's embedding
    }
  }
}

// A BF16 safetensors checkpoint loads as bf16 (auto) straight from the
// file's storage: the untied embedding stays bf16, every matrix packed
// only; q8_0 from the same file too.
TEST(WeightFormatModelTest, Bf16CheckpointLoadsPackedOnly) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = tmp.path().string();
  auto random = LlamaModel::RandomInit(testing::TinyConfig(/*tied=*/false), 3, ModelOptions{}, 0.3);
  ASSERT_THAT(random, IsOk());
  ASSERT_THAT((*random)->SaveHf(dir), IsOk());
  ASSERT_THAT(loaders::WriteSafetensors(dir + "/model.safetensors", (*random)->NamedTensors(), "BF16"), IsOk());
  for (loaders::WeightFormat f : {loaders::WeightFormat::kAuto, loaders::WeightFormat::kQ8_0}) {
    ModelOptions fo, ko, eo;
    fo.weights = ko.weights = eo.weights = f;
    ko.writable_weights = true;
    eo.kernels = Kernels::kEager;
    auto fused = LlamaModel::Load(dir, fo);
    auto kept = LlamaModel::Load(dir, ko);
    auto eager = LlamaModel::Load(dir, eo);
    ASSERT_THAT(fused, IsOk());
    ASSERT_THAT(kept, IsOk());
    ASSERT_THAT(eager, IsOk());
    const loaders::WeightFormat stored = f == loaders::WeightFormat::kAuto ? loaders::WeightFormat::kBf16 : f;
    ExpectPackedOnly(**fused, **kept, **eager, stored, /*embed_bytes_per_weight=*/2);
  }
}

// A ragged batch on the fused q8_0 / bf16 path gives each segment's rows
// bitwise as a fused call of that segment alone (every weight block read
// once for all rows; rows computed independently).
TEST(WeightFormatModelTest, RaggedRowsAreBitwiseSoloRows) {
  for (loaders::WeightFormat f : {loaders::WeightFormat::kBf16, loaders::WeightFormat::kQ8_0}) {
    checkpoint::ModelConfig c = testing::TinyConfig();  // dim 32, hidden 64: every matrix takes q8_0
    ModelOptions o;
    o.weights = f;
    auto m = LlamaModel::RandomInit(c, 5, o, 0.3);
    ASSERT_THAT(m, IsOk());
    ASSERT_EQ((*m)->weight_format(), f);
    const LlamaModel& model = **m;
    c10::InferenceMode guard;
    KvCacheOptions ko;
    ko.n_slots = 3;
    auto batched = KvCache::Create(c, ko);
    auto solo = KvCache::Create(c, ko);
    ASSERT_THAT(batched, IsOk());
    ASSERT_THAT(solo, IsOk());
    const std::vector<RaggedSegment> segments = {{2, 0, 3}, {0, 0, 1}, {1, 0, 5}};
    at::Tensor batch = model.Embed(Ids({3, 4, 5, 6, 7, 8, 9, 10, 11})).view({-1, c.dim});
    at::Tensor rows = model.ForwardRagged(batch, 0, c.n_layers, segments, *batched);
    at::Tensor logits = model.ExitLogitsRagged(rows, {3, 1, 5});
    int64_t row = 0;
    for (const RaggedSegment& s : segments) {
      at::Tensor h = model.Forward(batch.narrow(0, row, s.n_positions).unsqueeze(0), 0, c.n_layers, 0, &*solo,
                                   s.slot);
      EXPECT_TRUE(at::equal(rows.narrow(0, row, s.n_positions), h.squeeze(0))) << loaders::WeightFormatName(f);
      EXPECT_TRUE(at::equal(logits.narrow(0, row, s.n_positions), model.ExitLogits(h).squeeze(0)));
      row += s.n_positions;
    }
  }
}

// The threaded products (SetFusedThreads: output rows split at multiples
// of 4 across threads, each thread quantizing X itself for q8_0) give the
// one-thread rows bitwise, at each format.
TEST(WeightFormatModelTest, ThreadedProductsAreBitwiseOneThread) {
  checkpoint::ModelConfig c = testing::TinyConfig();
  c.dim = 64;
  c.hidden_dim = 128;
  for (loaders::WeightFormat f : {loaders::WeightFormat::kBf16, loaders::WeightFormat::kQ8_0}) {
    ModelOptions o;
    o.weights = f;
    auto m = LlamaModel::RandomInit(c, 21, o, 0.3);
    ASSERT_THAT(m, IsOk());
    c10::InferenceMode guard;
    KvCacheOptions ko;
    auto one = KvCache::Create(c, ko);
    auto two = KvCache::Create(c, ko);
    ASSERT_THAT(one, IsOk());
    ASSERT_THAT(two, IsOk());
    const at::Tensor x = (*m)->Embed(Ids({1, 5, 9, 2, 7, 3, 8, 4, 6}));
    SetFusedThreads(1);
    const at::Tensor a = (*m)->Forward(x, 0, c.n_layers, 0, &*one, 0);
    const int before = at::get_num_threads();
    at::set_num_threads(2);
    SetFusedThreads(2);
    const at::Tensor b = (*m)->Forward(x, 0, c.n_layers, 0, &*two, 0);
    SetFusedThreads(1);
    at::set_num_threads(before);
    EXPECT_TRUE(at::equal(a, b)) << loaders::WeightFormatName(f);
  }
}

// Greedy autoregressive and static speculative decoding through the Engine
// on lede-tiny at each format: the fused model emits the dequantized eager
// model's ids, and speculation stays lossless against autoregressive
// decoding at the same precision (both kernels).
TEST(WeightFormatModelTest, EngineGreedyIdsAndLosslessSpeculationAtEachFormat) {
  for (loaders::WeightFormat f : {loaders::WeightFormat::kBf16, loaders::WeightFormat::kQ8_0}) {
    std::shared_ptr<const LlamaModel> fused = LoadAs(kLedeTinyDir, Kernels::kFused, f);
    std::shared_ptr<const LlamaModel> eager = LoadAs(kLedeTinyDir, Kernels::kEager, f);
    ASSERT_NE(fused, nullptr);
    ASSERT_NE(eager, nullptr);
    auto ef = Engine::Create(fused, KvCacheOptions{});
    auto ee = Engine::Create(eager, KvCacheOptions{});
    ASSERT_THAT(ef, IsOk());
    ASSERT_THAT(ee, IsOk());
    const std::vector<int32_t> prompt = {1, 400, 31, 52};
    GenerateOptions ar;
    ar.max_new_tokens = 64;
    ar.stop_at_eos = false;
    auto ar_f = (*ef)->Generate(prompt, ar);
    auto ar_e = (*ee)->Generate(prompt, ar);
    ASSERT_THAT(ar_f, IsOk());
    ASSERT_THAT(ar_e, IsOk());
    EXPECT_EQ(ar_f->tokens, ar_e->tokens) << loaders::WeightFormatName(f);
    for (auto [e, d] : {std::pair<int64_t, int64_t>{3, 4}, {6, 2}, {1, 8}}) {
      GenerateOptions o = ar;
      o.mode = SpeculationMode::kStatic;
      o.exit_layer = e;
      o.draft_len = d;
      auto sf = (*ef)->Generate(prompt, o);
      auto se = (*ee)->Generate(prompt, o);
      ASSERT_THAT(sf, IsOk());
      ASSERT_THAT(se, IsOk());
      EXPECT_EQ(sf->tokens, ar_f->tokens) << loaders::WeightFormatName(f) << " fused E=" << e << " D=" << d;
      EXPECT_EQ(se->tokens, ar_e->tokens) << loaders::WeightFormatName(f) << " eager E=" << e << " D=" << d;
      EXPECT_GT(sf->stats.n_accepted, 0);
    }
  }
}

// kAuto keeps a BF16 checkpoint in bf16 (and f32 asks for float32).
TEST(WeightFormatModelTest, AutoKeepsTheCheckpointsStorage) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  auto random = LlamaModel::RandomInit(testing::TinyConfig(), 7, ModelOptions{}, 0.3);
  ASSERT_THAT(random, IsOk());
  const std::string dir = (tmp.path() / "bf16").string();
  ASSERT_THAT((*random)->SaveHf(dir), IsOk());
  ASSERT_THAT(loaders::WriteSafetensors(dir + "/model.safetensors", (*random)->NamedTensors(), "BF16"), IsOk());
  auto ckpt = loaders::LoadCheckpoint(dir);
  ASSERT_THAT(ckpt, IsOk());
  EXPECT_EQ(ckpt->storage, loaders::WeightFormat::kBf16);
  std::unique_ptr<LlamaModel> a = LoadAs(dir, Kernels::kFused, loaders::WeightFormat::kAuto);
  std::unique_ptr<LlamaModel> f = LoadAs(dir, Kernels::kFused, loaders::WeightFormat::kF32);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(a->weight_format(), loaders::WeightFormat::kBf16);
  EXPECT_EQ(f->weight_format(), loaders::WeightFormat::kF32);
  EXPECT_LT(a->packed_weight_bytes() * 2, f->packed_weight_bytes() + 64);
  auto ckpt32 = loaders::LoadCheckpoint(lede::testing::Stories260KDir());
  ASSERT_THAT(ckpt32, IsOk());
  EXPECT_EQ(ckpt32->storage, loaders::WeightFormat::kF32);
}

// Q8_0 blocks handed in with a checkpoint (as a GGUF reader does) are used
// as they are: blocks whose largest |q| is 100 (llama.cpp's quantizer
// writes 127, so re-quantizing would change them) give a model whose
// matrices are exactly their dequantized values, on both kernels, and the
// fused path agrees with the eager one.
TEST(WeightFormatModelTest, HandedInQ8BlocksAreUsedAsTheyAre) {
  checkpoint::ModelConfig c = testing::TinyConfig();
  auto random = LlamaModel::RandomInit(c, 13, ModelOptions{}, 0.3);
  ASSERT_THAT(random, IsOk());
  loaders::Checkpoint ckpt;
  ckpt.config = c;
  ckpt.source = "handed-in";
  ckpt.storage = loaders::WeightFormat::kQ8_0;
  for (const auto& [name, t] : (*random)->NamedTensors()) {
    ckpt.tensors[name] = t;
    if (t.dim() != 2 || name == "model.embed_tokens.weight") continue;
    const int64_t rows = t.size(0), in = t.size(1);
    at::Tensor blocks = at::empty({rows, in / 32 * 34}, at::kByte);
    auto* b = reinterpret_cast<cpu::BlockQ8_0*>(blocks.data_ptr());
    cpu::QuantizeRowsQ8_0(t.data_ptr<float>(), rows, in, b);
    for (int64_t i = 0; i < rows * in / 32; ++i) {
      for (int8_t& q : b[i].qs) q = static_cast<int8_t>(q * 100 / 127);
    }
    at::Tensor values = at::empty({rows, in}, at::kFloat);
    cpu::DequantizeRowsQ8_0(b, rows, in, values.data_ptr<float>());
    ckpt.tensors[name] = values;
    ckpt.q8_0_blocks[name] = blocks;
  }
  ModelOptions fo, eo;
  eo.kernels = Kernels::kEager;
  auto fused = LlamaModel::FromCheckpoint(ckpt, fo);
  auto eager = LlamaModel::FromCheckpoint(ckpt, eo);
  ASSERT_THAT(fused, IsOk());
  ASSERT_THAT(eager, IsOk());
  EXPECT_EQ((*fused)->weight_format(), loaders::WeightFormat::kQ8_0);
  for (const auto& [name, t] : (*eager)->NamedTensors()) {
    if (ckpt.q8_0_blocks.count(name) == 0) continue;
    EXPECT_TRUE(at::equal(t, ckpt.tensors.at(name))) << name;
  }
  // Without the blocks, the same values are quantized afresh: different.
  loaders::Checkpoint requantized = ckpt;
  requantized.q8_0_blocks.clear();
  auto other = LlamaModel::FromCheckpoint(requantized, eo);
  ASSERT_THAT(other, IsOk());
  EXPECT_FALSE(at::equal((*other)->NamedTensors().at("model.layers.0.mlp.down_proj.weight"),
                         ckpt.tensors.at("model.layers.0.mlp.down_proj.weight")));
  // A random model has near-ties, so only the logits of a prefill and of
  // verification-shaped passes are compared (greedy ids on real models:
  // the tests above).
  c10::InferenceMode guard;
  KvCacheOptions ko;
  auto cf = KvCache::Create(c, ko);
  auto ce = KvCache::Create(c, ko);
  ASSERT_THAT(cf, IsOk());
  ASSERT_THAT(ce, IsOk());
  for (int64_t pos : {0, 6}) {
    const std::vector<int64_t> ids = {1, 7, 3, 9, 20, 11};
    at::Tensor lf = (*fused)->ExitLogits((*fused)->Forward((*fused)->Embed(Ids(ids)), 0, c.n_layers, pos, &*cf, 0));
    at::Tensor le = (*eager)->ExitLogits((*eager)->Forward((*eager)->Embed(Ids(ids)), 0, c.n_layers, pos, &*ce, 0));
    EXPECT_LT(MaxAbsDiff(lf, le), kQ8LogitTolerance);
  }
}

}  // namespace
}  // namespace lede::model
