#include "shared/speculation/adaptive_round.h"

#include <vector>

#include "shared/status/status_macros.h"

namespace lede::speculation {


namespace {

// One round's decisions (docs/design.md §2): the state the lambdas of a
// single long function used to share, so each phase is its own method.
class AdaptiveRound {
 public:
  AdaptiveRound(ExitController& controller, const DecisionSpec& spec, int32_t n_layers,
                const DraftRequest& request, DraftProbes& probes, Draft& d)
      : controller_(controller),
        spec_(spec),
        n_layers_(n_layers),
        request_(request),
        probes_(probes),
        d_(d),
        context_(request.context) {
    d_.trace.round_index = request.round_index;
  }

  // Round start: speculate at all? (no probe paid yet). Returns false for a
  // full-depth step.
  bool Speculate() {
    start_ = WithRequest(RoundStartState(n_layers_, spec_.max_draft_len));
    return Decide(start_, -1) == Action::kExit;
  }

  // Phase 1: the exit layer l*, probing the candidate layers from the
  // controller's first one. Leaves d.exit_layer 0 (and d.ready_layer at the
  // deepest layer probed) when no candidate exits.
  Status ChooseExitLayer() {
    const int32_t first_probe = controller_.FirstProbeLayer(start_);
    int32_t done_layers = 0;
    for (int32_t cand : spec_.candidate_layers) {
      if (cand >= n_layers_) break;
      if (cand < first_probe) continue;
      if (!spec_.probe_candidates) {  // decided from the history; the head only at l*
        const ExitState st = WithRequest(
            ProbeState(ExitSignals{}, Phase::kExitLayer, cand, n_layers_, 0, spec_.max_draft_len));
        if (Decide(st, 0) != Action::kExit) continue;
        LEDE_ASSIGN_OR_RETURN(last_, probes_.ProbeLayer(cand));
        done_layers = cand;
        d_.exit_layer = cand;
        draft_conf_ = last_.top1_prob;
        break;
      }
      LEDE_ASSIGN_OR_RETURN(ExitSignals sig, probes_.ProbeLayer(cand));
      done_layers = cand;
      const ExitState st = ProbeStateOf(sig, Phase::kExitLayer, cand, 0);
      if (Decide(st, 0) == Action::kExit) {
        d_.exit_layer = cand;
        draft_conf_ = st.top1_prob;
        last_ = sig;
        break;
      }
      WasteProbe();
    }
    if (d_.exit_layer == 0) d_.ready_layer = done_layers;  // the verifier resumes the full-depth step here
    return OkStatus();
  }

  // Phase 2: drafts from l* until the controller stops or d_cap tokens.
  Status DraftTokens(int64_t d_cap) {
    // The context n-gram signals of `last_` (before its token joins the context).
    NgramSignals last_ngram = Ngram(last_.top1);
    LEDE_ASSIGN_OR_RETURN(int32_t first, probes_.DraftFromProbe());
    Drafted(first);
    while (static_cast<int64_t>(d_.tokens.size()) < d_cap) {
      const int32_t row = static_cast<int32_t>(d_.tokens.size());
      if (!spec_.lookahead_probe) {
        // Decide on the token just drafted (its signals are in `last_` and in
        // draft_conf_); only a "keep drafting" pays the next probe.
        ExitState st = WithRequest(
            ProbeState(last_, Phase::kDraftLength, d_.exit_layer, n_layers_, row, spec_.max_draft_len));
        st.lookup_match = last_ngram.lookup_match;
        st.trigram_seen = last_ngram.trigram_seen;
        if (Decide(st, row) != Action::kExit) break;  // the verifier runs row `row` itself
        LEDE_ASSIGN_OR_RETURN(last_, probes_.ProbeDraft(row, d_.tokens.back()));
        draft_conf_ *= last_.top1_prob;
        last_ngram = Ngram(last_.top1);
        LEDE_ASSIGN_OR_RETURN(int32_t next, probes_.DraftFromProbe());
        Drafted(next);
        continue;
      }
      LEDE_ASSIGN_OR_RETURN(ExitSignals sig, probes_.ProbeDraft(row, d_.tokens.back()));
      const ExitState st = ProbeStateOf(sig, Phase::kDraftLength, d_.exit_layer, row);
      if (Decide(st, row) != Action::kExit) {
        d_.ready_layer = d_.exit_layer;  // row `row` holds d_K's hidden state at l*
        WasteProbe();
        break;
      }
      draft_conf_ *= st.top1_prob;
      last_ = sig;
      LEDE_ASSIGN_OR_RETURN(int32_t next, probes_.DraftFromProbe());
      Drafted(next);
    }
    return OkStatus();
  }

 private:
  Action Decide(const ExitState& st, int32_t draft_index_if_exit) {
    const Action a = controller_.Decide(st);
    ++d_.n_decisions;
    if (request_.record_trace) {
      d_.trace.decisions.push_back(Decision{st, a, a == Action::kExit ? draft_index_if_exit : -1, false});
    }
    return a;
  }

  // A probe that drafted nothing: counted in the record and marked on the
  // decision that wasted it (rewards charge it there).
  void WasteProbe() {
    ++d_.n_probes;
    if (request_.record_trace) d_.trace.decisions.back().wasted_probe = true;
  }

  ExitState WithRequest(ExitState st) const {
    st.trace_nll = static_cast<float>(request_.trace_nll);
    st.accept_ema = static_cast<float>(request_.accept_ema);
    st.load = request_.load;
    st.cost = request_.cost;
    st.temperature = request_.temperature;
    st.draft_conf = draft_conf_;
    return st;
  }

  NgramSignals Ngram(int32_t top1) const {
    return ContextNgram(context_.data(), static_cast<int64_t>(context_.size()), top1);
  }

  // The state of a probe `sig` whose top-1 would follow the context.
  ExitState ProbeStateOf(const ExitSignals& sig, Phase phase, int32_t layer, int32_t row) const {
    ExitState st = WithRequest(ProbeState(sig, phase, layer, n_layers_, row, spec_.max_draft_len));
    const NgramSignals ng = Ngram(sig.top1);
    st.lookup_match = ng.lookup_match;
    st.trigram_seen = ng.trigram_seen;
    return st;
  }

  void Drafted(int32_t token) {
    d_.tokens.push_back(token);
    if (!context_.empty()) context_.push_back(token);
  }

  ExitController& controller_;
  const DecisionSpec& spec_;
  const int32_t n_layers_;
  const DraftRequest& request_;
  DraftProbes& probes_;
  Draft& d_;
  float draft_conf_ = 1.0f;  // product of the drafted tokens' top-1 probabilities
  // The context the next draft follows: the committed tokens, then this
  // round's drafts so far.
  std::vector<int32_t> context_;
  ExitState start_;
  ExitSignals last_;  // the probe the next draft is taken from
};

}  // namespace

Status RunAdaptiveRound(ExitController& controller, const DecisionSpec& spec, int32_t n_layers,
                        const DraftRequest& request, int64_t d_cap, DraftProbes& probes, Draft& d) {
  AdaptiveRound round(controller, spec, n_layers, request, probes, d);
  if (d_cap <= 0 || !round.Speculate()) return OkStatus();
  LEDE_RETURN_IF_ERROR(round.ChooseExitLayer());
  if (d.exit_layer == 0) return OkStatus();
  return round.DraftTokens(d_cap);
}

}  // namespace lede::speculation
