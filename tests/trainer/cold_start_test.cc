// The cold start of a policy root (trainer/cold_start.h): the artifact it
// writes decides exactly as the static (or autoregressive) controller it
// stands for, on the engine and in replay; the chooser picks the best static
// setting of its calibration requests, or autoregressive decoding when no
// setting pays; an existing serving policy is never replaced.
#include "trainer/cold_start.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/method_factory.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/decoding.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "trainer/counterfactual.h"

namespace lede::trainer {
namespace {

using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kModelDir[] = "models/lede-tiny";
constexpr int64_t kNewTokens = 40;

// A cost model on which drafting never pays: a draft costs a full step.
class ExpensiveDrafts : public model::cost::CostModel {
 public:
  std::string name() const override { return "expensive-drafts"; }
  double DraftToken(int64_t) const override { return 1.0; }
  double Verify(int64_t, int64_t n) const override { return 1.0 + 0.1 * static_cast<double>(n); }
  double Probe() const override { return 0.1; }
};

class ColdStartTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto loaded = model::LlamaModel::Load(kModelDir, model::ModelOptions{});
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    model_ = std::shared_ptr<const model::LlamaModel>(std::move(*loaded));
    model::KvCacheOptions ko;
    ko.max_draft_len = 8;
    auto engine = model::Engine::Create(model_, ko);
    ASSERT_TRUE(engine.ok());
    engine_ = std::move(*engine);
    auto path = tokenizer::FindTokenizerFile(kModelDir);
    ASSERT_TRUE(path.ok());
    auto tok = tokenizer::LoadTokenizer(*path);
    ASSERT_TRUE(tok.ok());
    for (const std::string& text : ColdStartPrompts()) {
      auto ids = (*tok)->Encode(text, true, false);
      ASSERT_TRUE(ids.ok());
      prompts_.push_back(*ids);
    }
    for (size_t i = 0; i < prompts_.size(); ++i) {
      auto t = TraceGreedyRequest(*engine_, prompts_[i], kNewTokens, 4, "p" + std::to_string(i));
      if (t.ok()) traces_.push_back(std::move(*t));
    }
    ASSERT_GE(traces_.size(), 4u);
  }
  static void TearDownTestSuite() {
    engine_.reset();
    model_.reset();
  }

  int32_t L() const { return static_cast<int32_t>(model_->n_layers()); }
  std::string Fingerprint() const { return model_->config().ArchitectureFingerprint(); }

  static std::shared_ptr<const model::LlamaModel> model_;
  static std::unique_ptr<model::Engine> engine_;
  static std::vector<std::vector<int32_t>> prompts_;
  static std::vector<ShadowTrace> traces_;
  ::lede::testing::TempDir tmp_;
};

std::shared_ptr<const model::LlamaModel> ColdStartTest::model_;
std::unique_ptr<model::Engine> ColdStartTest::engine_;
std::vector<std::vector<int32_t>> ColdStartTest::prompts_;
std::vector<ShadowTrace> ColdStartTest::traces_;

// Writes `choice` as the policy root's first version and loads it back as
// the services do (SERVING, fingerprint checked).
StatusOr<policy::dqn::Artifact> WriteAndLoad(const std::string& root, const ColdStartChoice& choice, int32_t n_layers,
                                             const std::string& fingerprint) {
  auto artifact = ColdStartArtifact(choice, n_layers, fingerprint, "cold-start-v1", "accelerator");
  if (!artifact.ok()) return artifact.status();
  if (Status s = WriteColdStartPolicy(root, *artifact); !s.ok()) return s;
  return policy::dqn::LoadServingArtifact(root, fingerprint);
}

TEST_F(ColdStartTest, StaticArtifactRunsTheStaticSettingOnTheEngine) {
  for (auto [e, d] : std::vector<std::pair<int32_t, int32_t>>{{2, 3}, {1, 5}, {4, 2}}) {
    ColdStartChoice c;
    c.speculate = true;
    c.exit_layer = e;
    c.draft_len = d;
    const std::string root = (tmp_.path() / ("root-" + std::to_string(e))).string();
    auto loaded = WriteAndLoad(root, c, L(), Fingerprint());
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    auto plan = policy::dqn::PlanTrainedPolicy(std::make_shared<const policy::dqn::Artifact>(*loaded), L());
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    EXPECT_EQ(plan->policy_version, "cold-start-v1");
    int64_t drafted = 0;
    for (const auto& prompt : prompts_) {
      model::GenerateOptions s;
      s.max_new_tokens = kNewTokens;
      s.mode = model::SpeculationMode::kStatic;
      s.exit_layer = e;
      s.draft_len = d;
      auto want = engine_->Generate(prompt, s);
      ASSERT_TRUE(want.ok());
      std::unique_ptr<speculation::ExitController> controller = plan->MakeController();
      model::GenerateOptions a;
      a.max_new_tokens = kNewTokens;
      a.mode = plan->mode;
      a.controller = controller.get();
      a.decision_spec = plan->decision_spec;
      auto got = engine_->Generate(prompt, a);
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(got->tokens, want->tokens);
      const auto& gr = got->stats.rounds;
      const auto& wr = want->stats.rounds;
      ASSERT_EQ(gr.size(), wr.size()) << "E=" << e << " D=" << d;
      for (size_t r = 0; r < gr.size(); ++r) {
        EXPECT_EQ(gr[r].exit_layer, wr[r].exit_layer) << "round " << r;
        EXPECT_EQ(gr[r].n_drafted, wr[r].n_drafted) << "round " << r;
        EXPECT_EQ(gr[r].n_accepted, wr[r].n_accepted) << "round " << r;
        EXPECT_EQ(gr[r].n_emitted, wr[r].n_emitted) << "round " << r;
        drafted += gr[r].n_drafted;
      }
    }
    EXPECT_GT(drafted, 0);  // it speculated (otherwise the comparison proves little)
  }
}

TEST_F(ColdStartTest, AutoregressiveArtifactNeverDrafts) {
  ColdStartChoice c;  // speculate = false
  auto loaded = WriteAndLoad((tmp_.path() / "ar").string(), c, L(), Fingerprint());
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  auto plan = policy::dqn::PlanTrainedPolicy(std::make_shared<const policy::dqn::Artifact>(*loaded), L());
  ASSERT_TRUE(plan.ok());
  std::unique_ptr<speculation::ExitController> controller = plan->MakeController();
  SimulatedMethod m;
  m.mode = speculation::SpeculationMode::kAdaptive;
  m.controller = controller.get();
  m.spec = plan->decision_spec;
  auto sim = Simulate(traces_.front(), m);
  ASSERT_TRUE(sim.ok()) << sim.status().message();
  ASSERT_FALSE(sim->stats.rounds.empty());
  for (const auto& r : sim->stats.rounds) EXPECT_EQ(r.n_drafted, 0);
}

TEST_F(ColdStartTest, ChooserPicksTheBestStaticSetting) {
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  auto choice = ChooseColdStartFromTraces(traces_, 6, *cost);
  ASSERT_TRUE(choice.ok()) << choice.status().message();
  ASSERT_TRUE(choice->speculate) << "lede-tiny is trained with an early-exit loss; some setting pays";
  EXPECT_EQ(choice->how, "self-calibration");
  EXPECT_EQ(choice->n_requests, static_cast<int64_t>(traces_.size()));
  EXPECT_GT(choice->n_tokens, 0);
  // No other setting beats it, and the one it names has the speed-up it reports.
  for (int32_t e = 1; e < L(); ++e) {
    for (int32_t d = 1; d <= 6; ++d) {
      SimulatedMethod m;
      m.mode = speculation::SpeculationMode::kStatic;
      m.exit_layer = e;
      m.draft_len = d;
      auto rounds = SimulatedRounds(traces_, m);
      ASSERT_TRUE(rounds.ok());
      const double s = cost->PredictedSpeedup(*rounds);
      EXPECT_LE(s, choice->speedup + 1e-12) << "E=" << e << " D=" << d;
      if (e == choice->exit_layer && d == choice->draft_len) {
        EXPECT_DOUBLE_EQ(s, choice->speedup);
      }
    }
  }
  EXPECT_GT(choice->speedup, 1.0 + kMinColdStartGain);
}

TEST_F(ColdStartTest, ChooserFallsBackToAutoregressiveWhenNoSettingPays) {
  ExpensiveDrafts cost;
  auto choice = ChooseColdStartFromTraces(traces_, 6, cost);
  ASSERT_TRUE(choice.ok());
  EXPECT_FALSE(choice->speculate);
  EXPECT_EQ(choice->Describe(), "autoregressive");
  EXPECT_DOUBLE_EQ(choice->speedup, 1.0);
}

TEST_F(ColdStartTest, SelfCalibrationOnTheEngineMatchesTheTraces) {
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  auto live = ChooseColdStart(*engine_, prompts_, kNewTokens, 6, *cost);
  auto replayed = ChooseColdStartFromTraces(traces_, 6, *cost);
  ASSERT_TRUE(live.ok() && replayed.ok());
  EXPECT_EQ(live->Describe(), replayed->Describe());
  EXPECT_DOUBLE_EQ(live->speedup, replayed->speedup);
}

// Out of time after the first prompt, the calibration chooses from that
// prompt's trace alone (as the replay of that one trace does); the time
// check is never asked before a first trace exists.
TEST_F(ColdStartTest, OutOfTimeStopsAfterTheFirstTrace) {
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  int asked = 0;
  auto quick = ChooseColdStart(*engine_, prompts_, kNewTokens, 6, *cost, [&] {
    ++asked;
    return true;
  });
  ASSERT_TRUE(quick.ok()) << quick.status();
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(quick->n_requests, 1);
  auto first = ChooseColdStartFromTraces({traces_.front()}, 6, *cost);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(quick->Describe(), first->Describe());
  EXPECT_EQ(quick->n_tokens, first->n_tokens);
}

TEST_F(ColdStartTest, DefaultGuessIsAQuarterOfTheDepth) {
  EXPECT_EQ(DefaultColdStart(16).Describe(), "E=4 D=3");
  EXPECT_EQ(DefaultColdStart(2).Describe(), "E=1 D=3");
  EXPECT_EQ(DefaultColdStart(2).how, "default");
}

TEST_F(ColdStartTest, AnExistingServingPolicyIsNeverReplaced) {
  const std::string root = (tmp_.path() / "root").string();
  ColdStartChoice c = DefaultColdStart(L());
  ASSERT_TRUE(WriteAndLoad(root, c, L(), Fingerprint()).ok());
  auto other = ColdStartArtifact(c, L(), Fingerprint(), "cold-start-v2", "accelerator");
  ASSERT_TRUE(other.ok());
  EXPECT_THAT(WriteColdStartPolicy(root, *other), StatusIs(StatusCode::kAlreadyExists, HasSubstr("cold-start-v1")));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(root) / "cold-start-v2"));
  auto serving = policy::dqn::ResolveServingVersion(root);
  ASSERT_TRUE(serving.ok());
  EXPECT_EQ(*serving, "cold-start-v1");
}

TEST_F(ColdStartTest, SettingsOutsideTheModelAreRefused) {
  ColdStartChoice c;
  c.speculate = true;
  c.exit_layer = L();  // the full model cannot draft for itself
  c.draft_len = 3;
  EXPECT_THAT(ColdStartArtifact(c, L(), Fingerprint(), "v1", "accelerator").status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("outside")));
  c.exit_layer = 1;
  c.draft_len = 0;
  EXPECT_THAT(ColdStartArtifact(c, L(), Fingerprint(), "v1", "accelerator").status(),
              StatusIs(StatusCode::kInvalidArgument));
  c.draft_len = 2;
  EXPECT_THAT(ColdStartArtifact(c, L(), Fingerprint(), "../x", "accelerator").status(),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ChooseColdStartFromTraces({}, 6, *model::cost::MakeAcceleratorCostModel(model_->config())).status(),
              StatusIs(StatusCode::kInvalidArgument));
}

// Llama-3.2-1B's shape (scripts/make_llama32_1b_smoke.py).
checkpoint::ModelConfig Llama32OneB() {
  checkpoint::ModelConfig c;
  c.dim = 2048;
  c.hidden_dim = 8192;
  c.n_layers = 16;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.vocab_size = 128256;
  c.max_seq_len = 131072;
  c.tie_word_embeddings = true;
  return c;
}

TEST(ColdStartSizingTest, WeightsPerTokenCountsTheBlocksAndTheHead) {
  // The smoke checkpoint has 1,235,814,400 parameters: these plus the
  // 33 norm vectors of 2,048 (the LM head is the tied embedding, counted once).
  EXPECT_EQ(WeightsPerToken(Llama32OneB()), 1235814400 - 33 * 2048);
}

TEST_F(ColdStartTest, SizingGivesASmallModelEveryPromptAtFullLength) {
  const ColdStartSizing s = SizeColdStart(WeightsPerToken(model_->config()), L(), 6, 48);
  EXPECT_EQ(s.n_prompts, 6);
  EXPECT_EQ(s.new_tokens, 48);
  EXPECT_TRUE(s.exit_layers.empty()) << "every exit layer is tried";
}

TEST_F(ColdStartTest, TracingOnlyTheCandidateExitsKeepsTheirProbes) {
  const std::vector<int32_t> exits = {2, 5};
  auto part = TraceGreedyRequest(*engine_, prompts_[0], kNewTokens, 4, "part", exits);
  ASSERT_TRUE(part.ok()) << part.status().message();
  const ShadowTrace& full = traces_[0];
  ASSERT_EQ(part->target, full.target);
  ASSERT_EQ(part->probes.size(), full.probes.size());
  for (int32_t l = 1; l <= L(); ++l) {
    const bool kept = l == L() || l == 2 || l == 5;
    for (size_t t = 0; t < full.target.size(); ++t) {
      if (kept) {
        EXPECT_EQ(part->probes[l - 1][t].top1, full.probes[l - 1][t].top1) << "layer " << l << " t " << t;
        EXPECT_NEAR(part->probes[l - 1][t].margin, full.probes[l - 1][t].margin, 1e-4);
      } else {
        EXPECT_EQ(part->probes[l - 1][t].top1, -1) << "layer " << l << " is not traced";
        EXPECT_FALSE(part->Accepts(l, static_cast<int64_t>(t)));
      }
    }
  }
}

TEST_F(ColdStartTest, ChooserTriesOnlyTheCandidateExits) {
  const std::vector<int32_t> exits = {3, 6};
  auto all = ChooseColdStartFromTraces(traces_, 6, *model::cost::MakeAcceleratorCostModel(model_->config()));
  auto some = ChooseColdStartFromTraces(traces_, 6, *model::cost::MakeAcceleratorCostModel(model_->config()), exits);
  ASSERT_TRUE(all.ok());
  ASSERT_TRUE(some.ok());
  if (some->speculate) {
    EXPECT_THAT(exits, ::testing::Contains(some->exit_layer));
    EXPECT_LE(some->speedup, all->speedup);
  }
  auto on_engine = ChooseColdStart(*engine_, {prompts_[0], prompts_[1]}, kNewTokens, 6,
                                   *model::cost::MakeAcceleratorCostModel(model_->config()), nullptr, exits);
  ASSERT_TRUE(on_engine.ok()) << on_engine.status().message();
  if (on_engine->speculate) {
    EXPECT_THAT(exits, ::testing::Contains(on_engine->exit_layer));
  }
}

TEST(ColdStartSizingTest, ALargeModelGetsTwoShortPrompts) {
  const ColdStartSizing s = SizeColdStart(WeightsPerToken(Llama32OneB()), 16, 6, 48);
  EXPECT_EQ(s.n_prompts, 2);
  EXPECT_EQ(s.exit_layers, (std::vector<int32_t>{2, 4, 6, 8}));
  EXPECT_EQ(s.new_tokens, kMinColdStartTokensPerPrompt);
  EXPECT_LE(static_cast<double>(s.n_prompts * s.new_tokens) * WeightsPerToken(Llama32OneB()),
            kColdStartWeightTokens);
}

TEST(ColdStartSizingTest, WorkShrinksAsTheModelGrowsDownToTheFloor) {
  int64_t previous = 6 * 48;
  for (int64_t w = 1000000; w <= 100000000000; w *= 2) {
    const ColdStartSizing s = SizeColdStart(w, 12, 6, 48);
    const int64_t total = s.n_prompts * s.new_tokens;
    EXPECT_LE(total, previous) << "weights per token " << w;
    EXPECT_GE(total, kMinColdStartTokens) << "weights per token " << w;
    EXPECT_GE(s.n_prompts, 2);
    EXPECT_LE(s.n_prompts, 6);
    EXPECT_GE(s.new_tokens, kMinColdStartTokensPerPrompt);
    EXPECT_LE(s.new_tokens, 48);
    // Within the work budget unless the floor binds.
    if (total < 6 * 48) {
      EXPECT_EQ(s.exit_layers, (std::vector<int32_t>{2, 3, 5, 6})) << "round(12 i / 8), i = 1..4";
    }
    if (total > kMinColdStartTokens) {
      EXPECT_LE(static_cast<double>(total) * w, kColdStartWeightTokens);
    }
    previous = total;
  }
}

TEST(ColdStartSizingTest, TheCapsBindOnEveryModel) {
  EXPECT_EQ(SizeColdStart(1000, 12, 1, 48).n_prompts, 1);
  EXPECT_EQ(SizeColdStart(1000, 12, 1, 48).new_tokens, 48);
  EXPECT_EQ(SizeColdStart(1000000000000, 12, 1, 8).n_prompts, 1);
  EXPECT_EQ(SizeColdStart(1000000000000, 12, 1, 8).new_tokens, 8);
  // Two layers: the one exit there is.
  EXPECT_EQ(SizeColdStart(1000000000000, 2, 6, 48).exit_layers, (std::vector<int32_t>{1}));
  const ColdStartSizing bad = SizeColdStart(0, 0, 0, 0);
  EXPECT_EQ(bad.n_prompts, 1);
  EXPECT_EQ(bad.new_tokens, 1);
}

}  // namespace
}  // namespace lede::trainer
