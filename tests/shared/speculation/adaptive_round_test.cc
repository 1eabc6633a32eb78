// Tests of the controller-driven round (shared/speculation/adaptive_round.h):
// RunAdaptiveRound with a scripted controller and scripted probes, checking
// which probes a round pays for, which decisions it asks, and what Draft it
// hands the verifier (exit layer, drafts, ready layer, probe and decision
// counts, trace).
#include "shared/speculation/adaptive_round.h"

#include <cmath>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace lede::speculation {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int32_t kLayers = 8;

// Answers the scripted actions in order (kContinue once the script is out)
// and records every state it was asked about.
class ScriptedController : public ExitController {
 public:
  explicit ScriptedController(std::deque<Action> actions, int32_t first_probe = 0)
      : actions_(std::move(actions)), first_probe_(first_probe) {}
  std::string name() const override { return "scripted"; }
  Action Decide(const ExitState& state) override {
    states.push_back(state);
    if (actions_.empty()) return Action::kContinue;
    Action a = actions_.front();
    actions_.pop_front();
    return a;
  }
  int32_t FirstProbeLayer(const ExitState&) override { return first_probe_; }
  std::vector<ExitState> states;

 private:
  std::deque<Action> actions_;
  int32_t first_probe_;
};

// Probe signals by call: top1_prob = 0.9 for layer probes, 0.5 for draft
// probes; draft tokens 100, 101, ...; records the calls.
class ScriptedProbes : public DraftProbes {
 public:
  StatusOr<ExitSignals> ProbeLayer(int32_t layer) override {
    layers.push_back(layer);
    if (layer == fail_layer) return InternalError("probe failed");
    ExitSignals s;
    s.top1_prob = 0.9f;
    return s;
  }
  StatusOr<ExitSignals> ProbeDraft(int32_t row, int32_t token) override {
    draft_rows.push_back(row);
    draft_inputs.push_back(token);
    ExitSignals s;
    s.top1_prob = 0.5f;
    return s;
  }
  StatusOr<int32_t> DraftFromProbe() override { return next_token++; }

  std::vector<int32_t> layers, draft_rows, draft_inputs;
  int32_t next_token = 100;
  int32_t fail_layer = -1;
};

DecisionSpec Spec(std::vector<int32_t> candidates) {
  DecisionSpec spec;
  spec.candidate_layers = std::move(candidates);
  spec.max_draft_len = 4;
  return spec;
}

DraftRequest Request() {
  DraftRequest r;
  r.trace_nll = 0.25;
  r.accept_ema = 0.75;
  r.round_index = 3;
  r.record_trace = true;
  return r;
}

// No room to draft: no decision, no probe, nothing drafted.
TEST(AdaptiveRoundTest, NoRoomAsksNothing) {
  ScriptedController c({Action::kExit});
  ScriptedProbes p;
  Draft d;
  ASSERT_THAT(RunAdaptiveRound(c, Spec({2, 4}), kLayers, Request(), 0, p, d), IsOk());
  EXPECT_THAT(c.states, IsEmpty());
  EXPECT_THAT(p.layers, IsEmpty());
  EXPECT_TRUE(d.tokens.empty());
  EXPECT_EQ(d.n_decisions, 0);
}

// The round-start gate saying continue makes a plain step: one decision on
// the request's history only, no probe.
TEST(AdaptiveRoundTest, RoundStartContinueIsAPlainStep) {
  ScriptedController c({Action::kContinue});
  ScriptedProbes p;
  Draft d;
  ASSERT_THAT(RunAdaptiveRound(c, Spec({2, 4}), kLayers, Request(), 4, p, d), IsOk());
  ASSERT_EQ(c.states.size(), 1u);
  EXPECT_EQ(c.states[0].phase, Phase::kRoundStart);
  EXPECT_EQ(c.states[0].layer, 0);
  EXPECT_FLOAT_EQ(c.states[0].trace_nll, 0.25f);
  EXPECT_FLOAT_EQ(c.states[0].accept_ema, 0.75f);
  EXPECT_THAT(p.layers, IsEmpty());
  EXPECT_EQ(d.exit_layer, 0);
  EXPECT_EQ(d.ready_layer, 0);
  EXPECT_EQ(d.n_decisions, 1);
  EXPECT_EQ(d.n_probes, 0);
}

// Phase 1 probes candidates in order until an exit; phase 2 (lookahead)
// probes the next row and stops on continue: the stopping probe is wasted
// and its row is ready at l* for the verifier.
TEST(AdaptiveRoundTest, PhaseOneThenPhaseTwoWithLookahead) {
  // start: exit; layer 2: continue; layer 4: exit; row 1: exit; row 2: continue.
  ScriptedController c(
      {Action::kExit, Action::kContinue, Action::kExit, Action::kExit, Action::kContinue});
  ScriptedProbes p;
  Draft d;
  ASSERT_THAT(RunAdaptiveRound(c, Spec({2, 4, 6}), kLayers, Request(), 4, p, d), IsOk());
  EXPECT_THAT(p.layers, ElementsAre(2, 4));
  EXPECT_THAT(p.draft_rows, ElementsAre(1, 2));
  EXPECT_THAT(p.draft_inputs, ElementsAre(100, 101));
  EXPECT_EQ(d.exit_layer, 4);
  EXPECT_THAT(d.tokens, ElementsAre(100, 101));
  EXPECT_EQ(d.ready_layer, 4);
  EXPECT_EQ(d.n_probes, 2);  // layer 2 and the stopping probe of row 2
  EXPECT_EQ(d.n_decisions, 5);
  ASSERT_EQ(c.states.size(), 5u);
  EXPECT_EQ(c.states[1].phase, Phase::kExitLayer);
  EXPECT_EQ(c.states[1].layer, 2);
  EXPECT_EQ(c.states[3].phase, Phase::kDraftLength);
  EXPECT_EQ(c.states[3].layer, 4);
  EXPECT_EQ(c.states[3].draft_pos, 1);
  EXPECT_FLOAT_EQ(c.states[3].draft_conf, 0.9f);         // the first draft's probe
  EXPECT_FLOAT_EQ(c.states[4].draft_conf, 0.9f * 0.5f);  // times row 1's
  // The trace: drafting decisions carry their draft index.
  ASSERT_EQ(d.trace.decisions.size(), 5u);
  EXPECT_EQ(d.trace.round_index, 3);
  EXPECT_EQ(d.trace.decisions[0].draft_index, -1);
  EXPECT_EQ(d.trace.decisions[1].draft_index, -1);
  EXPECT_EQ(d.trace.decisions[2].draft_index, 0);
  EXPECT_EQ(d.trace.decisions[3].draft_index, 1);
  EXPECT_EQ(d.trace.decisions[4].draft_index, -1);
}

// The round stops at d_cap drafts without asking.
TEST(AdaptiveRoundTest, StopsAtTheCapWithoutADecision) {
  ScriptedController c({Action::kExit, Action::kExit, Action::kExit, Action::kExit, Action::kExit});
  ScriptedProbes p;
  Draft d;
  ASSERT_THAT(RunAdaptiveRound(c, Spec({2}), kLayers, Request(), 3, p, d), IsOk());
  EXPECT_THAT(d.tokens, ElementsAre(100, 101, 102));
  EXPECT_EQ(d.n_decisions, 4);  // start, layer 2, rows 1 and 2
  EXPECT_EQ(d.ready_layer, 0);
  EXPECT_EQ(d.n_probes, 0);
}

// Passing every candidate without an exit is a full-depth step that resumes
// at the deepest layer probed; candidates >= L are not exits and are
// skipped.
TEST(AdaptiveRoundTest, NoExitResumesAtTheDeepestProbe) {
  ScriptedController c({Action::kExit});
  ScriptedProbes p;
  Draft d;
  ASSERT_THAT(RunAdaptiveRound(c, Spec({2, 4, 8, 10}), kLayers, Request(), 4, p, d), IsOk());
  EXPECT_THAT(p.layers, ElementsAre(2, 4));
  EXPECT_EQ(d.exit_layer, 0);
  EXPECT_TRUE(d.tokens.empty());
  EXPECT_EQ(d.ready_layer, 4);
  EXPECT_EQ(d.n_probes, 2);
}

// FirstProbeLayer skips the candidates below it without a probe or a
// decision.
TEST(AdaptiveRoundTest, FirstProbeLayerSkipsShallowCandidates) {
  ScriptedController c({Action::kExit, Action::kExit}, /*first_probe=*/4);
  ScriptedProbes p;
  Draft d;
  ASSERT_THAT(RunAdaptiveRound(c, Spec({2, 4, 6}), kLayers, Request(), 1, p, d), IsOk());
  EXPECT_THAT(p.layers, ElementsAre(4));
  EXPECT_EQ(d.exit_layer, 4);
  EXPECT_THAT(d.tokens, ElementsAre(100));
}

// Without probe_candidates, phase 1 decides on the history and pays the
// head only at l*; without lookahead_probe, phase 2 decides before the next
// probe, so stopping pays nothing.
TEST(AdaptiveRoundTest, ProbeFlagsSaveTheProbesTheyName) {
  DecisionSpec spec = Spec({2, 4, 6});
  spec.probe_candidates = false;
  spec.lookahead_probe = false;
  // start: exit; layer 2: continue; layer 4: exit; row 1: exit; row 2: continue.
  ScriptedController c(
      {Action::kExit, Action::kContinue, Action::kExit, Action::kExit, Action::kContinue});
  ScriptedProbes p;
  Draft d;
  ASSERT_THAT(RunAdaptiveRound(c, spec, kLayers, Request(), 4, p, d), IsOk());
  EXPECT_THAT(p.layers, ElementsAre(4));
  EXPECT_THAT(p.draft_rows, ElementsAre(1));
  EXPECT_EQ(d.exit_layer, 4);
  EXPECT_THAT(d.tokens, ElementsAre(100, 101));
  EXPECT_EQ(d.n_probes, 0);
  EXPECT_EQ(d.ready_layer, 0);  // the verifier runs the last row itself
  EXPECT_FLOAT_EQ(c.states[1].top1_prob, 0.0f);  // decided without a probe
}

// A probe error ends the round with that status.
TEST(AdaptiveRoundTest, ProbeErrorsPassThrough) {
  ScriptedController c({Action::kExit, Action::kContinue});
  ScriptedProbes p;
  p.fail_layer = 4;
  Draft d;
  EXPECT_THAT(RunAdaptiveRound(c, Spec({2, 4}), kLayers, Request(), 4, p, d),
              StatusIs(StatusCode::kInternal));
}


// ContextNgram: lookup_match follows the most recent earlier occurrence of
// the last token only; trigram_seen looks at every occurrence.
TEST(ContextNgramTest, LookupFollowsTheMostRecentOccurrenceAndTrigramsAnyOccurrence) {
  const std::vector<int32_t> ctx = {6, 7, 1, 4, 7, 2, 6, 7};
  const int64_t n = static_cast<int64_t>(ctx.size());
  NgramSignals s = ContextNgram(ctx.data(), n, 2);  // after the last earlier 7 came 2
  EXPECT_FLOAT_EQ(s.lookup_match, 1.0f);
  EXPECT_FLOAT_EQ(s.trigram_seen, 0.0f);  // (6, 7, 2) never occurred
  s = ContextNgram(ctx.data(), n, 1);
  EXPECT_FLOAT_EQ(s.lookup_match, 0.0f);
  EXPECT_FLOAT_EQ(s.trigram_seen, 1.0f);  // (6, 7, 1) at the start
  s = ContextNgram(ctx.data(), n, 9);
  EXPECT_FLOAT_EQ(s.lookup_match, 0.0f);
  EXPECT_FLOAT_EQ(s.trigram_seen, 0.0f);
  // Nothing to look back over.
  s = ContextNgram(ctx.data(), 1, 7);
  EXPECT_FLOAT_EQ(s.lookup_match, 0.0f);
  EXPECT_FLOAT_EQ(s.trigram_seen, 0.0f);
  s = ContextNgram(nullptr, 0, 7);
  EXPECT_FLOAT_EQ(s.lookup_match + s.trigram_seen, 0.0f);
}

// Probes whose top-1 is the token they draft: script[0] at the exit layer,
// script[row] for draft row `row`.
class TokenProbes : public DraftProbes {
 public:
  explicit TokenProbes(std::vector<int32_t> script) : script_(std::move(script)) {}
  StatusOr<ExitSignals> ProbeLayer(int32_t) override { return Signals(0); }
  StatusOr<ExitSignals> ProbeDraft(int32_t row, int32_t) override { return Signals(row); }
  StatusOr<int32_t> DraftFromProbe() override { return last_; }

 private:
  ExitSignals Signals(int32_t i) {
    ExitSignals s;
    s.top1_prob = 0.8f;
    s.top1 = last_ = script_.at(static_cast<size_t>(i));
    return s;
  }
  std::vector<int32_t> script_;
  int32_t last_ = 0;
};

// Each probe's state carries the n-gram signals of its top-1 token against
// the committed context followed by the round's drafts so far, with or
// without the lookahead probe (then a decision sees the token just drafted).
TEST(AdaptiveRoundTest, ProbeStatesCarryTheContextNgramSignalsOfTheirToken) {
  for (const bool lookahead : {true, false}) {
    SCOPED_TRACE(lookahead ? "lookahead" : "on the token just drafted");
    DecisionSpec spec = Spec({2});
    spec.lookahead_probe = lookahead;
    // start: exit; layer 2: exit (drafts 1); then keep drafting 4 and 9.
    ScriptedController c({Action::kExit, Action::kExit, Action::kExit, Action::kExit, Action::kContinue});
    TokenProbes p({1, 4, 9, 3});
    DraftRequest r = Request();
    r.context = {6, 7, 1, 4, 7, 2, 6, 7};
    Draft d;
    ASSERT_THAT(RunAdaptiveRound(c, spec, kLayers, r, 3, p, d), IsOk());
    ASSERT_THAT(d.tokens, ElementsAre(1, 4, 9));
    EXPECT_FLOAT_EQ(c.states[0].lookup_match + c.states[0].trigram_seen, 0.0f);  // round start: no probe
    // Token 1 after ..., 6, 7: the trigram (6, 7, 1) occurred; the lookup says 2.
    EXPECT_FLOAT_EQ(c.states[1].lookup_match, 0.0f);
    EXPECT_FLOAT_EQ(c.states[1].trigram_seen, 1.0f);
    // Token 4 after ..., 7, 1 (the draft): both match (7, 1, 4 at the start).
    const ExitState& second = c.states[lookahead ? 2 : 3];
    EXPECT_FLOAT_EQ(second.lookup_match, 1.0f);
    EXPECT_FLOAT_EQ(second.trigram_seen, 1.0f);
    if (lookahead) {
      // Token 9 after ..., 1, 4: the lookup says 7; no (1, 4, 9).
      EXPECT_FLOAT_EQ(c.states[3].lookup_match, 0.0f);
      EXPECT_FLOAT_EQ(c.states[3].trigram_seen, 0.0f);
    } else {
      // The first phase-2 decision is on token 1 (just drafted).
      EXPECT_FLOAT_EQ(c.states[2].trigram_seen, 1.0f);
      EXPECT_FLOAT_EQ(c.states[2].lookup_match, 0.0f);
    }
  }
  // Without a context the signals are 0.
  ScriptedController c({Action::kExit, Action::kExit, Action::kContinue});
  TokenProbes p({1, 4});
  Draft d;
  ASSERT_THAT(RunAdaptiveRound(c, Spec({2}), kLayers, Request(), 3, p, d), IsOk());
  for (const ExitState& st : c.states) EXPECT_FLOAT_EQ(st.lookup_match + st.trigram_seen, 0.0f);
}

// Every state of a round carries the request's load and temperature. The
// load feature is log2(load) / 8, capped at 256 sessions; the temperature
// feature is min(T, 2) / 2 (0 greedy; a NaN reads as greedy).
TEST(AdaptiveRoundTest, EveryStateCarriesTheLoadAndTemperature) {
  ScriptedController c({Action::kExit, Action::kExit, Action::kExit, Action::kContinue});
  TokenProbes p({1, 4, 9});
  DraftRequest r = Request();
  r.load = 16;
  r.temperature = 0.8f;
  Draft d;
  ASSERT_THAT(RunAdaptiveRound(c, Spec({2}), kLayers, r, 3, p, d), IsOk());
  ASSERT_GE(c.states.size(), 3u);
  for (const ExitState& st : c.states) {
    EXPECT_EQ(st.load, 16);
    EXPECT_FLOAT_EQ(st.temperature, 0.8f);
  }
  float f[kExitFeatureDim];
  ExitFeatures(c.states[0], f);
  EXPECT_FLOAT_EQ(f[kLoadFeature], 0.5f);
  EXPECT_FLOAT_EQ(f[kTemperatureFeature], 0.4f);
  EXPECT_EQ(kTemperatureFeature, kExitFeatureDim - 1);
  EXPECT_FLOAT_EQ(LoadFeature(1), 0.0f);
  EXPECT_FLOAT_EQ(LoadFeature(0), 0.0f);
  EXPECT_FLOAT_EQ(LoadFeature(2), 1.0f / 8.0f);
  EXPECT_FLOAT_EQ(LoadFeature(64), 0.75f);
  EXPECT_FLOAT_EQ(LoadFeature(256), 1.0f);
  EXPECT_FLOAT_EQ(LoadFeature(1000), 1.0f);
  EXPECT_FLOAT_EQ(TemperatureFeature(0.0f), 0.0f);
  EXPECT_FLOAT_EQ(TemperatureFeature(1.0f), 0.5f);
  EXPECT_FLOAT_EQ(TemperatureFeature(2.0f), 1.0f);
  EXPECT_FLOAT_EQ(TemperatureFeature(7.0f), 1.0f);
  EXPECT_FLOAT_EQ(TemperatureFeature(-1.0f), 0.0f);
  EXPECT_FLOAT_EQ(TemperatureFeature(std::nanf("")), 0.0f);
}

}  // namespace
}  // namespace lede::speculation
