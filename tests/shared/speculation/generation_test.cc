// Tests of the speculation loop (shared/speculation/generation.h):
// RunGeneration over a ScriptedBackend whose drafter and verifier answers
// each test chooses, so every clause of the documented contract (token
// budget, EOS, the sink stopping, verifier contract breaks, the session
// closed on every path, what the drafter is asked) is checked on exact
// token lists.
#include "shared/speculation/generation.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/shared/speculation/scripted_backend.h"
#include "tests/testing/status_matchers.h"

namespace lede::speculation {
namespace {

using ::lede::speculation::testing::Round;
using ::lede::speculation::testing::ScriptedBackend;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int32_t kEos = ScriptedBackend::kEos;
constexpr int64_t kSession = ScriptedBackend::kSession;
const std::vector<int32_t> kPrompt = {1, 2, 3};

LoopOptions Static(int64_t max_new_tokens) {
  LoopOptions o;
  o.mode = SpeculationMode::kStatic;
  o.max_new_tokens = max_new_tokens;
  return o;
}

// Records what the sink receives, call by call; returns false on call
// number `stop_on_call` (1-based; 0 = never).
struct Sink {
  std::vector<std::vector<int32_t>> calls;
  int stop_on_call = 0;
  TokenSink fn() {
    return [this](const std::vector<int32_t>& tokens) {
      calls.push_back(tokens);
      return static_cast<int>(calls.size()) != stop_on_call;
    };
  }
};

// Accepted drafts and the verifier's token are emitted in order, the sink
// sees each step's tokens once, the drafter is asked with the committed
// position, pending token and remaining budget, and the stats add up.
TEST(RunGenerationTest, EmitsRoundsInOrderAndAccountsForThem) {
  ScriptedBackend b;
  b.rounds = {Round::Speculate(2, {11, 12, 13}, 2, {11, 12, 40}),
              Round::Speculate(3, {41}, 0, {50}),
              Round::Step(51)};
  Sink sink;
  StatusOr<GenerationResult> r = RunGeneration(b, kPrompt, Static(6), sink.fn());
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->tokens, ElementsAre(10, 11, 12, 40, 50, 51));
  EXPECT_EQ(r->finish, FinishReason::kLength);
  EXPECT_THAT(sink.calls, ElementsAre(ElementsAre(10), ElementsAre(11, 12, 40), ElementsAre(50),
                                      ElementsAre(51)));
  EXPECT_THAT(b.opened_prompt, ElementsAre(1, 2, 3));
  EXPECT_THAT(b.closed_sessions, ElementsAre(kSession));

  // Round 1: after the first token, 5 tokens are left, one is the verifier's.
  // Round 2: 2 left. Round 3: 1 left, so no draft: a plain step.
  ASSERT_EQ(b.draft_requests.size(), 2u);
  EXPECT_EQ(b.draft_requests[0].pending_token, 10);
  EXPECT_EQ(b.draft_requests[0].position, 3);
  EXPECT_EQ(b.draft_requests[0].budget, 4);
  EXPECT_EQ(b.draft_requests[0].round_index, 0);
  EXPECT_FLOAT_EQ(b.draft_requests[0].accept_ema, ExitState::kAcceptEmaPrior);
  EXPECT_EQ(b.draft_requests[1].pending_token, 40);
  EXPECT_EQ(b.draft_requests[1].position, 6);
  EXPECT_EQ(b.draft_requests[1].budget, 1);
  EXPECT_EQ(b.draft_requests[1].round_index, 1);
  EXPECT_FLOAT_EQ(b.draft_requests[1].accept_ema,
                  UpdateAcceptEma(ExitState::kAcceptEmaPrior, 3, 2));
  EXPECT_THAT(b.verify_pending, ElementsAre(10, 40, 50));
  EXPECT_THAT(b.verify_drafts, ElementsAre(ElementsAre(11, 12, 13), ElementsAre(41), IsEmpty()));

  const GenerationStats& s = r->stats;
  EXPECT_EQ(s.n_prompt_tokens, 3);
  EXPECT_EQ(s.n_generated, 6);
  EXPECT_EQ(s.n_drafted, 4);
  EXPECT_EQ(s.n_accepted, 2);
  ASSERT_EQ(s.rounds.size(), 3u);
  EXPECT_EQ(s.rounds[0].exit_layer, 2);
  EXPECT_EQ(s.rounds[0].n_emitted, 3);
  EXPECT_EQ(s.rounds[1].n_accepted, 0);
  EXPECT_EQ(s.rounds[2].exit_layer, 0);  // a step
  EXPECT_EQ(s.rounds[2].n_drafted, 0);
  EXPECT_DOUBLE_EQ(s.acceptance_rate(), 0.5);
  EXPECT_DOUBLE_EQ(s.tokens_per_round(), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.mean_exit_layer(), 2.5);
  EXPECT_DOUBLE_EQ(s.mean_draft_len(), 2.0);
  // Each round's draft and verification are timed apart, within the round
  // (experience/served_costs.h times a service's steps the same way); the
  // step drafted nothing.
  for (const RoundRecord& round : s.rounds) {
    EXPECT_GE(round.draft_s, 0.0);
    EXPECT_GT(round.verify_s, 0.0);
    EXPECT_LE(round.draft_s + round.verify_s, round.latency_s);
  }
  EXPECT_GT(s.rounds[0].draft_s, 0.0);
  EXPECT_EQ(s.rounds[2].draft_s, 0.0);
}

// Autoregressive decoding never asks the drafter: one full-depth step per
// token after the first.
TEST(RunGenerationTest, AutoregressiveNeverDrafts) {
  ScriptedBackend b;
  b.rounds = {Round::Step(20), Round::Step(21)};
  LoopOptions o;
  o.max_new_tokens = 3;
  StatusOr<GenerationResult> r = RunGeneration(b, kPrompt, o);
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->tokens, ElementsAre(10, 20, 21));
  EXPECT_THAT(b.draft_requests, IsEmpty());
  EXPECT_THAT(b.verify_drafts, ElementsAre(IsEmpty(), IsEmpty()));
  EXPECT_TRUE(b.rounds.empty());
}

// max_new_tokens is hit inside a round: a verdict longer than the tokens
// left (a drafter that ignored its budget) is cut at max_new_tokens and the
// generation ends there with kLength.
TEST(RunGenerationTest, TokenBudgetCutsARoundShort) {
  ScriptedBackend b;
  // Budget 2 (4 - 1 emitted - 1); the drafter drafts 4 anyway, all accepted.
  b.rounds = {Round::Speculate(2, {11, 12, 13, 14}, 4, {11, 12, 13, 14, 15})};
  Sink sink;
  StatusOr<GenerationResult> r = RunGeneration(b, kPrompt, Static(4), sink.fn());
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(b.draft_requests.size(), 1u);
  EXPECT_EQ(b.draft_requests[0].budget, 2);
  EXPECT_THAT(r->tokens, ElementsAre(10, 11, 12, 13));
  EXPECT_EQ(r->finish, FinishReason::kLength);
  EXPECT_THAT(sink.calls, ElementsAre(ElementsAre(10), ElementsAre(11, 12, 13)));
  ASSERT_EQ(r->stats.rounds.size(), 1u);
  EXPECT_EQ(r->stats.rounds[0].n_emitted, 3);
  EXPECT_THAT(b.closed_sessions, ElementsAre(kSession));
}

// max_new_tokens = 1: the prefill's token is the whole generation.
TEST(RunGenerationTest, OneTokenNeedsNoRound) {
  ScriptedBackend b;
  StatusOr<GenerationResult> r = RunGeneration(b, kPrompt, Static(1));
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->tokens, ElementsAre(10));
  EXPECT_EQ(r->finish, FinishReason::kLength);
  EXPECT_THAT(b.verify_pending, IsEmpty());
  EXPECT_TRUE(r->stats.rounds.empty());
  EXPECT_THAT(b.closed_sessions, ElementsAre(kSession));
}

// An EOS inside a round ends the generation right before it: the tokens
// after it are not emitted, the EOS itself counts as the round's output,
// and no further round runs.
TEST(RunGenerationTest, EosInsideARoundStopsBeforeIt) {
  ScriptedBackend b;
  b.rounds = {Round::Speculate(2, {11, kEos, 13}, 3, {11, kEos, 13, 14}), Round::Step(20)};
  Sink sink;
  StatusOr<GenerationResult> r = RunGeneration(b, kPrompt, Static(10), sink.fn());
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->tokens, ElementsAre(10, 11));
  EXPECT_EQ(r->finish, FinishReason::kEos);
  EXPECT_THAT(sink.calls, ElementsAre(ElementsAre(10), ElementsAre(11)));
  ASSERT_EQ(r->stats.rounds.size(), 1u);
  EXPECT_EQ(r->stats.rounds[0].n_emitted, 2);  // 11 and the EOS
  EXPECT_EQ(r->stats.n_generated, 2);
  EXPECT_EQ(b.rounds.size(), 1u);  // the step after was never asked for
  EXPECT_THAT(b.closed_sessions, ElementsAre(kSession));
}

// An EOS as the first token: nothing is emitted, the sink is not called,
// no round runs.
TEST(RunGenerationTest, EosAsFirstTokenEmitsNothing) {
  ScriptedBackend b;
  b.first_token = kEos;
  Sink sink;
  StatusOr<GenerationResult> r = RunGeneration(b, kPrompt, Static(10), sink.fn());
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->tokens, IsEmpty());
  EXPECT_EQ(r->finish, FinishReason::kEos);
  EXPECT_THAT(sink.calls, IsEmpty());
  EXPECT_THAT(b.verify_pending, IsEmpty());
  EXPECT_THAT(b.closed_sessions, ElementsAre(kSession));
}

// With stop_at_eos off an EOS id is an ordinary token.
TEST(RunGenerationTest, EosIsOrdinaryWithoutStopAtEos) {
  ScriptedBackend b;
  b.rounds = {Round::Speculate(2, {kEos}, 1, {kEos, 12})};
  LoopOptions o = Static(3);
  o.stop_at_eos = false;
  StatusOr<GenerationResult> r = RunGeneration(b, kPrompt, o);
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->tokens, ElementsAre(10, kEos, 12));
  EXPECT_EQ(r->finish, FinishReason::kLength);
}

// The sink returning false (a stop string matched, the client left) stops
// the generation with kStop after the tokens it was given; no further round
// runs and the session is closed.
TEST(RunGenerationTest, SinkAskingToStopEndsAfterItsTokens) {
  ScriptedBackend b;
  b.rounds = {Round::Speculate(2, {11, 12}, 2, {11, 12, 13}), Round::Step(20)};
  Sink sink;
  sink.stop_on_call = 2;
  StatusOr<GenerationResult> r = RunGeneration(b, kPrompt, Static(10), sink.fn());
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->tokens, ElementsAre(10, 11, 12, 13));
  EXPECT_EQ(r->finish, FinishReason::kStop);
  EXPECT_EQ(sink.calls.size(), 2u);
  EXPECT_EQ(b.rounds.size(), 1u);
  EXPECT_THAT(b.closed_sessions, ElementsAre(kSession));
}

// The sink can stop at the first token, before any round.
TEST(RunGenerationTest, SinkCanStopAtTheFirstToken) {
  ScriptedBackend b;
  b.rounds = {Round::Step(20)};
  Sink sink;
  sink.stop_on_call = 1;
  StatusOr<GenerationResult> r = RunGeneration(b, kPrompt, Static(10), sink.fn());
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->tokens, ElementsAre(10));
  EXPECT_EQ(r->finish, FinishReason::kStop);
  EXPECT_THAT(b.verify_pending, IsEmpty());
  EXPECT_THAT(b.closed_sessions, ElementsAre(kSession));
}

// A verifier that breaks its contract (more accepted than drafted, a
// negative count, a token list that is not n_accepted + 1 long, an empty
// verdict) fails the request with kInternal, and the session is closed.
TEST(RunGenerationTest, VerifierBreakingItsContractIsInternal) {
  const std::vector<Round> broken = {
      Round::Speculate(2, {11, 12}, 3, {11, 12, 13, 14}),  // 3 accepted of 2
      Round::Speculate(2, {11, 12}, -1, {}),               // negative
      Round::Speculate(2, {11, 12}, 1, {11, 12, 13}),      // 3 tokens for 1 accepted
      Round::Speculate(2, {11, 12}, 0, {}),                // nothing
      Round::Speculate(0, {}, 0, {}),                      // a step with no token
  };
  for (size_t i = 0; i < broken.size(); ++i) {
    ScriptedBackend b;
    b.rounds = {broken[i]};
    Sink sink;
    StatusOr<GenerationResult> r = RunGeneration(b, kPrompt, Static(10), sink.fn());
    EXPECT_THAT(r, StatusIs(StatusCode::kInternal)) << "case " << i;
    EXPECT_THAT(b.closed_sessions, ElementsAre(kSession)) << "case " << i;
    EXPECT_THAT(sink.calls, ElementsAre(ElementsAre(10))) << "case " << i;  // nothing of the round
  }
}

// Backend errors pass through with their code; a session that was opened is
// closed, one that failed to open is not (there is none).
TEST(RunGenerationTest, BackendErrorsPassThroughAndCloseTheSession) {
  {
    ScriptedBackend b;
    b.open_status = ResourceExhaustedError("no free slot");
    EXPECT_THAT(RunGeneration(b, kPrompt, Static(10)), StatusIs(StatusCode::kResourceExhausted));
    EXPECT_THAT(b.closed_sessions, IsEmpty());
  }
  {
    ScriptedBackend b;
    Round r = Round::Speculate(2, {11}, 1, {11, 12});
    r.draft_status = UnavailableError("drafter down");
    b.rounds = {Round::Speculate(2, {11}, 1, {11, 12}), r};
    EXPECT_THAT(RunGeneration(b, kPrompt, Static(10)), StatusIs(StatusCode::kUnavailable));
    EXPECT_THAT(b.closed_sessions, ElementsAre(kSession));
    EXPECT_EQ(b.verify_pending.size(), 1u);  // the failed round was never verified
  }
  {
    ScriptedBackend b;
    Round r = Round::Speculate(2, {11}, 1, {11, 12});
    r.verify_status = UnavailableError("verifier down");
    b.rounds = {r};
    EXPECT_THAT(RunGeneration(b, kPrompt, Static(10)), StatusIs(StatusCode::kUnavailable));
    EXPECT_THAT(b.closed_sessions, ElementsAre(kSession));
  }
}

// Invalid requests are refused with kInvalidArgument before a session is
// opened.
TEST(RunGenerationTest, InvalidRequestsAreRefusedBeforeOpening) {
  struct Case {
    const char* what;
    std::vector<int32_t> prompt;
    LoopOptions options;
  };
  std::vector<Case> cases;
  cases.push_back({"empty prompt", {}, Static(4)});
  cases.push_back({"max_new_tokens 0", kPrompt, Static(0)});
  cases.push_back({"over the context window", kPrompt, Static(62)});  // 3 + 62 > 64
  cases.push_back({"token id >= V", {1, 100}, Static(4)});
  cases.push_back({"negative token id", {-1}, Static(4)});
  LoopOptions hot = Static(4);
  hot.session.sampling.temperature = -0.5;
  cases.push_back({"negative temperature", kPrompt, hot});
  LoopOptions nucleus = Static(4);
  nucleus.session.sampling.top_p = 0.0;
  cases.push_back({"top_p 0", kPrompt, nucleus});
  for (const Case& c : cases) {
    ScriptedBackend b;
    EXPECT_THAT(RunGeneration(b, c.prompt, c.options), StatusIs(StatusCode::kInvalidArgument))
        << c.what;
    EXPECT_EQ(b.n_opens, 0) << c.what;
  }
  ScriptedBackend fits;  // 3 + 61 == 64 fits exactly
  fits.first_token = kEos;
  EXPECT_THAT(RunGeneration(fits, kPrompt, Static(61)), IsOk());
}

// A request that fits the model's window but not the session's slot (a
// KV budget made the slot smaller) is refused with kResourceExhausted before
// a session is opened; beyond the window it stays kInvalidArgument.
TEST(RunGenerationTest, BeyondTheSlotWithinTheWindowIsResourceExhausted) {
  ScriptedBackend b;
  b.mutable_limits().context_window = 128;
  EXPECT_THAT(RunGeneration(b, kPrompt, Static(62)), StatusIs(StatusCode::kResourceExhausted));  // 3 + 62 > 64
  EXPECT_THAT(RunGeneration(b, kPrompt, Static(126)), StatusIs(StatusCode::kInvalidArgument));   // > 128
  EXPECT_EQ(b.n_opens, 0);
}

// Adaptive mode records NLLs (for C_trace) even when not asked, and the
// drafter sees the mean top-1 NLL of the last trace_window emitted tokens.
TEST(RunGenerationTest, AdaptiveDrafterSeesTraceNll) {
  ScriptedBackend b;
  b.first_nll = 1.0;
  Round r1 = Round::Speculate(2, {11}, 1, {11, 12});
  r1.verdict.nll = {2.0, 3.0};
  Round r2 = Round::Speculate(2, {13}, 1, {13, 14});
  r2.verdict.nll = {4.0, 5.0};
  b.rounds = {r1, r2, Round::Speculate(2, {15}, 1, {15, 16})};
  LoopOptions o = Static(7);
  o.mode = SpeculationMode::kAdaptive;
  o.trace_window = 3;
  StatusOr<GenerationResult> r = RunGeneration(b, kPrompt, o);
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(b.session_options.record_nll);
  ASSERT_EQ(b.draft_requests.size(), 3u);
  EXPECT_DOUBLE_EQ(b.draft_requests[0].trace_nll, 1.0);
  EXPECT_DOUBLE_EQ(b.draft_requests[1].trace_nll, 2.0);  // mean(1, 2, 3)
  EXPECT_DOUBLE_EQ(b.draft_requests[2].trace_nll, 4.0);  // mean(3, 4, 5)
}

// The load each round reports (LoopOptions::current_load, asked once per
// round) reaches the drafter; without it, and below 1, the load is 1.
TEST(RunGenerationTest, DraftRequestsCarryTheCurrentLoad) {
  ScriptedBackend b;
  b.rounds = {Round::Speculate(2, {11}, 1, {11, 12}), Round::Speculate(2, {13}, 1, {13, 14}),
              Round::Speculate(2, {15}, 1, {15, 16})};
  LoopOptions o = Static(7);
  o.mode = SpeculationMode::kAdaptive;
  std::vector<int32_t> loads = {5, 0, 64};
  size_t asked = 0;
  o.current_load = [&] { return loads.at(asked++); };
  ASSERT_THAT(RunGeneration(b, kPrompt, o), IsOk());
  ASSERT_EQ(b.draft_requests.size(), 3u);
  EXPECT_EQ(b.draft_requests[0].load, 5);
  EXPECT_EQ(b.draft_requests[1].load, 1);
  EXPECT_EQ(b.draft_requests[2].load, 64);
  ScriptedBackend alone;
  alone.rounds = {Round::Speculate(2, {11}, 1, {11, 12})};
  o.current_load = nullptr;
  o.max_new_tokens = 3;
  ASSERT_THAT(RunGeneration(alone, kPrompt, o), IsOk());
  ASSERT_EQ(alone.draft_requests.size(), 1u);
  EXPECT_EQ(alone.draft_requests[0].load, 1);
}

// The cost profile each drafting round reports (LoopOptions::current_cost,
// asked once per round) reaches the drafter; without it the profile is all
// 0 (unknown).
TEST(RunGenerationTest, DraftRequestsCarryTheCurrentCostProfile) {
  ScriptedBackend b;
  b.rounds = {Round::Speculate(2, {11}, 1, {11, 12}), Round::Speculate(2, {13}, 1, {13, 14})};
  LoopOptions o = Static(5);
  o.mode = SpeculationMode::kAdaptive;
  std::vector<CostFeatures> costs = {{0.1f, 1.0f, 0.0f}, {0.3f, 1.2f, 0.45f}};
  size_t asked = 0;
  o.current_cost = [&] { return costs.at(asked++); };
  ASSERT_THAT(RunGeneration(b, kPrompt, o), IsOk());
  ASSERT_EQ(b.draft_requests.size(), 2u);
  EXPECT_TRUE(b.draft_requests[0].cost == costs[0]);
  EXPECT_TRUE(b.draft_requests[1].cost == costs[1]);
  ScriptedBackend blind;
  blind.rounds = {Round::Speculate(2, {11}, 1, {11, 12})};
  o.current_cost = nullptr;
  o.max_new_tokens = 3;
  ASSERT_THAT(RunGeneration(blind, kPrompt, o), IsOk());
  ASSERT_EQ(blind.draft_requests.size(), 1u);
  EXPECT_TRUE(blind.draft_requests[0].cost == CostFeatures{});
}

// Each drafting round reports the session's sampling temperature
// (ExitState::temperature); a greedy session reports 0.
TEST(RunGenerationTest, DraftRequestsCarryTheSessionTemperature) {
  ScriptedBackend b;
  b.rounds = {Round::Speculate(2, {11}, 1, {11, 12}), Round::Speculate(2, {13}, 1, {13, 14})};
  LoopOptions o = Static(5);
  o.mode = SpeculationMode::kAdaptive;
  o.session.sampling.temperature = 0.8;
  o.session.sampling.seed = 7;
  ASSERT_THAT(RunGeneration(b, kPrompt, o), IsOk());
  ASSERT_EQ(b.draft_requests.size(), 2u);
  for (const DraftRequest& r : b.draft_requests) EXPECT_FLOAT_EQ(r.temperature, 0.8f);
  ScriptedBackend greedy;
  greedy.rounds = {Round::Speculate(2, {11}, 1, {11, 12})};
  o.session.sampling = SamplingParams{};
  o.max_new_tokens = 3;
  ASSERT_THAT(RunGeneration(greedy, kPrompt, o), IsOk());
  ASSERT_EQ(greedy.draft_requests.size(), 1u);
  EXPECT_FLOAT_EQ(greedy.draft_requests[0].temperature, 0.0f);
}

// A round that starts at a load above speculation_max_load is an
// autoregressive step (no DraftRound, no drafts verified, marked
// over_max_load); at or below it the round speculates. The load is asked
// once per round either way; 0 is no limit.
TEST(RunGenerationTest, RoundsAboveTheSpeculationMaxLoadAreAutoregressive) {
  ScriptedBackend b;
  // The fifth round has one token left to emit, so no budget to draft: a step
  // that asks no load.
  b.rounds = {Round::Speculate(2, {11}, 1, {11, 12}), Round::Step(13), Round::Speculate(2, {14}, 1, {14, 15}),
              Round::Step(16), Round::Step(17)};
  LoopOptions o = Static(8);
  std::vector<int32_t> loads = {4, 5, 4, 9};
  size_t asked = 0;
  o.current_load = [&] { return loads.at(asked++); };
  o.speculation_max_load = 4;
  StatusOr<GenerationResult> r = RunGeneration(b, kPrompt, o);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(asked, 4u);
  EXPECT_EQ(r->tokens, (std::vector<int32_t>{10, 11, 12, 13, 14, 15, 16, 17}));
  ASSERT_EQ(b.draft_requests.size(), 2u);
  EXPECT_EQ(b.draft_requests[0].load, 4);
  EXPECT_EQ(b.draft_requests[1].load, 4);
  ASSERT_EQ(b.verify_drafts.size(), 5u);
  EXPECT_TRUE(b.verify_drafts[1].empty());
  EXPECT_TRUE(b.verify_drafts[3].empty());
  ASSERT_EQ(r->stats.rounds.size(), 5u);
  EXPECT_FALSE(r->stats.rounds[0].over_max_load);
  EXPECT_TRUE(r->stats.rounds[1].over_max_load);
  EXPECT_EQ(r->stats.rounds[1].n_drafted, 0);
  EXPECT_FALSE(r->stats.rounds[2].over_max_load);
  EXPECT_TRUE(r->stats.rounds[3].over_max_load);
  EXPECT_FALSE(r->stats.rounds[4].over_max_load);
  EXPECT_EQ(r->stats.n_drafted, 2);

  ScriptedBackend unlimited;  // 0: every round speculates, whatever the load
  unlimited.rounds = {Round::Speculate(2, {11}, 1, {11, 12})};
  o.speculation_max_load = 0;
  o.max_new_tokens = 3;
  loads = {1000};
  asked = 0;
  ASSERT_THAT(RunGeneration(unlimited, kPrompt, o), IsOk());
  ASSERT_EQ(unlimited.draft_requests.size(), 1u);
  EXPECT_EQ(unlimited.draft_requests[0].load, 1000);
}

// With record_traces, each drafted round's decisions come back with the
// verifier's outcome: a decision that drafted token i is accepted iff
// i < n_accepted; rounds without decisions leave no trace.
TEST(RunGenerationTest, TracesCarryTheVerdict) {
  ScriptedBackend b;
  Round r1 = Round::Speculate(2, {11, 12}, 1, {11, 30});
  Decision start;
  start.state.phase = Phase::kRoundStart;
  start.action = Action::kExit;
  r1.draft.trace.decisions = {start};
  for (int32_t i = 0; i < 2; ++i) {
    Decision d;
    d.action = Action::kExit;
    d.draft_index = i;
    r1.draft.trace.decisions.push_back(d);
  }
  r1.draft.policy_version = "v7";
  b.rounds = {r1, Round::Step(31)};  // the step: 1 token left, no draft, no trace
  LoopOptions o = Static(4);
  o.mode = SpeculationMode::kAdaptive;
  o.record_traces = true;
  StatusOr<GenerationResult> r = RunGeneration(b, kPrompt, o);
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->tokens, ElementsAre(10, 11, 30, 31));
  ASSERT_EQ(b.draft_requests.size(), 1u);
  EXPECT_TRUE(b.draft_requests[0].record_trace);
  ASSERT_EQ(r->traces.size(), 1u);
  const RoundTrace& t = r->traces[0];
  EXPECT_EQ(t.round_index, 0);
  EXPECT_EQ(t.exit_layer, 2);
  EXPECT_EQ(t.n_drafted, 2);
  EXPECT_EQ(t.n_accepted, 1);
  ASSERT_EQ(t.decisions.size(), 3u);
  EXPECT_FALSE(t.decisions[0].accepted);  // drafted nothing
  EXPECT_TRUE(t.decisions[1].accepted);
  EXPECT_FALSE(t.decisions[2].accepted);
  EXPECT_EQ(r->policy_version, "v7");
}

// The draft and verify seeds are keyed by position and stream, not by call
// order: equal inputs give equal seeds, and each input matters.
TEST(RoundSeedTest, KeyedBySeedPositionAndStream) {
  EXPECT_EQ(RoundSeed(5, 10, kDraftStream), RoundSeed(5, 10, kDraftStream));
  EXPECT_NE(RoundSeed(5, 10, kDraftStream), RoundSeed(5, 10, kVerifyStream));
  EXPECT_NE(RoundSeed(5, 10, kDraftStream), RoundSeed(5, 11, kDraftStream));
  EXPECT_NE(RoundSeed(5, 10, kDraftStream), RoundSeed(6, 10, kDraftStream));
}

}  // namespace
}  // namespace lede::speculation
