// Shadow traces and the counterfactual replay (trainer/counterfactual.h):
// a replayed greedy request makes the engine's rounds and decisions, and the
// Dinkelbach rewards of a round sum to tokens - rho * cost.
#include "trainer/counterfactual.h"
#include "trainer/dinkelbach.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <ATen/ATen.h>
#include "policy/controllers.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/cost/cost_profiles.h"
#include "shared/model/decoding.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/testing/status_matchers.h"
#include "trainer/calibrated_rule.h"

namespace lede::trainer {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kModelDir[] = "models/lede-tiny";
constexpr int64_t kNewTokens = 48;

class CounterfactualTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto loaded = model::LlamaModel::Load(kModelDir, model::ModelOptions{});
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    model_ = std::move(*loaded).release();
    model::KvCacheOptions ko;
    ko.max_draft_len = 8;
    auto engine = model::Engine::Create(std::shared_ptr<const model::LlamaModel>(model_, [](auto*) {}), ko);
    ASSERT_TRUE(engine.ok());
    engine_ = engine->release();
    auto path = tokenizer::FindTokenizerFile(kModelDir);
    ASSERT_TRUE(path.ok());
    auto tok = tokenizer::LoadTokenizer(*path);
    ASSERT_TRUE(tok.ok());
    for (const char* text : {"Once upon a time, there was a little girl named Lily.",
                             "Tom and his dog went to the park. They saw",
                             "def parse(line):\n    \"\"\"Split a line into fields.\"\"\"\n"}) {
      auto ids = (*tok)->Encode(text, true, false);
      ASSERT_TRUE(ids.ok());
      prompts_->push_back(*ids);
    }
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete model_;
  }

  static std::vector<ShadowTrace> Traces() {
    std::vector<ShadowTrace> traces;
    for (size_t i = 0; i < prompts_->size(); ++i) {
      auto t = TraceGreedyRequest(*engine_, (*prompts_)[i], kNewTokens, 4, "p" + std::to_string(i));
      EXPECT_TRUE(t.ok()) << t.status().message();
      if (t.ok()) traces.push_back(std::move(*t));
    }
    return traces;
  }

  // Each prompt's sampled trace at temperature 0.8 (seed 7 + its index).
  static std::vector<ShadowTrace> SampledTraces() {
    std::vector<ShadowTrace> traces;
    for (size_t i = 0; i < prompts_->size(); ++i) {
      speculation::SamplingParams s;
      s.temperature = 0.8;
      s.seed = 7 + i;
      auto t = TraceRequest(*engine_, (*prompts_)[i], kNewTokens, 4, "s" + std::to_string(i), s);
      EXPECT_TRUE(t.ok()) << t.status().message();
      if (t.ok()) traces.push_back(std::move(*t));
    }
    return traces;
  }

  // The engine's options for an adaptive generation under `controller`,
  // recording its decisions.
  static model::GenerateOptions AdaptiveOptions(speculation::ExitController& controller,
                                                const speculation::DecisionSpec& spec) {
    model::GenerateOptions o;
    o.max_new_tokens = kNewTokens;
    o.mode = model::SpeculationMode::kAdaptive;
    o.controller = &controller;
    o.decision_spec = spec;
    o.record_traces = true;
    return o;
  }

  static void ExpectSameRounds(const std::vector<model::RoundRecord>& a, const std::vector<model::RoundRecord>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].exit_layer, b[i].exit_layer) << "round " << i;
      EXPECT_EQ(a[i].n_drafted, b[i].n_drafted) << "round " << i;
      EXPECT_EQ(a[i].n_accepted, b[i].n_accepted) << "round " << i;
      EXPECT_EQ(a[i].n_emitted, b[i].n_emitted) << "round " << i;
      EXPECT_EQ(a[i].n_probes, b[i].n_probes) << "round " << i;
      EXPECT_EQ(a[i].n_decisions, b[i].n_decisions) << "round " << i;
    }
  }

  static model::LlamaModel* model_;
  static model::Engine* engine_;
  static std::vector<std::vector<int32_t>>* prompts_;
};

model::LlamaModel* CounterfactualTest::model_ = nullptr;
model::Engine* CounterfactualTest::engine_ = nullptr;
std::vector<std::vector<int32_t>>* CounterfactualTest::prompts_ = new std::vector<std::vector<int32_t>>();

TEST_F(CounterfactualTest, ShadowTraceOfTheLastLayerIsTheGreedyTrajectory) {
  for (const ShadowTrace& t : Traces()) {
    ASSERT_EQ(t.probes.size(), static_cast<size_t>(model_->n_layers()));
    ASSERT_FALSE(t.target.empty());
    for (size_t i = 0; i < t.target.size(); ++i) {
      EXPECT_TRUE(t.Accepts(t.n_layers, static_cast<int64_t>(i))) << t.id << " position " << i;
    }
    // Shallow exits disagree somewhere (otherwise the test proves nothing).
    int64_t disagreements = 0;
    for (size_t i = 0; i < t.target.size(); ++i) disagreements += t.Accepts(1, static_cast<int64_t>(i)) ? 0 : 1;
    EXPECT_GT(disagreements, 0) << t.id;
  }
}

TEST_F(CounterfactualTest, StaticReplayMakesTheEnginesRounds) {
  const std::vector<ShadowTrace> traces = Traces();
  for (size_t i = 0; i < traces.size(); ++i) {
    for (auto [e, d] : std::vector<std::pair<int32_t, int32_t>>{{1, 4}, {2, 3}, {5, 2}}) {
      model::GenerateOptions o;
      o.max_new_tokens = kNewTokens;
      o.mode = model::SpeculationMode::kStatic;
      o.exit_layer = e;
      o.draft_len = d;
      auto real = engine_->Generate((*prompts_)[i], o);
      ASSERT_TRUE(real.ok());
      SimulatedMethod m;
      m.mode = speculation::SpeculationMode::kStatic;
      m.exit_layer = e;
      m.draft_len = d;
      m.spec.max_draft_len = 8;
      auto sim = Simulate(traces[i], m);
      ASSERT_TRUE(sim.ok()) << sim.status().message();
      EXPECT_EQ(sim->tokens, real->tokens);
      ExpectSameRounds(sim->stats.rounds, real->stats.rounds);
    }
  }
}

// Up to and including a round's first rejected draft the replay makes the
// engine's decisions on the engine's signals; after it (the documented
// approximation) only the decisions to keep drafting, never the outcome, may
// differ: acceptances, emitted tokens and the rounds' boundaries agree.
TEST_F(CounterfactualTest, AdaptiveReplayMakesTheEnginesDecisions) {
  const std::vector<ShadowTrace> traces = Traces();
  speculation::DecisionSpec spec;
  spec.candidate_layers = {1, 2, 3, 4, 6};
  spec.max_draft_len = 6;
  int64_t compared = 0, after_rejection_rounds = 0, ngram_hits = 0;
  for (size_t i = 0; i < traces.size(); ++i) {
    for (auto [lambda, tau] : std::vector<std::pair<float, float>>{{0.5f, 0.5f}, {0.8f, 0.3f}}) {
      policy::ThresholdExitController a(lambda, tau), b(lambda, tau);
      auto real = engine_->Generate((*prompts_)[i], AdaptiveOptions(a, spec));
      ASSERT_TRUE(real.ok());
      SimulatedMethod m;
      m.mode = speculation::SpeculationMode::kAdaptive;
      m.controller = &b;
      m.spec = spec;
      auto sim = Simulate(traces[i], m, /*record_traces=*/true);
      ASSERT_TRUE(sim.ok()) << sim.status().message();
      EXPECT_EQ(sim->tokens, real->tokens);
      const auto& sr = sim->stats.rounds;
      const auto& rr = real->stats.rounds;
      ASSERT_EQ(sr.size(), rr.size());
      for (size_t r = 0; r < sr.size(); ++r) {
        EXPECT_EQ(sr[r].exit_layer, rr[r].exit_layer) << "round " << r;
        EXPECT_EQ(sr[r].n_accepted, rr[r].n_accepted) << "round " << r;
        EXPECT_EQ(sr[r].n_emitted, rr[r].n_emitted) << "round " << r;
        const bool rejected = rr[r].n_drafted > rr[r].n_accepted;
        if (!rejected) {
          EXPECT_EQ(sr[r].n_drafted, rr[r].n_drafted) << "round " << r;
          EXPECT_EQ(sr[r].n_decisions, rr[r].n_decisions) << "round " << r;
        } else {
          EXPECT_GT(sr[r].n_drafted, sr[r].n_accepted) << "round " << r;
          after_rejection_rounds += sr[r].n_drafted != rr[r].n_drafted ? 1 : 0;
        }
      }
      ASSERT_EQ(sim->traces.size(), real->traces.size());
      for (size_t r = 0; r < sim->traces.size(); ++r) {
        const auto& sd = sim->traces[r].decisions;
        const auto& rd = real->traces[r].decisions;
        // Decisions before the first rejected draft, and that draft's own.
        size_t exact = 0;
        while (exact < rd.size() && exact < sd.size()) {
          const bool rejected_draft = rd[exact].draft_index >= 0 && !rd[exact].accepted;
          ++exact;
          if (rejected_draft) break;
        }
        for (size_t k = 0; k < exact; ++k) {
          ++compared;
          EXPECT_EQ(sd[k].action, rd[k].action) << "round " << r << " decision " << k;
          EXPECT_EQ(sd[k].accepted, rd[k].accepted);
          EXPECT_NEAR(sd[k].state.top1_prob, rd[k].state.top1_prob, 1e-4);
          EXPECT_NEAR(sd[k].state.entropy, rd[k].state.entropy, 1e-3);
          EXPECT_NEAR(sd[k].state.margin, rd[k].state.margin, 1e-3);
          EXPECT_NEAR(sd[k].state.trace_nll, rd[k].state.trace_nll, 1e-3);
          EXPECT_NEAR(sd[k].state.draft_conf, rd[k].state.draft_conf, 1e-4);
          EXPECT_FLOAT_EQ(sd[k].state.accept_ema, rd[k].state.accept_ema);
          EXPECT_EQ(sd[k].state.lookup_match, rd[k].state.lookup_match) << "round " << r << " decision " << k;
          EXPECT_EQ(sd[k].state.trigram_seen, rd[k].state.trigram_seen) << "round " << r << " decision " << k;
          ngram_hits += rd[k].state.lookup_match + rd[k].state.trigram_seen > 0 ? 1 : 0;
        }
      }
      // A single round replayed from its context (the rollouts' path) sees
      // the same states as the whole replay.
      const std::vector<RoundContext> contexts = RoundContexts(traces[i], *sim);
      ASSERT_EQ(contexts.size(), sim->traces.size());
      for (size_t r = 0; r < contexts.size(); ++r) {
        policy::ThresholdExitController c(lambda, tau);
        auto one = SimulateRound(traces[i], spec, c, contexts[r]);
        ASSERT_TRUE(one.ok()) << one.status().message();
        const auto& od = one->trace.decisions;
        const auto& sd = sim->traces[r].decisions;
        ASSERT_EQ(od.size(), sd.size()) << "round " << r;
        for (size_t k = 0; k < od.size(); ++k) {
          EXPECT_EQ(od[k].action, sd[k].action) << "round " << r << " decision " << k;
          EXPECT_EQ(od[k].state.lookup_match, sd[k].state.lookup_match) << "round " << r << " decision " << k;
          EXPECT_EQ(od[k].state.trigram_seen, sd[k].state.trigram_seen) << "round " << r << " decision " << k;
        }
      }
    }
  }
  EXPECT_GT(compared, 100);
  EXPECT_GT(ngram_hits, 0) << "no decision saw a context n-gram match: the n-gram checks above were vacuous";
  std::printf("compared %lld decisions; %lld rounds drafted a different number after a rejection\n",
              static_cast<long long>(compared), static_cast<long long>(after_rejection_rounds));
}

TEST_F(CounterfactualTest, DinkelbachReturnIsTokensMinusRhoTimesCost) {
  const std::vector<ShadowTrace> traces = Traces();
  // Both cost models: the measured one also prices decisions and a
  // verification that grows with K.
  model::cost::Calibration cal;
  cal.n_layers = model_->n_layers();
  for (int t = 1; t <= 16; ++t) {
    cal.block_us.push_back(150.0 + 30.0 * t);
    cal.head_us.push_back(50.0 + 20.0 * t);
  }
  cal.step_us = 2000.0;
  cal.decision_us = 15.0;
  // ... and the measured one from a round table timed in context (one line
  // per exit layer, a verification that no longer grows with K).
  model::cost::Calibration rounds = cal;
  rounds.ar_step_us = 1800.0;
  for (int64_t e = 1; e < cal.n_layers; ++e) {
    rounds.round_us.emplace_back();
    for (int k = 1; k <= 6; ++k) rounds.round_us.back().push_back(1900.0 + 40.0 * e + (150.0 + 35.0 * e) * k + 20.0 * (k % 2));
  }
  for (const int which : {0, 1, 2}) {
  auto cost = which == 0 ? model::cost::MakeAcceleratorCostModel(model_->config())
                         : model::cost::MakeMeasuredCostModel(which == 1 ? cal : rounds);
  SCOPED_TRACE(cost->name() + (which == 2 ? " (round table)" : ""));
  // Every combination of the probe flags: a decision that probes nothing
  // (phase 1 from history, phase 2 on the token just drafted) must not be
  // charged a probe, one that wastes a probe must be.
  for (const bool probe_candidates : {true, false}) {
  for (const bool lookahead_probe : {true, false}) {
  speculation::DecisionSpec spec;
  spec.candidate_layers = {2, 4};
  spec.max_draft_len = 4;
  spec.probe_candidates = probe_candidates;
  spec.lookahead_probe = lookahead_probe;
  SCOPED_TRACE("probe_candidates " + std::to_string(probe_candidates) + " lookahead_probe " +
               std::to_string(lookahead_probe));
  for (double rho : {1.0, 1.6}) {
    const experience::RewardSpec rewards = DinkelbachRewards(*cost, static_cast<int32_t>(model_->n_layers()), 4, rho);
    policy::ThresholdExitController behaviour(0.6f, 0.6f);
    policy::EpsilonGreedyController explore(behaviour, 0.3, 7);
    SimulatedMethod m;
    m.mode = speculation::SpeculationMode::kAdaptive;
    m.controller = &explore;
    m.spec = spec;
    auto sim = Simulate(traces[0], m, true);
    ASSERT_TRUE(sim.ok());
    // Every round with a token budget left for drafting has its decisions
    // (the last round of a request may have none: a plain step).
    ASSERT_GE(sim->traces.size() + 1, sim->stats.rounds.size());
    bool declined = false;
    for (size_t r = 0; r < sim->traces.size(); ++r) {
      double ret = 0;
      for (const experience::Transition& t : experience::ToTransitions(sim->traces[r], rewards, "x", "b", "f")) ret += t.reward;
      const model::RoundRecord& rec = sim->stats.rounds.at(sim->traces[r].round_index);
      declined = declined || rec.n_decisions == 1;
      EXPECT_NEAR(ret, rec.n_emitted - rho * cost->RoundCost(rec), 1e-4) << "round " << r << " rho " << rho;
    }
    EXPECT_TRUE(declined) << "exploration should decline at round start at least once";
  }
  }
  }
  }
}

// Appends one cost profile per (name, features) to `o`, each priced by
// the profile cost model of those features (model::cost::MakeProfileCostModel)
// at `n_layers`.
void AddCostProfiles(DinkelbachOptions* o, int64_t n_layers,
                     const std::vector<std::pair<std::string, speculation::CostFeatures>>& profiles) {
  for (const auto& [name, f] : profiles) {
    auto made = model::cost::MakeProfileCostModel(f, n_layers);
    ASSERT_THAT(made, IsOk()) << name;
    o->cost_profiles.push_back({name, std::shared_ptr<const model::cost::CostModel>(std::move(*made)), f});
  }
}

// The policy-iteration tests' decision spec (3 candidate layers, D_max 4,
// no probes) and a small DQN; every iteration runs (no rho tolerance).
DinkelbachOptions SmallDinkelbachOptions() {
  DinkelbachOptions o;
  o.spec.candidate_layers = {1, 2, 3};
  o.spec.max_draft_len = 4;
  o.spec.probe_candidates = false;
  o.spec.lookahead_probe = false;
  o.rho_tolerance = 0;
  o.dqn.epochs = 2;
  o.dqn.hidden = 16;
  o.dqn.heldout_fraction = 0;
  return o;
}

// Policy iteration adopts an iterate only when it beats the current policy
// on the training traces (exact replay), so the adopted sequence improves
// strictly on the best static setting, rho follows the adopted policies
// only, and the returned iterate is an adopted one when any was.
TEST_F(CounterfactualTest, DinkelbachAdoptsOnlyImprovingIterates) {
  const std::vector<ShadowTrace> traces = Traces();
  const std::vector<ShadowTrace> train(traces.begin(), traces.begin() + 2), selection(traces.begin() + 2, traces.end());
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  DinkelbachOptions o = SmallDinkelbachOptions();
  o.max_iterations = 4;
  auto result = TrainDinkelbach(train, selection, *cost, o);
  ASSERT_TRUE(result.ok()) << result.status().message();
  ASSERT_EQ(result->iterations.size(), 4u);
  double current = result->initial_train_speedup;
  bool any_adopted = false;
  for (const DinkelbachIteration& it : result->iterations) {
    SCOPED_TRACE("iteration " + std::to_string(it.iteration));
    EXPECT_EQ(it.adopted, it.train_speedup > current);
    // rho of an iteration is the last adopted policy's throughput (the
    // best static one before any).
    EXPECT_DOUBLE_EQ(it.rho, current);
    // Agreement with pi on pi's decisions: a policy that takes pi's action
    // at every one of them replays pi's rounds exactly, so a different
    // throughput means it left pi somewhere.
    for (double a : it.agreement) {
      EXPECT_GE(a, 0.0);
      EXPECT_LE(a, 1.0);
    }
    if (it.train_speedup != current) {
      EXPECT_LT(std::min({it.agreement[0], it.agreement[1], it.agreement[2]}), 1.0);
    }
    if (it.adopted) current = it.train_speedup;
    any_adopted = any_adopted || it.adopted;
  }
  const DinkelbachIteration& sel = result->iterations.at(result->selected_iteration - 1);
  if (any_adopted) {
    EXPECT_TRUE(sel.adopted);
  }
  for (const DinkelbachIteration& it : result->iterations) {
    if (it.adopted == sel.adopted) {
      EXPECT_LE(it.selection_speedup, sel.selection_speedup);
    }
  }
}

// pi_0 is the best static setting the policy can express (an exit layer
// among the candidates); the best over every exit layer is still reported.
TEST_F(CounterfactualTest, DinkelbachStartsFromTheBestStaticAtACandidateLayer) {
  const std::vector<ShadowTrace> traces = Traces();
  const std::vector<ShadowTrace> train(traces.begin(), traces.begin() + 2), selection(traces.begin() + 2, traces.end());
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  DinkelbachOptions o = SmallDinkelbachOptions();
  auto all = BestStatic(train, o.spec.max_draft_len, *cost);
  ASSERT_THAT(all, IsOk());
  // A single candidate other than the overall best's exit layer.
  const int32_t other = all->exit_layer == 1 ? 2 : 1;
  o.spec.candidate_layers = {other};
  auto only = BestStatic(train, o.spec.max_draft_len, *cost, {other});
  ASSERT_THAT(only, IsOk());
  EXPECT_EQ(only->exit_layer, other);
  EXPECT_LE(only->speedup, all->speedup);
  o.max_iterations = 1;
  auto result = TrainDinkelbach(train, selection, *cost, o);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->initial_policy,
            "static E=" + std::to_string(other) + " D=" + std::to_string(only->draft_len));
  EXPECT_DOUBLE_EQ(result->initial_train_speedup, only->speedup);
  EXPECT_DOUBLE_EQ(result->iterations.at(0).rho, only->speedup);
  EXPECT_DOUBLE_EQ(result->best_static_train_speedup, all->speedup);
  o.spec.candidate_layers = {12};  // L = 12: no exit layer below L among them
  EXPECT_THAT(TrainDinkelbach(train, selection, *cost, o),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("candidate_layers")));
}

// With loads, every trace is replayed at each load priced by the cost model
// at that load, with a rho per load; where no static setting beats
// autoregressive decoding (the accelerator roofline far past its ridge,
// where verifying K drafts costs K + 1 steps), pi_0 decodes
// autoregressively there, and the policy learned from it keeps doing so
// while it speculates alone.
TEST_F(CounterfactualTest, DinkelbachWithLoadsLearnsNotToSpeculateWhereItLoses) {
  const std::vector<ShadowTrace> traces = Traces();
  const std::vector<ShadowTrace> train(traces.begin(), traces.begin() + 2), selection(traces.begin() + 2, traces.end());
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  DinkelbachOptions o = SmallDinkelbachOptions();
  o.max_iterations = 2;
  o.conservative_margin = 0.2;
  o.dqn.epochs = 12;
  o.loads = {1, 256};
  const checkpoint::ModelConfig config = model_->config();
  o.cost_at_load = [config](int32_t load) -> StatusOr<std::unique_ptr<model::cost::CostModel>> {
    return model::cost::MakeAcceleratorCostModelAtLoad(config, load, /*ridge_tokens=*/16.0);
  };
  auto result = TrainDinkelbach(train, selection, *cost, o);
  ASSERT_THAT(result, IsOk());
  EXPECT_THAT(result->initial_policy, HasSubstr("B=256 autoregressive"));
  ASSERT_EQ(result->load_best_static.size(), 2u);
  for (const DinkelbachIteration& it : result->iterations) {
    ASSERT_EQ(it.load_rho.size(), 2u);
    ASSERT_EQ(it.load_train_speedup.size(), 2u);
    EXPECT_DOUBLE_EQ(it.train_speedup, 0.5 * (it.load_train_speedup[0] + it.load_train_speedup[1]));
  }
  const DinkelbachIteration& first = result->iterations.front();
  EXPECT_GT(first.load_rho[0], 1.0);        // static pays alone
  EXPECT_DOUBLE_EQ(first.load_rho[1], 1.0);  // autoregressive at 256
  // The selected policy, replayed at each load: it speculates alone and
  // declines to at 256 (within 1% of autoregressive there).
  auto network = std::make_shared<const policy::dqn::QNetwork>(result->dqn.network);
  const ControllerMaker greedy = [network](int64_t) -> std::unique_ptr<speculation::ExitController> {
    return std::make_unique<policy::dqn::DqnExitController>(network, "selected");
  };
  std::vector<ShadowTrace> crowded = train;
  for (ShadowTrace& t : crowded) t.load = 256;
  auto high = model::cost::MakeAcceleratorCostModelAtLoad(config, 256, 16.0);
  auto alone = SimulatedSpeedup(train, o.spec, greedy, *cost);
  auto busy = SimulatedSpeedup(crowded, o.spec, greedy, *high);
  ASSERT_THAT(alone, IsOk());
  ASSERT_THAT(busy, IsOk());
  EXPECT_GT(*alone, 1.2);
  EXPECT_GT(*busy, 0.99);
  // Bad loads are refused naming the field.
  o.loads = {1, 1};
  EXPECT_THAT(TrainDinkelbach(train, selection, *cost, o), StatusIs(StatusCode::kInvalidArgument, HasSubstr("loads")));
  o.loads = {4};
  o.cost_at_load = nullptr;
  EXPECT_THAT(TrainDinkelbach(train, selection, *cost, o), StatusIs(StatusCode::kInvalidArgument, HasSubstr("loads")));
}

// With cost profiles, every trace is replayed under each profile with its
// features in the state, priced by its cost model, a rho per profile: one
// policy learns to speculate where verification is free and to decode
// autoregressively where each verified position costs more than a step
// (where no static setting beats autoregressive decoding, pi_0 does not
// speculate). Repeated features and profiles with loads are refused.
TEST_F(CounterfactualTest, DinkelbachWithCostProfilesLearnsWhereSpeculationPays) {
  const std::vector<ShadowTrace> traces = Traces();
  const std::vector<ShadowTrace> train(traces.begin(), traces.begin() + 2), selection(traces.begin() + 2, traces.end());
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  const int64_t L = model_->config().n_layers;
  DinkelbachOptions o = SmallDinkelbachOptions();
  o.max_iterations = 2;
  o.conservative_margin = 0.2;
  o.dqn.epochs = 12;
  ASSERT_NO_FATAL_FAILURE(AddCostProfiles(&o, L, {{"free", {0.05f, 1.0f, 0.0f}}, {"dear", {0.05f, 1.0f, 1.5f}}}));
  auto result = TrainDinkelbach(train, selection, *cost, o);
  ASSERT_THAT(result, IsOk());
  EXPECT_THAT(result->initial_policy, HasSubstr("per cost profile:"));
  EXPECT_THAT(result->initial_policy, HasSubstr("dear autoregressive"));
  ASSERT_EQ(result->load_best_static.size(), 2u);
  EXPECT_THAT(result->load_best_static[0], HasSubstr("free: "));
  const DinkelbachIteration& first = result->iterations.front();
  ASSERT_EQ(first.load_rho.size(), 2u);
  EXPECT_GT(first.load_rho[0], 1.0);        // static pays where verifying is free
  EXPECT_DOUBLE_EQ(first.load_rho[1], 1.0);  // autoregressive where it is dear
  // The selected policy, replayed under each profile with its features.
  auto network = std::make_shared<const policy::dqn::QNetwork>(result->dqn.network);
  const ControllerMaker greedy = [network](int64_t) -> std::unique_ptr<speculation::ExitController> {
    return std::make_unique<policy::dqn::DqnExitController>(network, "selected");
  };
  std::vector<double> speedups;
  for (const DinkelbachOptions::CostProfile& p : o.cost_profiles) {
    std::vector<ShadowTrace> under = train;
    for (ShadowTrace& t : under) t.cost = p.features;
    auto s = SimulatedSpeedup(under, o.spec, greedy, *p.cost);
    ASSERT_THAT(s, IsOk());
    speedups.push_back(*s);
  }
  EXPECT_GT(speedups[0], 1.2);
  EXPECT_GT(speedups[1], 0.99);
  // From the calibrated rule: tuned under each profile's prices, and
  // autoregressive decoding where even the tuned rule loses.
  DinkelbachOptions ruled = o;
  ruled.initial_policy = "calibrated";
  ruled.max_iterations = 1;
  auto from_rule = TrainDinkelbach(train, selection, *cost, ruled);
  ASSERT_THAT(from_rule, IsOk());
  EXPECT_THAT(from_rule->initial_policy, HasSubstr("free calibrated"));
  EXPECT_THAT(from_rule->initial_policy, HasSubstr("dear autoregressive"));
  ASSERT_EQ(from_rule->iterations.front().load_rho.size(), 2u);
  EXPECT_DOUBLE_EQ(from_rule->iterations.front().load_rho[1], 1.0);
  // One profile is a group too: pi_0, the reports and the per-profile
  // speed-ups are its own (lede-train-counterfactual --cost-profiles with
  // one entry indexed them and crashed when they were left empty).
  DinkelbachOptions one = ruled;
  one.cost_profiles.erase(one.cost_profiles.begin());
  auto alone = TrainDinkelbach(train, selection, *cost, one);
  ASSERT_THAT(alone, IsOk());
  EXPECT_EQ(alone->initial_policy, "per cost profile: dear autoregressive");
  ASSERT_EQ(alone->load_best_static.size(), 1u);
  EXPECT_THAT(alone->load_best_static[0], HasSubstr("dear: "));
  for (const DinkelbachIteration& it : alone->iterations) {
    ASSERT_EQ(it.load_rho.size(), 1u);
    ASSERT_EQ(it.load_train_speedup.size(), 1u);
    ASSERT_EQ(it.load_selection_speedup.size(), 1u);
    EXPECT_DOUBLE_EQ(it.load_rho[0], 1.0);
    EXPECT_DOUBLE_EQ(it.train_speedup, it.load_train_speedup[0]);
  }
  // Bad profile sets are refused naming the field.
  DinkelbachOptions same = o;
  same.cost_profiles[1].features = same.cost_profiles[0].features;
  EXPECT_THAT(TrainDinkelbach(train, selection, *cost, same),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("cost_profiles")));
  DinkelbachOptions both = o;
  both.loads = {1, 2};
  both.cost_at_load = [](int32_t) -> StatusOr<std::unique_ptr<model::cost::CostModel>> {
    return InvalidArgumentError("unused");
  };
  EXPECT_THAT(TrainDinkelbach(train, selection, *cost, both),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("cost_profiles")));
}

// With cost profiles an iterate is adopted only where its mean beats the
// current policy's and no profile slows down by more than
// max_group_slowdown (0 here: none may slow down), so that one deployment
// does not pay for the others; an iterate that raised the mean but slowed
// a profile is reported as such. Tolerances outside [0, 1) are refused.
TEST_F(CounterfactualTest, DinkelbachAdoptsNoIterateThatSlowsAProfile) {
  const std::vector<ShadowTrace> traces = Traces();
  const std::vector<ShadowTrace> train(traces.begin(), traces.begin() + 2), selection(traces.begin() + 2, traces.end());
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  const int64_t L = model_->config().n_layers;
  DinkelbachOptions o = SmallDinkelbachOptions();
  o.max_iterations = 3;
  o.rho_tolerance = 0;
  o.conservative_margin = 0.2;
  o.dqn.epochs = 12;
  o.max_group_slowdown = 0;
  ASSERT_NO_FATAL_FAILURE(
      AddCostProfiles(&o, L, {{"0", {0.05f, 1.0f, 0.0f}}, {"1", {0.02f, 0.5f, 0.1f}}, {"2", {0.05f, 1.5f, 0.3f}}}));
  auto result = TrainDinkelbach(train, selection, *cost, o);
  ASSERT_THAT(result, IsOk());
  ASSERT_FALSE(result->iterations.empty());
  // pi_0's per-profile speed-ups: the rho of every profile in iteration 1.
  std::vector<double> current = result->iterations.front().load_rho;
  double current_mean = result->initial_train_speedup;
  ASSERT_EQ(current.size(), 3u);
  for (const DinkelbachIteration& it : result->iterations) {
    ASSERT_EQ(it.load_train_speedup.size(), 3u);
    bool slowed = false;
    for (size_t i = 0; i < current.size(); ++i) slowed = slowed || it.load_train_speedup[i] < current[i];
    const bool faster = it.train_speedup > current_mean;
    EXPECT_EQ(it.group_slowed, faster && slowed) << "iteration " << it.iteration;
    EXPECT_EQ(it.adopted, faster && !slowed) << "iteration " << it.iteration;
    if (!it.adopted) continue;
    current = it.load_train_speedup;
    current_mean = it.train_speedup;
  }
  // The rule itself: a higher mean is necessary, and not sufficient.
  EXPECT_TRUE(AdoptsIterate({1.20, 1.50}, {1.10, 1.50}, 0));
  EXPECT_FALSE(AdoptsIterate({1.10, 1.50}, {1.10, 1.50}, 0));        // level
  EXPECT_FALSE(AdoptsIterate({1.30, 1.46}, {1.10, 1.50}, 0.01));     // mean +0.08, the second -2.7%
  EXPECT_TRUE(AdoptsIterate({1.30, 1.46}, {1.10, 1.50}, 0.03));      // within 3%
  EXPECT_TRUE(AdoptsIterate({1.30}, {1.10}, 0));                     // one group: the mean alone
  EXPECT_FALSE(AdoptsIterate({1.30, 1.50}, {1.10}, 0.5));            // mismatched
  EXPECT_FALSE(AdoptsIterate({}, {}, 0.5));
  for (double bad : {-0.01, 1.0}) {
    o.max_group_slowdown = bad;
    EXPECT_THAT(TrainDinkelbach(train, selection, *cost, o),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("max_group_slowdown")));
  }
}

// rho_per_sampling: each cost profile's greedy and sampled traces are
// groups of their own, each starting from the best static setting on its
// own traces with that setting's speed-up as its rho; an iterate is adopted
// only where no group slows down. A profile whose traces are of one kind
// stays whole.
TEST_F(CounterfactualTest, DinkelbachRhoPerSamplingSplitsGreedyFromSampled) {
  const std::vector<ShadowTrace> greedy = Traces(), sampled = SampledTraces();
  ASSERT_GE(greedy.size(), 3u);
  ASSERT_GE(sampled.size(), 3u);
  std::vector<ShadowTrace> train(greedy.begin(), greedy.begin() + 2), selection(greedy.begin() + 2, greedy.end());
  train.insert(train.end(), sampled.begin(), sampled.begin() + 2);
  selection.insert(selection.end(), sampled.begin() + 2, sampled.end());
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  const int64_t L = model_->config().n_layers;
  DinkelbachOptions o = SmallDinkelbachOptions();
  o.max_iterations = 2;
  o.rho_per_sampling = true;
  const speculation::CostFeatures free_f{0.05f, 1.0f, 0.0f}, cheap_f{0.02f, 0.5f, 0.1f};
  ASSERT_NO_FATAL_FAILURE(AddCostProfiles(&o, L, {{"free", free_f}, {"cheap", cheap_f}}));
  auto result = TrainDinkelbach(train, selection, *cost, o);
  ASSERT_THAT(result, IsOk());
  const DinkelbachIteration& first = result->iterations.front();
  EXPECT_THAT(first.group_names, ElementsAre("free greedy", "free sampled", "cheap greedy", "cheap sampled"));
  ASSERT_EQ(first.load_rho.size(), 4u);
  ASSERT_EQ(first.load_train_speedup.size(), 4u);
  ASSERT_EQ(result->load_best_static.size(), 4u);
  // Iteration 1's rho of each group: pi_0's speed-up on that group's own
  // training traces, the best static setting at a candidate layer.
  for (size_t i = 0; i < 4; ++i) {
    const DinkelbachOptions::CostProfile& p = o.cost_profiles[i / 2];
    std::vector<ShadowTrace> kind(train.begin() + (i % 2 == 0 ? 0 : 2), train.begin() + (i % 2 == 0 ? 2 : 4));
    for (ShadowTrace& t : kind) t.cost = p.features;
    auto best = BestStatic(kind, o.spec.max_draft_len, *p.cost, o.spec.candidate_layers);
    ASSERT_THAT(best, IsOk());
    EXPECT_NEAR(first.load_rho[i], std::max(1.0, best->speedup), 1e-9) << first.group_names[i];
  }
  // The kinds' rhos are their own, where one rho would have priced both.
  EXPECT_NE(first.load_rho[0], first.load_rho[1]);
  // No adopted iterate slowed a group.
  std::vector<double> current = first.load_rho;
  for (const DinkelbachIteration& it : result->iterations) {
    if (!it.adopted) continue;
    for (size_t i = 0; i < current.size(); ++i) EXPECT_GE(it.load_train_speedup[i], current[i]) << it.iteration;
    current = it.load_train_speedup;
  }
  // Greedy traces alone: the profiles stay whole.
  DinkelbachOptions whole = o;
  whole.max_iterations = 1;
  std::vector<ShadowTrace> greedy_train(greedy.begin(), greedy.begin() + 2),
      greedy_selection(greedy.begin() + 2, greedy.end());
  auto unsplit = TrainDinkelbach(greedy_train, greedy_selection, *cost, whole);
  ASSERT_THAT(unsplit, IsOk());
  EXPECT_THAT(unsplit->iterations.front().group_names, ElementsAre("free", "cheap"));
}

// A warm start (a load-blind Q-network) is pi_0 at each load
// where it beats the static choice on the training traces, the static or
// autoregressive choice elsewhere: pi_0 is described so per load, and the
// initial speed-up is the mean over the loads of the better of the two. It
// needs the static initial policy and the training's hidden width.
TEST_F(CounterfactualTest, DinkelbachWarmStartIsPiZeroWhereItWins) {
  const std::vector<ShadowTrace> traces = Traces();
  const std::vector<ShadowTrace> train(traces.begin(), traces.begin() + 2), selection(traces.begin() + 2, traces.end());
  // A random network of the shipped policies' width, deciding where they do
  // (candidate layers 1-6, D_max 6); it never sees the load.
  auto warm = std::make_shared<const policy::dqn::QNetwork>(policy::dqn::QNetwork::Random(64, 5));
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  DinkelbachOptions o = SmallDinkelbachOptions();
  o.spec.candidate_layers = {1, 2, 3, 4, 5, 6};
  o.spec.max_draft_len = 6;
  o.dqn.hidden = warm->hidden();
  o.max_iterations = 1;
  o.loads = {1, 256};
  const checkpoint::ModelConfig config = model_->config();
  o.cost_at_load = [config](int32_t load) -> StatusOr<std::unique_ptr<model::cost::CostModel>> {
    return model::cost::MakeAcceleratorCostModelAtLoad(config, load, /*ridge_tokens=*/16.0);
  };
  o.warm_start = warm;
  const ControllerMaker warm_policy = [warm](int64_t) -> std::unique_ptr<speculation::ExitController> {
    return std::make_unique<policy::dqn::DqnExitController>(warm, "warm");
  };
  std::vector<std::string> expected;
  double mean = 0;
  for (int32_t load : o.loads) {
    std::vector<ShadowTrace> at = train;
    for (ShadowTrace& t : at) t.load = load;
    auto priced = o.cost_at_load(load);
    ASSERT_THAT(priced, IsOk());
    auto warm_speedup = SimulatedSpeedup(at, o.spec, warm_policy, **priced);
    auto fixed = BestStatic(at, o.spec.max_draft_len, **priced, o.spec.candidate_layers);
    ASSERT_THAT(warm_speedup, IsOk());
    ASSERT_THAT(fixed, IsOk());
    const bool ar = fixed->speedup < 1.0;  // autoregressive where static loses
    const double fallback = ar ? 1.0 : fixed->speedup;
    const std::string fixed_name =
        ar ? "autoregressive" : "E=" + std::to_string(fixed->exit_layer) + " D=" + std::to_string(fixed->draft_len);
    expected.push_back("B=" + std::to_string(load) + " " + (*warm_speedup > fallback ? "warm start" : fixed_name));
    mean += std::max(*warm_speedup, fallback) / 2;
  }
  auto result = TrainDinkelbach(train, selection, *cost, o);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->initial_policy, "per load: " + expected[0] + " " + expected[1]);
  EXPECT_NEAR(result->initial_train_speedup, mean, 1e-12);
  // The policy decodes autoregressively at 256 (ridge 16) on these traces.
  EXPECT_EQ(expected[1], "B=256 autoregressive");
  o.dqn.hidden = warm->hidden() / 2;
  EXPECT_THAT(TrainDinkelbach(train, selection, *cost, o),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("warm_start")));
  o.dqn.hidden = warm->hidden();
  o.loads.clear();
  o.initial_policy = "calibrated";
  EXPECT_THAT(TrainDinkelbach(train, selection, *cost, o),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("warm_start")));
}

// The calibrated rule tuned by replay is the best of its grid, and
// reproduces its own speed-up; policy iteration started from it (pi_0 =
// the rule) reports it, starts rho there and adopts only iterates that beat
// it on the training traces.
TEST_F(CounterfactualTest, CalibratedStartBeginsAtTheTunedRuleAndAdoptsOnlyWhatBeatsIt) {
  const std::vector<ShadowTrace> traces = Traces();
  const std::vector<ShadowTrace> train(traces.begin(), traces.begin() + 2), selection(traces.begin() + 2, traces.end());
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  DinkelbachOptions o = SmallDinkelbachOptions();
  auto rule = TuneCalibratedRule(train, o.spec, *cost);
  ASSERT_THAT(rule, IsOk());
  ASSERT_GE(rule->exit_layer, 1);
  ASSERT_LE(rule->exit_layer, 3);
  auto again = SimulatedSpeedup(train, o.spec, [&](int64_t) { return rule->Make(o.spec); }, *cost);
  ASSERT_THAT(again, IsOk());
  EXPECT_DOUBLE_EQ(*again, rule->speedup);
  for (int32_t e : o.spec.candidate_layers) {
    for (double rho : kCalibratedRhos) {
      CalibratedRule other = *rule;
      other.exit_layer = e;
      other.rho = rho;
      auto s = SimulatedSpeedup(train, o.spec, [&](int64_t) { return other.Make(o.spec); }, *cost);
      ASSERT_THAT(s, IsOk());
      EXPECT_LE(*s, rule->speedup) << other.Describe();
    }
  }
  o.initial_policy = "calibrated";
  o.max_iterations = 2;
  auto result = TrainDinkelbach(train, selection, *cost, o);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->initial_policy, rule->Describe());
  EXPECT_DOUBLE_EQ(result->initial_train_speedup, rule->speedup);
  ASSERT_FALSE(result->iterations.empty());
  EXPECT_DOUBLE_EQ(result->iterations[0].rho, rule->speedup);
  double current = rule->speedup;
  for (const DinkelbachIteration& it : result->iterations) {
    EXPECT_EQ(it.adopted, it.train_speedup > current) << "iteration " << it.iteration;
    if (it.adopted) current = it.train_speedup;
  }
  o.initial_policy = "best";
  EXPECT_THAT(TrainDinkelbach(train, selection, *cost, o), StatusIs(StatusCode::kInvalidArgument));
}

// pi_0 of the calibrated start is the better, on the training traces, of
// the tuned rule and the best static setting at a candidate layer, on
// greedy and on sampled traces (on sampled traces static can win: measured
// 1.678x against the rule's 1.643x on the 5x widening at q8_0).
TEST_F(CounterfactualTest, CalibratedStartIsTheBetterOfTheRuleAndStatic) {
  std::vector<ShadowTrace> greedy = Traces(), sampled = SampledTraces();
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  DinkelbachOptions o = SmallDinkelbachOptions();
  o.initial_policy = "calibrated";
  o.max_iterations = 1;
  for (const std::vector<ShadowTrace>* traces : {&greedy, &sampled}) {
    const std::vector<ShadowTrace> train(traces->begin(), traces->begin() + 2);
    const std::vector<ShadowTrace> selection(traces->begin() + 2, traces->end());
    auto rule = TuneCalibratedRule(train, o.spec, *cost);
    auto fixed = BestStatic(train, o.spec.max_draft_len, *cost, o.spec.candidate_layers);
    ASSERT_THAT(rule, IsOk());
    ASSERT_THAT(fixed, IsOk());
    auto result = TrainDinkelbach(train, selection, *cost, o);
    ASSERT_THAT(result, IsOk());
    EXPECT_DOUBLE_EQ(result->initial_train_speedup, std::max(fixed->speedup, rule->speedup));
    EXPECT_EQ(result->initial_policy, fixed->speedup > rule->speedup
                                          ? "static E=" + std::to_string(fixed->exit_layer) +
                                                " D=" + std::to_string(fixed->draft_len)
                                          : rule->Describe());
  }
}

// Candidates 1-3, D_max 6, decisions without probes (phase 1 from the
// history, phase 2 on the token just drafted), as the shipped policies run.
speculation::DecisionSpec HistoryModeSpec() {
  speculation::DecisionSpec spec;
  spec.candidate_layers = {1, 2, 3};
  spec.max_draft_len = 6;
  spec.probe_candidates = false;
  spec.lookahead_probe = false;
  return spec;
}

// Rollout targets: per decision one transition per action, centered on
// their mean; a conservative margin raises pi's own action by half of it
// and lowers the other by as much, on the very same states.
TEST_F(CounterfactualTest, RolloutTargetsAreCenteredAndPreferPiByTheMargin) {
  const std::vector<ShadowTrace> traces = Traces();
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  const speculation::DecisionSpec spec = HistoryModeSpec();
  ControllerMaker pi = [](int64_t) { return std::make_unique<policy::StaticExitController>(2, 2); };
  std::vector<ControllerMaker> sources = {
      pi, [](int64_t) { return std::make_unique<policy::ThresholdExitController>(0.5f, 0.5f); }};
  const experience::RewardSpec rewards = DinkelbachRewards(*cost, static_cast<int32_t>(model_->n_layers()), 6, 1.5);
  auto plain = RolloutTransitions(traces, spec, pi, sources, rewards, "fp", 0.0);
  auto margin = RolloutTransitions(traces, spec, pi, sources, rewards, "fp", 0.4);
  ASSERT_TRUE(plain.ok() && margin.ok());
  ASSERT_EQ(plain->size(), margin->size());
  ASSERT_GT(plain->size(), 100u);
  ASSERT_EQ(plain->size() % 2, 0u);
  int64_t pi_exits = 0, pi_continues = 0;
  for (size_t i = 0; i < plain->size(); i += 2) {
    const experience::Transition &c = (*plain)[i], &e = (*plain)[i + 1];
    ASSERT_EQ(c.action, speculation::Action::kContinue);
    ASSERT_EQ(e.action, speculation::Action::kExit);
    ASSERT_EQ(c.state, e.state);
    ASSERT_TRUE(c.done && e.done);
    EXPECT_NEAR(c.reward + e.reward, 0.0f, 1e-5f);
    // pi's own action at this state (static: a function of phase, layer and draft position).
    speculation::ExitState st;
    st.phase = c.phase;
    st.layer = c.layer;
    st.n_layers = c.n_layers;
    st.draft_pos = c.draft_pos;
    st.max_draft_len = spec.max_draft_len;
    const speculation::Action own = policy::StaticExitController(2, 2).Decide(st);
    (own == speculation::Action::kExit ? pi_exits : pi_continues)++;
    for (size_t j : {i, i + 1}) {
      const experience::Transition &p = (*plain)[j], &m = (*margin)[j];
      ASSERT_EQ(p.state, m.state);
      EXPECT_NEAR(m.reward - p.reward, p.action == own ? 0.2f : -0.2f, 1e-5f);
    }
  }
  EXPECT_GT(pi_exits, 0);
  EXPECT_GT(pi_continues, 0);
}

// Static E=2 D=2 that starts phase 1 at E (ExitController::FirstProbeLayer),
// as the calibrated rule does: the same decisions wherever it is asked.
class SkippingStatic : public policy::StaticExitController {
 public:
  SkippingStatic() : StaticExitController(2, 2) {}
  int32_t FirstProbeLayer(const speculation::ExitState&) override { return 2; }
};

// The rollout of a decision replays the behaviour's round up to it, so it
// must meet the same decision points whatever pi skips: a pi that starts
// phase 1 at its exit layer gives the very targets of one that walks every
// candidate and continues below it (history mode, free decisions). Before
// the replay followed the behaviour's first probe layer, the skipping pi's
// replay forced the behaviour's layer-1 action on its layer-2 state, and
// policy iteration from the calibrated rule collapsed (1.67x -> 1.49x).
TEST_F(CounterfactualTest, RolloutTargetsDoNotDependOnWherePiStartsPhaseOne) {
  const std::vector<ShadowTrace> traces = Traces();
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  const speculation::DecisionSpec spec = HistoryModeSpec();
  std::vector<ControllerMaker> sources = {
      [](int64_t) { return std::make_unique<policy::StaticExitController>(3, 1); },
      [](int64_t) { return std::make_unique<policy::ThresholdExitController>(0.5f, 0.5f); }};
  const experience::RewardSpec rewards = DinkelbachRewards(*cost, static_cast<int32_t>(model_->n_layers()), 6, 1.5);
  ControllerMaker walking = [](int64_t) { return std::make_unique<policy::StaticExitController>(2, 2); };
  ControllerMaker skipping = [](int64_t) { return std::make_unique<SkippingStatic>(); };
  auto want = RolloutTransitions(traces, spec, walking, sources, rewards, "fp", 0.2);
  auto got = RolloutTransitions(traces, spec, skipping, sources, rewards, "fp", 0.2);
  ASSERT_THAT(want.status(), IsOk());
  ASSERT_THAT(got.status(), IsOk());
  ASSERT_EQ(got->size(), want->size());
  int64_t below_start = 0;
  for (size_t i = 0; i < want->size(); ++i) {
    const experience::Transition &w = (*want)[i], &g = (*got)[i];
    ASSERT_EQ(g.state, w.state) << i;
    ASSERT_EQ(g.action, w.action) << i;
    EXPECT_NEAR(g.reward, w.reward, 1e-4f) << i;
    if (w.phase == speculation::Phase::kExitLayer && w.layer == 1) ++below_start;
  }
  EXPECT_GT(below_start, 0);  // the behaviours' layer-1 states, which the skipping pi never visits itself
}

TEST_F(CounterfactualTest, CounterfactualTransitionsCoverEveryBehaviour) {
  const std::vector<ShadowTrace> traces = Traces();
  auto cost = model::cost::MakeAcceleratorCostModel(model_->config());
  speculation::DecisionSpec spec;
  spec.candidate_layers = {2, 4};
  spec.max_draft_len = 4;
  std::vector<ControllerMaker> behaviours = {
      [](int64_t) { return std::make_unique<policy::ThresholdExitController>(0.5f, 0.5f); },
      [](int64_t) { return std::make_unique<policy::StaticExitController>(4, 2); }};
  auto ts = CounterfactualTransitions(traces, spec, behaviours, DinkelbachRewards(*cost, 12, 4, 1.5), "fp");
  ASSERT_TRUE(ts.ok());
  std::set<std::string> versions, requests;
  for (const experience::Transition& t : *ts) versions.insert(t.policy_version), requests.insert(t.request_id);
  EXPECT_EQ(versions.size(), 2u);
  EXPECT_EQ(requests.size(), 2 * traces.size());
  EXPECT_EQ(ts->front().reward_cost_model, "accelerator");
}

TEST_F(CounterfactualTest, BadMethodsAreRefused) {
  const std::vector<ShadowTrace> traces = Traces();
  SimulatedMethod m;
  m.mode = speculation::SpeculationMode::kStatic;
  m.exit_layer = 13;
  m.draft_len = 2;
  EXPECT_EQ(Simulate(traces[0], m).status().code(), StatusCode::kInvalidArgument);
  m.mode = speculation::SpeculationMode::kAdaptive;
  m.spec.candidate_layers = {2};
  EXPECT_EQ(Simulate(traces[0], m).status().code(), StatusCode::kInvalidArgument);  // no controller
  EXPECT_EQ(ComputeShadowTrace(*model_, {}, {5}, false, 8, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeShadowTrace(*model_, {1}, {99999}, false, 8, 4).status().code(), StatusCode::kInvalidArgument);
}


// Speculative-sampling acceptance, sum_x min(p(x), q(x)), is 1 when the
// draft distribution is the target's.
TEST(ExpectedAcceptanceTest, IsOneWhenDraftEqualsTarget) {
  const at::Tensor p = at::tensor(std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f});
  EXPECT_NEAR(ExpectedAcceptance(p, p), 1.0, 1e-6);
  const at::Tensor logits = at::tensor(std::vector<float>{0.5f, -1.0f, 2.0f, 0.25f});
  speculation::SamplingParams s;
  s.temperature = 0.8;
  s.top_p = 0.9;
  EXPECT_NEAR(ExpectedAcceptanceOfLogits(logits, logits, s), 1.0, 1e-6);
}

// A hand-built pair of 4-token distributions: p = (0.5, 0.3, 0.2, 0) against
// a uniform q gives 0.25 + 0.25 + 0.2 + 0 = 0.7.
TEST(ExpectedAcceptanceTest, MatchesTheHandComputedValue) {
  const at::Tensor p = at::tensor(std::vector<float>{0.5f, 0.3f, 0.2f, 0.0f});
  const at::Tensor q = at::tensor(std::vector<float>{0.25f, 0.25f, 0.25f, 0.25f});
  EXPECT_NEAR(ExpectedAcceptance(p, q), 0.7, 1e-6);
  EXPECT_NEAR(ExpectedAcceptance(q, p), 0.7, 1e-6);  // symmetric
}

// The sampling transform applies to both sides: top_p 0.8 keeps (0.5, 0.3) of
// p = (0.5, 0.3, 0.15, 0.05), renormalized to (0.625, 0.375, 0, 0), and all
// of a uniform q (mass before its last token is 0.75 < 0.8): 0.25 + 0.25.
TEST(ExpectedAcceptanceTest, WarpsBothDistributionsLikeTheEngine) {
  const at::Tensor p_logits = at::log(at::tensor(std::vector<float>{0.5f, 0.3f, 0.15f, 0.05f}));
  const at::Tensor q_logits = at::zeros({4});
  speculation::SamplingParams s;
  s.temperature = 1.0;
  s.top_p = 0.8;
  EXPECT_NEAR(ExpectedAcceptanceOfLogits(p_logits, q_logits, s), 0.5, 1e-5);
  s.top_p = 1.0;  // no nucleus: 0.25 + 0.25 + 0.15 + 0.05
  EXPECT_NEAR(ExpectedAcceptanceOfLogits(p_logits, q_logits, s), 0.7, 1e-5);
}

// As temperature -> 0 the acceptance tends to greedy's exact match: 1 when
// the argmaxes agree, 0 when they do not, and temperature 0 is exactly that.
TEST(ExpectedAcceptanceTest, ReducesToGreedyMatchAsTemperatureVanishes) {
  const at::Tensor target = at::tensor(std::vector<float>{2.0f, 1.5f, 0.0f, -1.0f});
  const at::Tensor agree = at::tensor(std::vector<float>{1.0f, 0.9f, 0.5f, 0.0f});
  const at::Tensor differ = at::tensor(std::vector<float>{1.0f, 1.2f, 0.5f, 0.0f});
  speculation::SamplingParams s;
  s.temperature = 1.0;  // far from the limit: strictly between 0 and 1
  EXPECT_LT(ExpectedAcceptanceOfLogits(target, agree, s), 1.0);
  EXPECT_GT(ExpectedAcceptanceOfLogits(target, differ, s), 0.0);
  // The gaps to the limit shrink like exp(-margin / temperature).
  for (double t : {0.05, 0.01, 1e-3}) {
    s.temperature = t;
    const double bound = 4 * std::exp(-0.1 / t);  // margins here are >= 0.1 (draft) and 0.5 (target)
    EXPECT_NEAR(ExpectedAcceptanceOfLogits(target, agree, s), 1.0, bound + 1e-6) << "temperature " << t;
    EXPECT_NEAR(ExpectedAcceptanceOfLogits(target, differ, s), 0.0, bound + 1e-6) << "temperature " << t;
  }
  s.temperature = 0;
  EXPECT_EQ(ExpectedAcceptanceOfLogits(target, agree, s), 1.0);
  EXPECT_EQ(ExpectedAcceptanceOfLogits(target, differ, s), 0.0);
}

// TraceRequest: greedy, the trace of TraceGreedyRequest; sampled, the
// trace of the engine's draw under that seed (the same draw again for the
// same seed), scored by acceptance probability.
TEST_F(CounterfactualTest, TraceRequestTracesGreedyOrSampledOutputs) {
  const std::vector<int32_t>& prompt = (*prompts_)[1];
  auto greedy = TraceRequest(*engine_, prompt, kNewTokens, 4, "g", speculation::SamplingParams{});
  auto reference = TraceGreedyRequest(*engine_, prompt, kNewTokens, 4, "g");
  ASSERT_THAT(greedy, IsOk());
  ASSERT_THAT(reference, IsOk());
  EXPECT_FALSE(greedy->sampled());
  EXPECT_EQ(greedy->target, reference->target);
  speculation::SamplingParams sampling;
  sampling.temperature = 0.8;
  sampling.seed = 5;
  model::GenerateOptions o;
  o.max_new_tokens = kNewTokens;
  o.sampling = sampling;
  auto draw = engine_->Generate(prompt, o);
  ASSERT_THAT(draw, IsOk());
  auto sampled = TraceRequest(*engine_, prompt, kNewTokens, 4, "s", sampling);
  auto again = TraceRequest(*engine_, prompt, kNewTokens, 4, "s", sampling);
  ASSERT_THAT(sampled, IsOk());
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(sampled->sampled());
  EXPECT_EQ(sampled->id, "s");
  ASSERT_GE(sampled->target.size(), draw->tokens.size());
  EXPECT_TRUE(std::equal(draw->tokens.begin(), draw->tokens.end(), sampled->target.begin()));
  EXPECT_EQ(sampled->target, again->target);
  sampling.temperature = -1;
  EXPECT_THAT(TraceRequest(*engine_, prompt, kNewTokens, 4, "bad", sampling),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("temperature")));
}

// A sampled trace (a sampled request's emitted tokens at temperature 0.8):
// acceptance probabilities in [0, 1], 1 at the last layer, shallow exits
// below 1 somewhere; a replay emits the logged tokens, and its expected
// accepted drafts equal the sum of the rounds' ExpectedAcceptedLength.
TEST_F(CounterfactualTest, SampledTraceScoresDraftsByAcceptanceProbability) {
  model::GenerateOptions o;
  o.max_new_tokens = kNewTokens;
  o.sampling.temperature = 0.8;
  o.sampling.top_p = 0.95;
  o.sampling.seed = 11;
  auto real = engine_->Generate((*prompts_)[0], o);
  ASSERT_THAT(real, IsOk());
  auto t = ComputeShadowTrace(*model_, (*prompts_)[0], real->tokens, real->finish == model::FinishReason::kEos,
                              kNewTokens, 4, "s0", o.sampling);
  ASSERT_THAT(t, IsOk());
  ASSERT_TRUE(t->sampled());
  const int32_t L = t->n_layers;
  const int64_t T = static_cast<int64_t>(t->target.size());
  ASSERT_EQ(t->accept_prob.size(), static_cast<size_t>(L));
  ASSERT_EQ(t->coupling.size(), static_cast<size_t>(T));
  double shallow = 0;
  for (int32_t l = 1; l <= L; ++l) {
    for (int64_t i = 0; i < T; ++i) {
      EXPECT_GE(t->AcceptProb(l, i), 0.0);
      EXPECT_LE(t->AcceptProb(l, i), 1.0);
    }
  }
  for (int64_t i = 0; i < T; ++i) {
    EXPECT_EQ(t->AcceptProb(L, i), 1.0);
    EXPECT_TRUE(t->Accepts(L, i));
    shallow += t->AcceptProb(1, i);
  }
  EXPECT_LT(shallow, static_cast<double>(T));
  EXPECT_NEAR(ExpectedAcceptedLength(*t, L, 1, 3), std::min<int64_t>(3, T - 1), 1e-9);
  SimulatedMethod m;
  m.mode = speculation::SpeculationMode::kStatic;
  m.exit_layer = 2;
  m.draft_len = 3;
  m.spec.max_draft_len = 8;
  auto sim = Simulate(*t, m);
  ASSERT_THAT(sim, IsOk());
  EXPECT_EQ(sim->tokens, real->tokens);
  double expected = 0;
  int64_t next = 1;
  for (const speculation::RoundRecord& r : sim->stats.rounds) {
    if (r.n_drafted > 0) expected += ExpectedAcceptedLength(*t, 2, next, r.n_drafted);
    next += r.n_accepted + 1;
  }
  EXPECT_NEAR(ExpectedAccepted(*t, *sim), expected, 1e-9);
  EXPECT_GT(expected, 0.0);
  EXPECT_LE(expected, static_cast<double>(sim->stats.n_drafted));
}

// The policy's temperature feature: every decision of a sampled request
// sees the request's temperature, in the engine and in the replay of its
// trace; a greedy request's decisions see 0.
TEST_F(CounterfactualTest, DecisionsSeeTheRequestsTemperature) {
  speculation::DecisionSpec spec;
  spec.candidate_layers = {1, 2, 4};
  spec.max_draft_len = 4;
  policy::ThresholdExitController a(0.5f, 0.5f), b(0.5f, 0.5f);
  model::GenerateOptions o = AdaptiveOptions(a, spec);
  o.sampling.temperature = 0.8;
  o.sampling.seed = 13;
  auto real = engine_->Generate((*prompts_)[0], o);
  ASSERT_THAT(real, IsOk());
  auto t = TraceRequest(*engine_, (*prompts_)[0], kNewTokens, 4, "t", o.sampling);
  ASSERT_THAT(t, IsOk());
  SimulatedMethod m;
  m.mode = speculation::SpeculationMode::kAdaptive;
  m.controller = &b;
  m.spec = spec;
  auto sim = Simulate(*t, m, /*record_traces=*/true);
  ASSERT_THAT(sim, IsOk());
  auto greedy = Simulate(Traces()[0], m, /*record_traces=*/true);
  ASSERT_THAT(greedy, IsOk());
  using Want = std::pair<const speculation::GenerationResult*, float>;
  for (const auto& [result, want] : std::vector<Want>{{&*real, 0.8f}, {&*sim, 0.8f}, {&*greedy, 0.0f}}) {
    int64_t decisions = 0;
    for (const speculation::RoundTrace& rt : result->traces) {
      for (const speculation::Decision& d : rt.decisions) {
        EXPECT_FLOAT_EQ(d.state.temperature, want);
        ++decisions;
      }
    }
    EXPECT_GT(decisions, 0);
  }
}

// A sampled trace at a vanishing temperature over the greedy trajectory
// scores like the greedy trace: the acceptance probability is the exact
// match wherever neither distribution is a numerical near-tie.
TEST_F(CounterfactualTest, SampledTraceTendsToGreedyAsTemperatureVanishes) {
  const ShadowTrace greedy = Traces()[1];
  std::vector<int32_t> output(greedy.target.begin(), greedy.target.end());
  const bool eos = std::find(greedy.eos_ids.begin(), greedy.eos_ids.end(), output.back()) != greedy.eos_ids.end();
  if (eos) output.pop_back();
  speculation::SamplingParams s;
  s.temperature = 1e-3;
  s.seed = 5;
  auto t = ComputeShadowTrace(*model_, greedy.prompt, output, eos, greedy.max_new_tokens, 4, "cold", s);
  ASSERT_THAT(t, IsOk());
  ASSERT_TRUE(t->sampled());
  int64_t compared = 0;
  for (int32_t l = 1; l < t->n_layers; ++l) {
    for (int64_t i = 0; i < static_cast<int64_t>(t->target.size()); ++i) {
      if (greedy.At(l, i).margin < 0.05f || greedy.At(t->n_layers, i).margin < 0.05f) continue;
      ++compared;
      EXPECT_NEAR(t->AcceptProb(l, i), greedy.AcceptProb(l, i), 1e-6) << "layer " << l << " position " << i;
      EXPECT_EQ(t->Accepts(l, i), greedy.Accepts(l, i)) << "layer " << l << " position " << i;
    }
  }
  EXPECT_GT(compared, 0);
}

// Held-out acceptance is reported per kind: greedy traces' expected accepted
// drafts are their exact acceptances; sampled ones are counted apart.
TEST_F(CounterfactualTest, ReplayAcceptanceSplitsGreedyFromSampled) {
  std::vector<ShadowTrace> traces = Traces();
  model::GenerateOptions o;
  o.max_new_tokens = kNewTokens;
  o.sampling.temperature = 0.8;
  o.sampling.seed = 3;
  auto real = engine_->Generate((*prompts_)[2], o);
  ASSERT_THAT(real, IsOk());
  auto sampled = ComputeShadowTrace(*model_, (*prompts_)[2], real->tokens,
                                    real->finish == model::FinishReason::kEos, kNewTokens, 4, "s2", o.sampling);
  ASSERT_THAT(sampled, IsOk());
  traces.push_back(*std::move(sampled));
  speculation::DecisionSpec spec;
  spec.candidate_layers = {1, 2, 3, 4, 6};
  spec.max_draft_len = 6;
  const ControllerMaker make = [](int64_t) { return std::make_unique<policy::ThresholdExitController>(0.5, 0.5); };
  auto by_kind = ReplayAcceptanceOf(traces, spec, make);
  ASSERT_THAT(by_kind, IsOk());
  EXPECT_EQ(by_kind->greedy.n_requests, 3);
  EXPECT_EQ(by_kind->sampled.n_requests, 1);
  int64_t greedy_accepted = 0, greedy_drafted = 0;
  for (size_t i = 0; i < 3; ++i) {
    SimulatedMethod m;
    m.mode = speculation::SpeculationMode::kAdaptive;
    auto c = make(static_cast<int64_t>(i));
    m.controller = c.get();
    m.spec = spec;
    auto r = Simulate(traces[i], m);
    ASSERT_THAT(r, IsOk());
    greedy_accepted += r->stats.n_accepted;
    greedy_drafted += r->stats.n_drafted;
  }
  EXPECT_EQ(by_kind->greedy.n_drafted, greedy_drafted);
  EXPECT_NEAR(by_kind->greedy.expected_accepted, static_cast<double>(greedy_accepted), 1e-9);
  EXPECT_GE(by_kind->sampled.rate(), 0.0);
  EXPECT_LE(by_kind->sampled.rate(), 1.0);
}

// A negative temperature or a top_p outside (0, 1] is refused naming it.
TEST_F(CounterfactualTest, BadSamplingSettingsAreRefused) {
  speculation::SamplingParams s;
  s.temperature = -0.5;
  EXPECT_THAT(ComputeShadowTrace(*model_, {1, 2}, {3}, false, 1, 4, "x", s),
              StatusIs(StatusCode::kInvalidArgument));
  s.temperature = 0.7;
  s.top_p = 1.5;
  EXPECT_THAT(ComputeShadowTrace(*model_, {1, 2}, {3}, false, 1, 4, "x", s),
              StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lede::trainer
