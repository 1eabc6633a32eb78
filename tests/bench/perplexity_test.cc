// Tests of bench/perplexity.h: the sliding-window perplexity on the cached
// fused path against a model whose perplexity is known (a zero LM head:
// uniform logits, perplexity = V at every weight format) and against an
// eager cache-free computation written from the window rule directly (the
// window that scores target i is the first whose end passes i).
#include "bench/perplexity.h"

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/model/llama.h"
#include "tests/testing/status_matchers.h"

namespace lede::bench {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

// A 3-layer GQA model, context 64, vocabulary 40 (dims multiples of 32 so
// that every weight format packs every matrix).
checkpoint::ModelConfig SmallConfig() {
  checkpoint::ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 128;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 40;
  c.max_seq_len = 64;
  c.tie_word_embeddings = false;
  c.eos_ids = {};
  return c;
}

// Random weights (seeded, a large init so the logits are far from uniform),
// rebuilt from their tensors with `weights` storage; with zero_head the LM
// head is all zeros (every logit 0).
std::unique_ptr<model::LlamaModel> MakeModel(model::loaders::WeightFormat weights, bool zero_head) {
  auto random = model::LlamaModel::RandomInit(SmallConfig(), /*seed=*/11, model::ModelOptions{}, 0.3);
  EXPECT_THAT(random, IsOk());
  model::loaders::Checkpoint ckpt;
  ckpt.config = SmallConfig();
  for (auto& [name, t] : (*random)->NamedTensors()) ckpt.tensors[name] = t.detach().clone();
  if (zero_head) ckpt.tensors.at("lm_head.weight").zero_();
  model::ModelOptions options;
  options.weights = weights;
  auto m = model::LlamaModel::FromCheckpoint(ckpt, options);
  EXPECT_THAT(m, IsOk());
  return m.ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> RandomStream(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<int32_t> s(n);
  for (auto& t : s) t = id(rng);
  return s;
}

// NLL of every target i in [1, N) computed eagerly without a KV cache: the
// window scoring i is window k = max(0, ceil((i + 1 - W) / S)) (the first
// whose end min(kS + W, N) passes i), run as one cache-free causal pass over
// stream[kS, min(kS + W, N)).
double EagerNll(const model::LlamaModel& m, const std::vector<int32_t>& stream, int64_t W, int64_t S,
                int64_t* windows) {
  c10::InferenceMode guard;
  const int64_t n = static_cast<int64_t>(stream.size());
  std::map<int64_t, at::Tensor> logp;  // window k -> log-probabilities [rows, V]
  double nll = 0.0;
  for (int64_t i = 1; i < n; ++i) {
    const int64_t k = std::max<int64_t>(0, (i + 1 - W + S - 1) / S);
    const int64_t begin = k * S, end = std::min(begin + W, n);
    EXPECT_LT(i, end);
    if (!logp.count(k)) {
      std::vector<int64_t> ids(stream.begin() + begin, stream.begin() + end);
      at::Tensor h = m.Embed(at::tensor(ids, at::kLong).view({1, -1}));
      h = m.Forward(h, 0, m.n_layers(), 0, nullptr, 0);
      logp[k] = at::log_softmax(m.ExitLogits(h).squeeze(0).to(at::kDouble), -1);
    }
    nll -= logp[k][i - 1 - begin][stream[i]].item<double>();
  }
  *windows = static_cast<int64_t>(logp.size());
  return nll;
}

TEST(PerplexityTest, UniformLogitsGiveTheVocabularySizeAtEveryWeightFormat) {
  const std::vector<int32_t> stream = RandomStream(150, 40, 1);
  for (auto format : {model::loaders::WeightFormat::kF32, model::loaders::WeightFormat::kBf16, model::loaders::WeightFormat::kQ8_0,
                      model::loaders::WeightFormat::kQ4_0, model::loaders::WeightFormat::kQ4_K_M}) {
    SCOPED_TRACE(model::loaders::WeightFormatName(format));
    auto m = MakeModel(format, /*zero_head=*/true);
    ASSERT_NE(m, nullptr);
    PerplexityOptions o;
    o.window = 32;
    o.stride = 8;
    auto r = ComputePerplexity(*m, stream, o);
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->tokens, 149);
    EXPECT_NEAR(r->perplexity, 40.0, 40.0 * 1e-9);
    EXPECT_NEAR(r->nll, 149 * std::log(40.0), 1e-6);
  }
}

TEST(PerplexityTest, CachedChunkedWindowsMatchAnEagerCacheFreePass) {
  auto m = MakeModel(model::loaders::WeightFormat::kF32, /*zero_head=*/false);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->fused());
  const std::vector<int32_t> stream = RandomStream(150, 40, 2);
  // Odd sizes: chunks that straddle the scored range, a last window shorter
  // than the others, and a stride of window - 1 (one token of overlap).
  for (auto [W, S, chunk] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {32, 12, 5}, {64, 32, 64}, {20, 19, 7}, {64, 1, 16}}) {
    SCOPED_TRACE("window " + std::to_string(W) + " stride " + std::to_string(S) + " chunk " + std::to_string(chunk));
    PerplexityOptions o;
    o.window = W;
    o.stride = S;
    o.chunk = chunk;
    auto r = ComputePerplexity(*m, stream, o);
    ASSERT_THAT(r, IsOk());
    int64_t windows = 0;
    const double reference = EagerNll(*m, stream, W, S, &windows);
    EXPECT_EQ(r->tokens, 149);
    EXPECT_EQ(r->windows, windows);
    EXPECT_NEAR(r->nll, reference, 1e-4 * std::abs(reference));
    EXPECT_NEAR(r->perplexity, std::exp(reference / 149), 1e-4 * r->perplexity);
    EXPECT_GT(r->perplexity, 1.0);
    EXPECT_LT(r->perplexity, 1e6);
  }
}

TEST(PerplexityTest, DefaultWindowIsTheContextAndStrideHalfOfIt) {
  auto m = MakeModel(model::loaders::WeightFormat::kF32, /*zero_head=*/false);
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> stream = RandomStream(150, 40, 3);
  auto r = ComputePerplexity(*m, stream, PerplexityOptions{});
  ASSERT_THAT(r, IsOk());
  int64_t windows = 0;
  const double reference = EagerNll(*m, stream, 64, 32, &windows);
  EXPECT_EQ(r->windows, windows);
  EXPECT_EQ(r->windows, 4);  // begins 0, 32, 64, 96 (the last reaches 150)
  EXPECT_NEAR(r->nll, reference, 1e-4 * std::abs(reference));
}

TEST(PerplexityTest, MaxTokensScoresAPrefixOfTheStream) {
  auto m = MakeModel(model::loaders::WeightFormat::kF32, /*zero_head=*/false);
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> stream = RandomStream(150, 40, 4);
  PerplexityOptions o;
  o.window = 32;
  o.max_tokens = 40;
  auto capped = ComputePerplexity(*m, stream, o);
  o.max_tokens = 0;
  auto prefix = ComputePerplexity(*m, std::vector<int32_t>(stream.begin(), stream.begin() + 41), o);
  ASSERT_THAT(capped, IsOk());
  ASSERT_THAT(prefix, IsOk());
  EXPECT_EQ(capped->tokens, 40);
  EXPECT_DOUBLE_EQ(capped->nll, prefix->nll);
}

TEST(PerplexityTest, QuantizedFormatsStayNearFloat32) {
  // Not a quality claim (random weights): the quantized path computes the
  // same model, so its perplexity is near f32's, never another model's.
  const std::vector<int32_t> stream = RandomStream(150, 40, 5);
  auto f32 = MakeModel(model::loaders::WeightFormat::kF32, false);
  ASSERT_NE(f32, nullptr);
  auto base = ComputePerplexity(*f32, stream, PerplexityOptions{});
  ASSERT_THAT(base, IsOk());
  for (auto format : {model::loaders::WeightFormat::kBf16, model::loaders::WeightFormat::kQ8_0, model::loaders::WeightFormat::kQ4_K_M}) {
    SCOPED_TRACE(model::loaders::WeightFormatName(format));
    auto m = MakeModel(format, false);
    ASSERT_NE(m, nullptr);
    auto r = ComputePerplexity(*m, stream, PerplexityOptions{});
    ASSERT_THAT(r, IsOk());
    EXPECT_NE(r->nll, 0.0);
    EXPECT_NEAR(std::log(r->perplexity), std::log(base->perplexity), 0.25 * std::log(base->perplexity));
  }
}

TEST(PerplexityTest, BadOptionsAndStreamsAreRefusedNamingTheField) {
  auto m = MakeModel(model::loaders::WeightFormat::kF32, /*zero_head=*/false);
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> stream = RandomStream(100, 40, 6);
  auto refused = [&](PerplexityOptions o, const std::vector<int32_t>& s, const std::string& field) {
    SCOPED_TRACE(field);
    EXPECT_THAT(ComputePerplexity(*m, s, o), StatusIs(StatusCode::kInvalidArgument, HasSubstr(field)));
  };
  PerplexityOptions o;
  o.window = 65;  // above the context of 64
  refused(o, stream, "window");
  o.window = 1;
  refused(o, stream, "window");
  o = PerplexityOptions{};
  o.window = 32;
  o.stride = 32;  // a window must predict a token it did not score already
  refused(o, stream, "stride");
  o.stride = -1;
  refused(o, stream, "stride");
  o = PerplexityOptions{};
  o.chunk = 0;
  refused(o, stream, "chunk");
  o = PerplexityOptions{};
  o.max_tokens = -1;
  refused(o, stream, "max_tokens");
  refused(PerplexityOptions{}, {7}, "stream");
  refused(PerplexityOptions{}, {}, "stream");
  std::vector<int32_t> bad = stream;
  bad[3] = 40;
  refused(PerplexityOptions{}, bad, "token 3");
  bad[3] = -2;
  refused(PerplexityOptions{}, bad, "token 3");
}

}  // namespace
}  // namespace lede::bench
