// File: tests/shared/speculation/scripted_backend.h
//
// ScriptedBackend: a SpeculationBackend (shared/speculation/generation.h)
// that plays back a script of rounds and records every call, so that tests
// of RunGeneration() choose exactly what the drafter and the verifier answer
// (including answers that break their contracts) and check what the loop
// asked and when it closed the session.
//
//   ScriptedBackend backend;                        // L = 4, V = 100, C = 64, EOS 99
//   backend.first_token = 10;
//   backend.rounds.push_back(Round::Speculate(2, {11, 12, 13}, 2, {11, 12, 30}));
//   auto r = RunGeneration(backend, {1, 2, 3}, options);
//
// Header-only. Thread-safety: not thread-safe (RunGeneration calls one
// session from one thread).
#ifndef LEDE_TESTS_SHARED_SPECULATION_SCRIPTED_BACKEND_H_
#define LEDE_TESTS_SHARED_SPECULATION_SCRIPTED_BACKEND_H_

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "shared/speculation/generation.h"
#include "shared/status/status.h"

namespace lede::speculation::testing {

// One scripted round: what DraftRound returns (when the loop asks for a
// draft) and what VerifyRound returns.
struct Round {
  Status draft_status;  // non-OK: DraftRound fails with it
  Draft draft;
  Status verify_status;  // non-OK: VerifyRound fails with it
  Verdict verdict;

  // A speculation round: K = drafts.size() drafts at `exit_layer`, of which
  // the verifier accepts `n_accepted` and returns `tokens`.
  static Round Speculate(int32_t exit_layer, std::vector<int32_t> drafts, int32_t n_accepted,
                         std::vector<int32_t> tokens) {
    Round r;
    r.draft.exit_layer = exit_layer;
    r.draft.tokens = std::move(drafts);
    r.verdict.n_accepted = n_accepted;
    r.verdict.tokens = std::move(tokens);
    return r;
  }
  // A full-depth step (no drafts) that emits `token`.
  static Round Step(int32_t token) {
    Round r;
    r.verdict.tokens = {token};
    return r;
  }
};

class ScriptedBackend : public SpeculationBackend {
 public:
  ScriptedBackend() {
    limits_.n_layers = 4;
    limits_.vocab_size = 100;
    limits_.capacity = 64;
    limits_.eos_ids = {kEos};
  }

  static constexpr int32_t kEos = 99;
  static constexpr int64_t kSession = 7;

  const ModelLimits& limits() const override { return limits_; }
  ModelLimits& mutable_limits() { return limits_; }

  StatusOr<Prefilled> Open(const std::vector<int32_t>& prompt, const SessionOptions& options) override {
    ++n_opens;
    opened_prompt = prompt;
    session_options = options;
    if (!open_status.ok()) return open_status;
    Prefilled p;
    p.session = kSession;
    p.token = first_token;
    p.nll = first_nll;
    open_sessions.push_back(kSession);
    return p;
  }

  StatusOr<Draft> DraftRound(int64_t session, const DraftRequest& request) override {
    draft_requests.push_back(request);
    if (session != kSession) return InternalError("DraftRound of an unknown session");
    if (IsClosed()) return InternalError("DraftRound after Close");
    if (rounds.empty()) return InternalError("script exhausted at DraftRound");
    if (!rounds.front().draft_status.ok()) {
      Status s = rounds.front().draft_status;
      rounds.pop_front();
      return s;
    }
    return rounds.front().draft;
  }

  StatusOr<Verdict> VerifyRound(int64_t session, int32_t pending_token, const Draft& draft) override {
    verify_pending.push_back(pending_token);
    verify_drafts.push_back(draft.tokens);
    if (session != kSession) return InternalError("VerifyRound of an unknown session");
    if (IsClosed()) return InternalError("VerifyRound after Close");
    if (rounds.empty()) return InternalError("script exhausted at VerifyRound");
    Round r = std::move(rounds.front());
    rounds.pop_front();
    if (!r.verify_status.ok()) return r.verify_status;
    return r.verdict;
  }

  void Close(int64_t session) override { closed_sessions.push_back(session); }

  bool IsClosed() const { return !closed_sessions.empty(); }

  // The script and the first token.
  Status open_status;
  int32_t first_token = 10;
  double first_nll = 0;
  std::deque<Round> rounds;

  // What the loop did.
  int n_opens = 0;
  std::vector<int32_t> opened_prompt;
  SessionOptions session_options;
  std::vector<DraftRequest> draft_requests;
  std::vector<int32_t> verify_pending;
  std::vector<std::vector<int32_t>> verify_drafts;
  std::vector<int64_t> open_sessions;
  std::vector<int64_t> closed_sessions;

 private:
  ModelLimits limits_;
};

}  // namespace lede::speculation::testing

#endif  // LEDE_TESTS_SHARED_SPECULATION_SCRIPTED_BACKEND_H_
