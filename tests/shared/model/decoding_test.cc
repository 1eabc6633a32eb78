// Tests of shared/model/decoding.h: lossless static self-speculation, stops
// inside a round, seeded sampling, and request validation.
#include "shared/model/decoding.h"

#include <cmath>
#include <random>
#include <set>

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
using testing::kStoriesPrompt;
using testing::LoadOrDie;

constexpr double kNearTie = 1e-4;  // docs/design.md §1: top-2 logits within 1e-4 in fp32

std::unique_ptr<Engine> MakeEngine(std::shared_ptr<const LlamaModel> model) {
  KvCacheOptions ko;
  ko.max_draft_len = 16;
  auto engine = Engine::Create(std::move(model), ko);
  EXPECT_THAT(engine, IsOk());
  return std::move(*engine);
}

GenerationResult MustGenerate(Engine& engine, const std::vector<int32_t>& prompt, GenerateOptions o) {
  auto r = engine.Generate(prompt, o);
  EXPECT_THAT(r, IsOk());
  return r.ok() ? *r : GenerationResult{};
}

GenerateOptions Static(int64_t e, int64_t d, int64_t n) {
  GenerateOptions o;
  o.mode = SpeculationMode::kStatic;
  o.exit_layer = e;
  o.draft_len = d;
  o.max_new_tokens = n;
  o.record_margins = true;
  return o;
}

// Checks the lossless property for every exit layer 1..L and D in
// {1, 2, 4, 8, 12}: static greedy output equals autoregressive greedy output,
// except that a divergence is allowed at a numerical near-tie (and the
// sequences are compared only up to it). Exiting at L accepts every draft.
void ExpectLossless(std::shared_ptr<const LlamaModel> model, const std::vector<int32_t>& prompt,
                    int64_t n_tokens) {
  auto engine = MakeEngine(model);
  GenerateOptions ar;
  ar.max_new_tokens = n_tokens;
  ar.record_margins = true;
  GenerationResult reference = MustGenerate(*engine, prompt, ar);
  ASSERT_EQ(static_cast<int64_t>(reference.tokens.size()), n_tokens);
  const int64_t L = model->n_layers();
  for (int64_t e = 1; e <= L; ++e) {
    for (int64_t d : {1, 2, 4, 8, 12}) {
      GenerationResult spec = MustGenerate(*engine, prompt, Static(e, d, n_tokens));
      size_t i = 0;
      while (i < spec.tokens.size() && i < reference.tokens.size() &&
             spec.tokens[i] == reference.tokens[i]) {
        ++i;
      }
      if (i < reference.tokens.size()) {
        ASSERT_LT(i, spec.tokens.size()) << "E=" << e << " D=" << d << " stopped early";
        EXPECT_LE(std::min(reference.margins[i], spec.margins[i]), kNearTie)
            << "E=" << e << " D=" << d << ": divergence at token " << i
            << " is not a numerical near-tie";
      } else {
        EXPECT_EQ(spec.tokens.size(), reference.tokens.size());
      }
      EXPECT_GT(spec.stats.n_drafted, 0);
      if (e == L) {
        EXPECT_EQ(spec.stats.n_accepted, spec.stats.n_drafted) << "D=" << d;
      }
    }
  }
}

// Lossless on stories260K (llama2.c layout, GQA).
TEST(EngineTest, StaticSpeculationIsLosslessOnStories260K) {
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::Stories260KDir());
  ASSERT_NE(m, nullptr);
  ExpectLossless(m, kStoriesPrompt, 48);
}

// The same on the eager reference kernels (every lossless test
// passes on both paths; the tests above run the default, fused).
TEST(EngineTest, StaticSpeculationIsLosslessOnStories260KEager) {
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::Stories260KDir(), Kernels::kEager);
  ASSERT_NE(m, nullptr);
  ASSERT_FALSE(m->fused());
  ExpectLossless(m, kStoriesPrompt, 48);
}

TEST(EngineTest, StaticSpeculationIsLosslessOnBabyLlamaEager) {
  std::shared_ptr<const LlamaModel> m =
      LoadOrDie(lede::testing::BabyLlamaDir() + "/model5000.bin", Kernels::kEager);
  ASSERT_NE(m, nullptr);
  ExpectLossless(m, testing::kBabyPrompt, 48);
}

// Lossless at the bf16 and q8_0 weight formats on both paths:
// speculation against autoregressive decoding at the same precision.
TEST(EngineTest, StaticSpeculationIsLosslessOnBabyLlamaAtEachWeightFormat) {
  for (loaders::WeightFormat f : {loaders::WeightFormat::kBf16, loaders::WeightFormat::kQ8_0}) {
    for (Kernels k : {Kernels::kFused, Kernels::kEager}) {
      ModelOptions o;
      o.kernels = k;
      o.weights = f;
      auto m = LlamaModel::Load(lede::testing::BabyLlamaDir() + "/model5000.bin", o);
      ASSERT_TRUE(m.ok()) << m.status();
      ASSERT_EQ((*m)->weight_format(), f);
      SCOPED_TRACE(std::string(loaders::WeightFormatName(f)) + " " + KernelsName(k));
      ExpectLossless(std::shared_ptr<const LlamaModel>(std::move(*m)), testing::kBabyPrompt, 48);
    }
  }
}

// Lossless on babyllama (vocabulary 105).
TEST(EngineTest, StaticSpeculationIsLosslessOnBabyLlama) {
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::BabyLlamaDir() + "/model5000.bin");
  ASSERT_NE(m, nullptr);
  ExpectLossless(m, testing::kBabyPrompt, 48);
}

// Lossless on a tiny random checkpoint written in Hugging Face layout.
TEST(EngineTest, StaticSpeculationIsLosslessOnRandomHfCheckpoint) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  std::shared_ptr<const LlamaModel> m = testing::WriteAndLoadTinyHf((tmp.path() / "tiny").string());
  ASSERT_NE(m, nullptr);
  ExpectLossless(m, {1, 7, 3, 9}, 40);
}

// The same random checkpoint with a tied head at bf16 and q8_0 (every
// matrix takes q8_0 here: d = 32, hidden 64; the tied LM head and the
// embedding are one quantized matrix).
TEST(EngineTest, StaticSpeculationIsLosslessOnTiedRandomCheckpointAtEachWeightFormat) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = (tmp.path() / "tiny").string();
  ASSERT_NE(testing::WriteAndLoadTinyHf(dir, /*tied=*/true), nullptr);
  for (loaders::WeightFormat f : {loaders::WeightFormat::kBf16, loaders::WeightFormat::kQ8_0}) {
    ModelOptions o;
    o.weights = f;
    auto m = LlamaModel::Load(dir, o);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_EQ((*m)->weight_format(), f);
    SCOPED_TRACE(loaders::WeightFormatName(f));
    ExpectLossless(std::shared_ptr<const LlamaModel>(std::move(*m)), {1, 7, 3, 9}, 40);
  }
}

// max_new_tokens that falls inside a round stops exactly there.
TEST(EngineTest, MaxNewTokensInsideARoundStopsExactly) {
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::Stories260KDir());
  auto engine = MakeEngine(m);
  GenerateOptions ar;
  ar.max_new_tokens = 30;
  GenerationResult full = MustGenerate(*engine, kStoriesPrompt, ar);
  for (int64_t n : {1, 2, 5, 9, 13}) {
    GenerationResult r = MustGenerate(*engine, kStoriesPrompt, Static(5, 8, n));
    ASSERT_EQ(static_cast<int64_t>(r.tokens.size()), n);
    EXPECT_EQ(r.finish, FinishReason::kLength);
    EXPECT_TRUE(std::equal(r.tokens.begin(), r.tokens.end(), full.tokens.begin())) << "n=" << n;
  }
}

// An EOS token produced inside a round ends the generation right before it,
// for autoregressive and speculative decoding alike.
TEST(EngineTest, EosInsideARoundStopsExactly) {
  auto ckpt = loaders::LoadCheckpoint(lede::testing::Stories260KDir());
  ASSERT_THAT(ckpt, IsOk());
  std::shared_ptr<const LlamaModel> plain = std::move(*LlamaModel::FromCheckpoint(*ckpt, {}));
  auto engine = MakeEngine(plain);
  GenerateOptions ar;
  ar.max_new_tokens = 20;
  GenerationResult full = MustGenerate(*engine, kStoriesPrompt, ar);
  const int32_t stop = full.tokens[7];
  const size_t first = std::find(full.tokens.begin(), full.tokens.end(), stop) - full.tokens.begin();
  ckpt->config.eos_ids = {stop};
  std::shared_ptr<const LlamaModel> with_eos = std::move(*LlamaModel::FromCheckpoint(*ckpt, {}));
  auto engine2 = MakeEngine(with_eos);
  for (GenerateOptions o : {ar, Static(5, 8, 20), Static(2, 4, 20)}) {
    GenerationResult r = MustGenerate(*engine2, kStoriesPrompt, o);
    EXPECT_EQ(r.finish, FinishReason::kEos);
    // The step that generated the EOS counts it: autoregressive decoding is one token per round.
    if (o.mode == SpeculationMode::kAutoregressive) {
      EXPECT_DOUBLE_EQ(r.stats.tokens_per_round(), 1.0);
    }
    EXPECT_EQ(r.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + first));
  }
}

// Sampling with a fixed seed is reproducible, and a different seed changes the output.
TEST(EngineTest, SeededSamplingIsReproducible) {
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::Stories260KDir());
  auto engine = MakeEngine(m);
  for (GenerateOptions o : {GenerateOptions{}, Static(2, 4, 0)}) {
    o.max_new_tokens = 40;
    o.sampling.temperature = 1.0;
    o.sampling.top_p = 0.9;
    o.sampling.seed = 1234;
    GenerationResult a = MustGenerate(*engine, kStoriesPrompt, o);
    GenerationResult b = MustGenerate(*engine, kStoriesPrompt, o);
    o.sampling.seed = 99;
    GenerationResult c = MustGenerate(*engine, kStoriesPrompt, o);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_NE(a.tokens, c.tokens);
  }
}

// Speculative sampling keeps the verifier's distribution. Each run samples
// t0 from the prefill and then t1 through a speculation round drafted at
// layer 1 (acceptance well below 1, so corrections are exercised). Given t0,
// t1 must follow the full model's p(. | prompt, t0); we sum those exact
// probabilities over the runs into expected counts and apply a chi-square
// goodness-of-fit test (categories with expected count >= 5, the rest pooled)
// at significance 0.001 (critical value by the Wilson-Hilferty approximation).
TEST(EngineTest, SpeculativeSamplingMatchesVerifierDistribution) {
  c10::InferenceMode guard;
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::Stories260KDir());
  auto engine = MakeEngine(m);
  const int kRuns = 400;
  const std::vector<int32_t> prompt = {1, 403, 407};
  const int64_t V = m->config().vocab_size;
  std::vector<double> expected(V, 0.0), observed(V, 0.0);
  int64_t drafted = 0, accepted = 0;
  for (int seed = 0; seed < kRuns; ++seed) {
    GenerateOptions s = Static(1, 1, 3);
    s.stop_at_eos = false;
    s.sampling.temperature = 1.0;
    s.sampling.seed = seed;
    GenerationResult r = MustGenerate(*engine, prompt, s);
    ASSERT_EQ(r.tokens.size(), 3u);
    drafted += r.stats.n_drafted;
    accepted += r.stats.n_accepted;
    std::vector<int64_t> ids(prompt.begin(), prompt.end());
    ids.push_back(r.tokens[0]);
    at::Tensor h = m->Forward(m->Embed(at::tensor(ids, at::kLong).view({1, -1})), 0, m->n_layers(), 0, nullptr, 0);
    at::Tensor p = at::softmax(m->ExitLogits(h)[0][ids.size() - 1], -1);
    auto acc = p.accessor<float, 1>();
    for (int64_t k = 0; k < V; ++k) expected[k] += acc[k];
    observed[r.tokens[1]] += 1;
  }
  ASSERT_GT(drafted, 0);
  EXPECT_LT(accepted, drafted);  // corrections were sampled from the residual
  double chi2 = 0.0, pooled_e = 0.0, pooled_o = 0.0;
  int categories = 0;
  for (int64_t k = 0; k < V; ++k) {
    if (expected[k] >= 5.0) {
      chi2 += (observed[k] - expected[k]) * (observed[k] - expected[k]) / expected[k];
      ++categories;
    } else {
      pooled_e += expected[k];
      pooled_o += observed[k];
    }
  }
  if (pooled_e > 0) {
    chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++categories;
  }
  const double df = categories - 1;
  ASSERT_GE(df, 1);
  const double z = 3.09;  // one-sided 0.001 quantile of N(0, 1)
  const double critical = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  EXPECT_LT(chi2, critical) << "df=" << df;
}

// Bad requests give kInvalidArgument and leave the engine usable.
TEST(EngineTest, BadRequestsAreInvalidArgument) {
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::Stories260KDir());
  auto engine = MakeEngine(m);
  GenerateOptions ok;
  ok.max_new_tokens = 4;
  EXPECT_THAT(engine->Generate({}, ok), StatusIs(StatusCode::kInvalidArgument));
  std::vector<int32_t> too_long(600, 5);
  EXPECT_THAT(engine->Generate(too_long, ok), StatusIs(StatusCode::kInvalidArgument));
  GenerateOptions near_window = ok;
  near_window.max_new_tokens = 510;  // 5 prompt tokens + 510 > 512
  EXPECT_THAT(engine->Generate(kStoriesPrompt, near_window), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(engine->Generate({1, 9999}, ok), StatusIs(StatusCode::kInvalidArgument));
  for (int64_t e : {0, 6, -1}) {
    EXPECT_THAT(engine->Generate(kStoriesPrompt, Static(e, 2, 4)), StatusIs(StatusCode::kInvalidArgument));
  }
  EXPECT_THAT(engine->Generate(kStoriesPrompt, Static(2, 0, 4)), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(engine->Generate(kStoriesPrompt, Static(2, 17, 4)), StatusIs(StatusCode::kInvalidArgument));
  GenerateOptions bad = ok;
  bad.max_new_tokens = 0;
  EXPECT_THAT(engine->Generate(kStoriesPrompt, bad), StatusIs(StatusCode::kInvalidArgument));
  bad = ok;
  bad.sampling.temperature = -1;
  EXPECT_THAT(engine->Generate(kStoriesPrompt, bad), StatusIs(StatusCode::kInvalidArgument));
  bad = ok;
  bad.sampling.top_p = 0;
  EXPECT_THAT(engine->Generate(kStoriesPrompt, bad), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(engine->Generate(kStoriesPrompt, ok), IsOk());
}

// The token callback sees exactly the generated tokens, in order.
TEST(EngineTest, CallbackStreamsEveryToken) {
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::Stories260KDir());
  auto engine = MakeEngine(m);
  std::vector<int32_t> streamed;
  auto r = engine->Generate(kStoriesPrompt, Static(2, 3, 25),
                            [&](const std::vector<int32_t>& t) { streamed.insert(streamed.end(), t.begin(), t.end()); });
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(streamed, r->tokens);
  EXPECT_FALSE(r->stats.rounds.empty());
}

}  // namespace
}  // namespace lede::model

namespace lede::model {
namespace {

// Scripted controllers for the adaptive loop (the real ones live in policy/).
class FixedController : public speculation::ExitController {
 public:
  FixedController(int32_t e, int32_t d) : e_(e), d_(d) {}
  std::string name() const override { return "fixed"; }
  speculation::Action Decide(const speculation::ExitState& s) override {
    if (s.phase == speculation::Phase::kRoundStart) return speculation::Action::kExit;
    if (s.phase == speculation::Phase::kExitLayer) return s.layer >= e_ ? speculation::Action::kExit : speculation::Action::kContinue;
    return s.draft_pos < d_ ? speculation::Action::kExit : speculation::Action::kContinue;
  }

 private:
  int32_t e_, d_;
};

class RandomController : public speculation::ExitController {
 public:
  explicit RandomController(uint64_t seed) : rng_(seed) {}
  std::string name() const override { return "random"; }
  speculation::Action Decide(const speculation::ExitState&) override {
    return std::uniform_int_distribution<int>(0, 1)(rng_) ? speculation::Action::kExit : speculation::Action::kContinue;
  }

 private:
  std::mt19937_64 rng_;
};

GenerateOptions Adaptive(speculation::ExitController* controller, std::vector<int32_t> candidates, int64_t n) {
  GenerateOptions o;
  o.mode = SpeculationMode::kAdaptive;
  o.controller = controller;
  o.decision_spec.candidate_layers = std::move(candidates);
  o.decision_spec.max_draft_len = 8;
  o.max_new_tokens = n;
  o.record_margins = true;
  o.record_traces = true;
  return o;
}

// A controller that always exits at E and drafts D tokens reproduces static (E, D) exactly.
TEST(AdaptiveEngineTest, FixedControllerMatchesStaticMode) {
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::Stories260KDir());
  auto engine = MakeEngine(m);
  FixedController fixed(3, 4);
  GenerationResult adaptive = MustGenerate(*engine, kStoriesPrompt, Adaptive(&fixed, {1, 2, 3, 4}, 60));
  GenerationResult stat = MustGenerate(*engine, kStoriesPrompt, Static(3, 4, 60));
  EXPECT_EQ(adaptive.tokens, stat.tokens);
  EXPECT_EQ(adaptive.stats.n_drafted, stat.stats.n_drafted);
  EXPECT_EQ(adaptive.stats.n_accepted, stat.stats.n_accepted);
}

// Random exits and random stops never change the greedy output (lossless, docs/design.md §1).
TEST(AdaptiveEngineTest, RandomControllerIsLossless) {
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::Stories260KDir());
  auto engine = MakeEngine(m);
  GenerateOptions ar;
  ar.max_new_tokens = 80;
  ar.record_margins = true;
  GenerationResult reference = MustGenerate(*engine, kStoriesPrompt, ar);
  for (uint64_t seed : {1, 2, 3}) {
    RandomController random(seed);
    GenerationResult r = MustGenerate(*engine, kStoriesPrompt, Adaptive(&random, {1, 2, 3, 4}, 80));
    size_t i = 0;
    while (i < r.tokens.size() && r.tokens[i] == reference.tokens[i]) ++i;
    if (i < reference.tokens.size()) {
      EXPECT_LE(std::min(reference.margins[i], r.margins[i]), kNearTie) << "seed " << seed << " token " << i;
    }
    EXPECT_GT(r.stats.n_drafted, 0);
  }
}

// A controller that speculates but never exits turns every round into a
// full-depth step that probed every candidate layer.
TEST(AdaptiveEngineTest, NeverExitingIsAutoregressive) {
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::Stories260KDir());
  auto engine = MakeEngine(m);
  FixedController never(99, 1);
  GenerationResult r = MustGenerate(*engine, kStoriesPrompt, Adaptive(&never, {1, 3}, 30));
  GenerateOptions ar;
  ar.max_new_tokens = 30;
  EXPECT_EQ(r.tokens, MustGenerate(*engine, kStoriesPrompt, ar).tokens);
  EXPECT_EQ(r.stats.n_drafted, 0);
  ASSERT_EQ(r.stats.rounds.size(), 29u);
  for (size_t i = 0; i < r.stats.rounds.size(); ++i) {
    EXPECT_EQ(r.stats.rounds[i].n_drafted, 0);
    // The request's last token leaves no room for a draft: no decision, no probe.
    EXPECT_EQ(r.stats.rounds[i].n_probes, i + 1 < r.stats.rounds.size() ? 2 : 0) << "round " << i;
  }
}

// Traces record every decision; the drafting decisions' verdicts agree with the round's acceptance.
TEST(AdaptiveEngineTest, TracesRecordDecisionsAndVerdicts) {
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::Stories260KDir());
  auto engine = MakeEngine(m);
  RandomController random(7);
  GenerationResult r = MustGenerate(*engine, kStoriesPrompt, Adaptive(&random, {1, 2, 3, 4}, 60));
  // Every round but the request's last (no room to draft: no decision) has a trace.
  ASSERT_EQ(r.traces.size() + 1, r.stats.rounds.size());
  int64_t drafted = 0;
  for (const speculation::RoundTrace& t : r.traces) {
    ASSERT_FALSE(t.decisions.empty());
    int32_t drafting = 0, accepted = 0;
    for (const speculation::Decision& d : t.decisions) {
      EXPECT_EQ(d.state.n_layers, 5);
      EXPECT_GE(d.state.top1_prob, 0.0f);
      EXPECT_LE(d.state.top1_prob, 1.0f);
      EXPECT_GE(d.state.entropy, 0.0f);
      if (d.draft_index >= 0) {
        ++drafting;
        accepted += d.accepted ? 1 : 0;
      }
    }
    EXPECT_EQ(drafting, t.n_drafted);
    EXPECT_EQ(accepted, t.n_accepted);
    drafted += t.n_drafted;
  }
  EXPECT_EQ(drafted, r.stats.n_drafted);
}

// Declining at round start makes a plain full-depth step without any probe.
TEST(AdaptiveEngineTest, DecliningAtRoundStartSkipsProbes) {
  class Decline : public speculation::ExitController {
   public:
    std::string name() const override { return "decline"; }
    speculation::Action Decide(const speculation::ExitState& s) override {
      EXPECT_EQ(s.phase, speculation::Phase::kRoundStart);  // never asked again after declining
      EXPECT_EQ(s.layer, 0);
      return speculation::Action::kContinue;
    }
  } decline;
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::Stories260KDir());
  auto engine = MakeEngine(m);
  GenerationResult r = MustGenerate(*engine, kStoriesPrompt, Adaptive(&decline, {1, 2, 3}, 20));
  GenerateOptions ar;
  ar.max_new_tokens = 20;
  EXPECT_EQ(r.tokens, MustGenerate(*engine, kStoriesPrompt, ar).tokens);
  for (const RoundRecord& round : r.stats.rounds) EXPECT_EQ(round.n_probes, 0);
  EXPECT_EQ(r.traces.size(), 18u);  // one gate decision per round but the last
}

// Adaptive requests without a controller or with bad candidate layers are refused.
TEST(AdaptiveEngineTest, BadDecisionSpecIsInvalidArgument) {
  std::shared_ptr<const LlamaModel> m = LoadOrDie(lede::testing::Stories260KDir());
  auto engine = MakeEngine(m);
  FixedController fixed(1, 1);
  EXPECT_THAT(engine->Generate(kStoriesPrompt, Adaptive(nullptr, {1}, 4)), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(engine->Generate(kStoriesPrompt, Adaptive(&fixed, {}, 4)), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(engine->Generate(kStoriesPrompt, Adaptive(&fixed, {2, 1}, 4)), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(engine->Generate(kStoriesPrompt, Adaptive(&fixed, {1, 9}, 4)), StatusIs(StatusCode::kInvalidArgument));
  GenerateOptions too_long = Adaptive(&fixed, {1}, 4);
  too_long.decision_spec.max_draft_len = 99;
  EXPECT_THAT(engine->Generate(kStoriesPrompt, too_long), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lede::model
