// Tests of the ggml weight formats (weight_format.h: q4_0, q4_k_m, gguf)
// through the engine: a safetensors checkpoint quantized at load, a
// Q4_K_M / Q4_0 GGUF written with llama.cpp's tensor mix and loaded as it
// is, and lossless static self-speculation at each format on both paths.
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/checkpoint/gguf.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_data.h"

namespace lede::model {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;

constexpr double kNearTie = 1e-4;  // as decoding_test.cc: docs/design.md §1

// Rows a multiple of 256, so the K types (not their fallbacks) are used:
// d 256, FFN 512, 4 layers (Q6_K attn_v / ffn_down at layers 2 and 3).
checkpoint::ModelConfig KConfig() {
  checkpoint::ModelConfig c;
  c.dim = 256;
  c.hidden_dim = 512;
  c.n_layers = 4;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 96;
  c.max_seq_len = 128;
  c.eos_ids = {};
  return c;
}

std::string WriteRandomHf(const std::string& dir) {
  auto random = LlamaModel::RandomInit(KConfig(), /*seed=*/3, ModelOptions{}, 0.3);
  EXPECT_THAT(random, IsOk());
  EXPECT_THAT((*random)->SaveHf(dir), IsOk());
  return dir;
}

std::shared_ptr<const LlamaModel> Load(const std::string& path, loaders::WeightFormat f, Kernels k) {
  ModelOptions o;
  o.weights = f;
  o.kernels = k;
  auto m = LlamaModel::Load(path, o);
  EXPECT_THAT(m, IsOk());
  return m.ok() ? std::shared_ptr<const LlamaModel>(std::move(*m)) : nullptr;
}

// Static greedy output equals this engine's autoregressive greedy output
// for every exit layer and D in {1, 3, 8} (a divergence only at a
// numerical near-tie, as decoding_test.cc's ExpectLossless).
void ExpectLossless(std::shared_ptr<const LlamaModel> model, const std::vector<int32_t>& prompt, int64_t n) {
  KvCacheOptions ko;
  ko.max_draft_len = 8;
  auto engine = Engine::Create(model, ko);
  ASSERT_THAT(engine, IsOk());
  GenerateOptions ar;
  ar.max_new_tokens = n;
  ar.record_margins = true;
  auto reference = (*engine)->Generate(prompt, ar);
  ASSERT_THAT(reference, IsOk());
  ASSERT_EQ(static_cast<int64_t>(reference->tokens.size()), n);
  for (int64_t e = 1; e <= model->n_layers(); ++e) {
    for (int64_t d : {1, 3, 8}) {
      GenerateOptions o;
      o.mode = SpeculationMode::kStatic;
      o.exit_layer = e;
      o.draft_len = d;
      o.max_new_tokens = n;
      o.record_margins = true;
      auto spec = (*engine)->Generate(prompt, o);
      ASSERT_THAT(spec, IsOk());
      size_t i = 0;
      while (i < spec->tokens.size() && i < reference->tokens.size() && spec->tokens[i] == reference->tokens[i]) ++i;
      if (i < reference->tokens.size()) {
        ASSERT_LT(i, spec->tokens.size()) << "E=" << e << " D=" << d << " stopped early";
        EXPECT_LE(std::min(reference->margins[i], spec->margins[i]), kNearTie)
            << "E=" << e << " D=" << d << ": divergence at token " << i << " is not a near-tie";
      }
      EXPECT_GT(spec->stats.n_drafted, 0);
    }
  }
}

// A float32 safetensors checkpoint quantized at load to q4_k_m and q4_0:
// lossless on the fused and the eager paths, in about a third of q8_0's
// bytes (q4_k_m: 4.5-6.6 bits a weight).
TEST(GgmlWeightsTest, QuantizedAtLoadIsLosslessOnBothPaths) {
  lede::testing::TempDir tmp;
  const std::string dir = WriteRandomHf((tmp.path() / "k").string());
  auto q8 = Load(dir, loaders::WeightFormat::kQ8_0, Kernels::kFused);
  ASSERT_NE(q8, nullptr);
  for (loaders::WeightFormat f : {loaders::WeightFormat::kQ4_K_M, loaders::WeightFormat::kQ4_0}) {
    for (Kernels k : {Kernels::kFused, Kernels::kEager}) {
      SCOPED_TRACE(std::string(loaders::WeightFormatName(f)) + " " + KernelsName(k));
      auto m = Load(dir, f, k);
      ASSERT_NE(m, nullptr);
      EXPECT_EQ(m->weight_format(), f);
      if (k == Kernels::kFused) {
        EXPECT_LT(m->packed_weight_bytes(), q8->packed_weight_bytes() * 0.7);
      }
      ExpectLossless(m, {1, 7, 3, 9, 22}, 40);
    }
  }
}

// `lede export --weights q4_k_m | q4_0`: a GGUF with llama.cpp's tensor mix
// (types checked per tensor) that loads as it is (weights auto = gguf, the
// file's blocks) and decodes losslessly.
TEST(GgmlWeightsTest, ExportedLlamaCppMixLoadsAsItIs) {
  lede::testing::TempDir tmp;
  const std::string dir = WriteRandomHf((tmp.path() / "k").string());
  auto ckpt = loaders::LoadCheckpoint(dir);
  ASSERT_THAT(ckpt, IsOk());
  using checkpoint::GgmlType;
  for (loaders::WeightFormat f : {loaders::WeightFormat::kQ4_K_M, loaders::WeightFormat::kQ4_0}) {
    SCOPED_TRACE(loaders::WeightFormatName(f));
    const std::string path = (tmp.path() / (std::string(loaders::WeightFormatName(f)) + ".gguf")).string();
    checkpoint::GgufWriter writer;
    ASSERT_THAT(loaders::WriteGgufCheckpoint(path, ckpt->config, ckpt->tensors, f, &writer), IsOk());
    auto file = checkpoint::GgufFile::Open(path);
    ASSERT_THAT(file, IsOk());
    auto type = [&](const std::string& name) { return (*file)->FindTensor(name)->type; };
    EXPECT_EQ(type("output.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(type("blk.0.attn_norm.weight"), GgmlType::kF32);
    if (f == loaders::WeightFormat::kQ4_K_M) {
      EXPECT_EQ(type("token_embd.weight"), GgmlType::kQ4_K);
      EXPECT_EQ(type("blk.1.attn_q.weight"), GgmlType::kQ4_K);
      EXPECT_EQ(type("blk.1.attn_v.weight"), GgmlType::kQ4_K);
      EXPECT_EQ(type("blk.2.attn_v.weight"), GgmlType::kQ6_K);
      EXPECT_EQ(type("blk.3.ffn_down.weight"), GgmlType::kQ6_K);
      EXPECT_EQ(type("blk.1.ffn_down.weight"), GgmlType::kQ4_K);
    } else {
      EXPECT_EQ(type("blk.1.ffn_down.weight"), GgmlType::kQ4_0);
    }
    auto m = Load(path, loaders::WeightFormat::kAuto, Kernels::kFused);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->weight_format(), loaders::WeightFormat::kGguf);
    ExpectLossless(m, {1, 7, 3, 9, 22}, 32);
    // The same file re-read as its own mix keeps the blocks: same greedy ids.
    auto same = Load(path, f, Kernels::kFused);
    ASSERT_NE(same, nullptr);
    KvCacheOptions ko;
    auto e1 = Engine::Create(m, ko), e2 = Engine::Create(same, ko);
    ASSERT_THAT(e1, IsOk());
    ASSERT_THAT(e2, IsOk());
    GenerateOptions ar;
    ar.max_new_tokens = 24;
    auto a = (*e1)->Generate({1, 7, 3}, ar), b = (*e2)->Generate({1, 7, 3}, ar);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ(a->tokens, b->tokens);
  }
  checkpoint::GgufWriter writer;
  EXPECT_THAT(loaders::WriteGgufCheckpoint((tmp.path() / "x.gguf").string(), ckpt->config, ckpt->tensors, loaders::WeightFormat::kBf16,
                                  &writer),
              StatusIs(StatusCode::kInvalidArgument));
}

// lede-tiny (d 192: rows not a multiple of 256, so llama.cpp's fallbacks
// Q5_0 and Q8_0 beside Q4_K / Q6_K for ffn_down's 512) at q4_k_m is
// lossless on the fused path.
TEST(GgmlWeightsTest, LedeTinyAtQ4KMIsLossless) {
  auto m = Load(lede::testing::RepoRoot() + "/models/lede-tiny", loaders::WeightFormat::kQ4_K_M, Kernels::kFused);
  ASSERT_NE(m, nullptr);
  ExpectLossless(m, {1, 400, 31, 52, 7, 90}, 32);
}

}  // namespace
}  // namespace lede::model
