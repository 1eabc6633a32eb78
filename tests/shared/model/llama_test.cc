// Tests of shared/model/llama.h: golden logits and ids of the real models,
// KV-cache incremental decoding, exits, and the two checkpoint layouts.
#include "shared/model/llama.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/model/loaders/checkpoint.h"
#include "tests/shared/model/model_fixtures.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::model {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using testing::kBabyGreedy;
using testing::kBabyPrompt;
using testing::kStoriesGreedy;
using testing::kStoriesPrompt;
using testing::LoadOrDie;
using testing::TinyConfig;

at::Tensor Ids(const std::vector<int32_t>& ids) {
  std::vector<int64_t> wide(ids.begin(), ids.end());
  return at::tensor(wide, at::kLong).view({1, -1});
}

// Full-depth logits [T, V] of a whole sequence without a KV cache.
at::Tensor FullLogits(const LlamaModel& m, const std::vector<int32_t>& ids) {
  at::Tensor h = m.Forward(m.Embed(Ids(ids)), 0, m.n_layers(), 0, nullptr, 0);
  return m.ExitLogits(h).squeeze(0);
}

// Greedy decoding through the KV cache, one position at a time after prefill.
std::vector<int32_t> GreedyWithCache(const LlamaModel& m, const std::vector<int32_t>& prompt,
                                     int n, at::Tensor* first_logits = nullptr) {
  auto cache = KvCache::Create(m.config(), KvCacheOptions{});
  EXPECT_THAT(cache, IsOk());
  const int64_t P = static_cast<int64_t>(prompt.size());
  at::Tensor h = m.Forward(m.Embed(Ids(prompt)), 0, m.n_layers(), 0, &*cache, 0);
  at::Tensor logits = m.ExitLogits(h.narrow(1, P - 1, 1)).view({-1});
  if (first_logits) *first_logits = logits;
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(static_cast<int32_t>(logits.argmax().item<int64_t>()));
    h = m.Forward(m.Embed(Ids({out.back()})), 0, m.n_layers(), P + i, &*cache, 0);
    logits = m.ExitLogits(h).view({-1});
  }
  return out;
}

void ExpectTop5(const at::Tensor& logits, const std::vector<std::pair<int64_t, float>>& golden) {
  auto top = at::topk(logits, 5);
  for (size_t i = 0; i < golden.size(); ++i) {
    EXPECT_EQ(std::get<1>(top)[i].item<int64_t>(), golden[i].first) << "rank " << i;
    EXPECT_NEAR(std::get<0>(top)[i].item<float>(), golden[i].second, 1e-4) << "rank " << i;
  }
}

// stories260K reproduces the reference C implementation's top-5 logits and greedy ids.
TEST(LlamaModelTest, Stories260KMatchesGoldenLogitsAndIds) {
  c10::InferenceMode guard;
  auto m = LoadOrDie(lede::testing::Stories260KDir());
  ASSERT_NE(m, nullptr);
  at::Tensor first;
  std::vector<int32_t> ids = GreedyWithCache(*m, kStoriesPrompt, kStoriesGreedy.size(), &first);
  ExpectTop5(first, {{432, 17.79940f}, {383, 14.28126f}, {322, 9.70965f}, {353, 9.58729f}, {323, 9.13424f}});
  EXPECT_EQ(ids, kStoriesGreedy);
}

// babyllama (SentencePiece vocabulary of 105) reproduces its golden values.
TEST(LlamaModelTest, BabyLlamaMatchesGoldenLogitsAndIds) {
  c10::InferenceMode guard;
  auto m = LoadOrDie(lede::testing::BabyLlamaDir() + "/model5000.bin");
  ASSERT_NE(m, nullptr);
  at::Tensor first;
  std::vector<int32_t> ids = GreedyWithCache(*m, kBabyPrompt, kBabyGreedy.size(), &first);
  ExpectTop5(first, {{25, 10.03455f}, {3, 6.18944f}, {19, 3.17941f}, {36, 2.52491f}, {60, 1.83324f}});
  EXPECT_EQ(ids, kBabyGreedy);
}

// Prefill + one-token steps through the KV cache give the logits of one full causal pass.
TEST(LlamaModelTest, IncrementalDecodingEqualsFullForward) {
  c10::InferenceMode guard;
  for (const std::string& path : {lede::testing::Stories260KDir(), std::string()}) {
    std::unique_ptr<LlamaModel> m;
    if (path.empty()) {
      m = std::move(*LlamaModel::RandomInit(TinyConfig(), 3, ModelOptions{}, 0.3));
    } else {
      m = LoadOrDie(path);
    }
    ASSERT_NE(m, nullptr);
    std::vector<int32_t> ids;
    for (int i = 0; i < 40; ++i) ids.push_back((i * 7 + 3) % m->config().vocab_size);
    at::Tensor full = FullLogits(*m, ids);
    auto cache = KvCache::Create(m->config(), KvCacheOptions{});
    ASSERT_THAT(cache, IsOk());
    // A prefill of 9, then chunks of 1, 3 and 1 positions.
    std::vector<at::Tensor> parts;
    int64_t pos = 0;
    for (int64_t chunk : {9, 1, 1, 3, 1, 25}) {
      std::vector<int32_t> piece(ids.begin() + pos, ids.begin() + pos + chunk);
      at::Tensor h = m->Forward(m->Embed(Ids(piece)), 0, m->n_layers(), pos, &*cache, 0);
      parts.push_back(m->ExitLogits(h).squeeze(0));
      pos += chunk;
    }
    ASSERT_EQ(pos, 40);
    EXPECT_LE((at::cat(parts, 0) - full).abs().max().item<float>(), 1e-4) << path;
  }
}

// The exit at layer L is the full model, and a shallow exit differs from it.
TEST(LlamaModelTest, ExitAtLastLayerIsFullModel) {
  c10::InferenceMode guard;
  auto m = LlamaModel::RandomInit(TinyConfig(), 5, ModelOptions{}, 0.3);
  ASSERT_THAT(m, IsOk());
  const LlamaModel& model = **m;
  at::Tensor h0 = model.Embed(Ids({1, 2, 3, 4}));
  at::Tensor shallow = model.ExitLogits(model.Forward(h0, 0, 2, 0, nullptr, 0));
  at::Tensor split = model.Forward(model.Forward(h0, 0, 2, 0, nullptr, 0), 2, 4, 0, nullptr, 0);
  at::Tensor full = model.Forward(h0, 0, 4, 0, nullptr, 0);
  EXPECT_LE((model.ExitLogits(split) - model.ExitLogits(full)).abs().max().item<float>(), 1e-5);
  EXPECT_GT((shallow - model.ExitLogits(full)).abs().max().item<float>(), 1e-2);
}

// The same weights written in HF layout (rotate-half) and in llama2.c layout
// (adjacent pairs) give identical logits: covers both RoPE conventions.
TEST(LlamaModelTest, HfAndLlama2cLayoutsGiveIdenticalLogits) {
  c10::InferenceMode guard;
  for (bool tied : {true, false}) {
    auto m = LlamaModel::RandomInit(TinyConfig(tied), 11, ModelOptions{}, 0.3);
    ASSERT_THAT(m, IsOk());
    lede::testing::TempDir tmp;
    ASSERT_FALSE(tmp.path().empty());
    const std::string dir = tmp.path().string();
    ASSERT_THAT((*m)->SaveHf(dir + "/hf"), IsOk());
    std::map<std::string, at::Tensor> t = (*m)->NamedTensors();
    const checkpoint::ModelConfig& c = (*m)->config();
    for (int64_t i = 0; i < c.n_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".self_attn.";
      t[p + "q_proj.weight"] = loaders::PermuteRopeRows(t[p + "q_proj.weight"], c.n_heads, false);
      t[p + "k_proj.weight"] = loaders::PermuteRopeRows(t[p + "k_proj.weight"], c.n_kv_heads, false);
    }
    checkpoint::ModelConfig adjacent = c;
    adjacent.rope_style = checkpoint::RopeStyle::kAdjacentPairs;
    ASSERT_THAT(loaders::WriteLlama2cCheckpoint(dir + "/model.bin", adjacent, t), IsOk());
    auto hf = LoadOrDie(dir + "/hf");
    auto l2c = LoadOrDie(dir + "/model.bin");
    ASSERT_NE(hf, nullptr);
    ASSERT_NE(l2c, nullptr);
    std::vector<int32_t> ids = {1, 5, 9, 2, 44, 17, 30, 8};
    at::Tensor a = FullLogits(*hf, ids), b = FullLogits(*l2c, ids), ref = FullLogits(**m, ids);
    EXPECT_LE((a - b).abs().max().item<float>(), 1e-4) << "tied=" << tied;
    EXPECT_LE((a - ref).abs().max().item<float>(), 1e-4) << "tied=" << tied;
  }
}

// Llama-3 RoPE scaling changes only the low frequencies: short contexts shift little, and the model still runs.
TEST(LlamaModelTest, Llama3RopeScalingRuns) {
  c10::InferenceMode guard;
  checkpoint::ModelConfig c = TinyConfig();
  c.rope_theta = 500000.0;
  c.rope_scaling.type = checkpoint::RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.original_max_position_embeddings = 64;
  auto scaled = LlamaModel::RandomInit(c, 1, ModelOptions{}, 0.3);
  c.rope_scaling.type = checkpoint::RopeScaling::Type::kNone;
  auto plain = LlamaModel::RandomInit(c, 1, ModelOptions{}, 0.3);
  ASSERT_THAT(scaled, IsOk());
  ASSERT_THAT(plain, IsOk());
  std::vector<int32_t> ids;
  for (int i = 0; i < 80; ++i) ids.push_back(i % 48);
  at::Tensor a = FullLogits(**scaled, ids), b = FullLogits(**plain, ids);
  EXPECT_TRUE(at::isfinite(a).all().item<bool>());
  EXPECT_LE((a[0] - b[0]).abs().max().item<float>(), 1e-5);  // position 0: no rotation
  EXPECT_GT((a - b).abs().max().item<float>(), 1e-4);        // far positions differ
}

// With writable_weights the model owns its weights: updating them in place
// leaves the checkpoint's (memory-mapped, read-only) tensors untouched.
TEST(LlamaModelTest, WritableWeightsDoNotAliasTheCheckpoint) {
  auto ckpt = loaders::LoadCheckpoint(lede::testing::Stories260KDir());
  ASSERT_THAT(ckpt, IsOk());
  ModelOptions writable;
  writable.writable_weights = true;
  auto m = LlamaModel::FromCheckpoint(*ckpt, writable);
  ASSERT_THAT(m, IsOk());
  const at::Tensor before = ckpt->tensors.at("model.norm.weight").clone();
  for (at::Tensor& p : (*m)->Parameters()) p.add_(1.0f);
  EXPECT_TRUE(at::equal(ckpt->tensors.at("model.norm.weight"), before));
}

// A config that violates the architecture's constraints is refused, naming the field.
TEST(LlamaModelTest, InvalidConfigIsInvalidArgument) {
  checkpoint::ModelConfig c = TinyConfig();
  c.n_kv_heads = 3;  // does not divide n_heads = 4
  EXPECT_THAT(LlamaModel::RandomInit(c, 0, ModelOptions{}), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lede::model
