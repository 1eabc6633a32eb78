#include "shared/speculation/adaptive_round.h"

#include "shared/status/status_macros.h"

namespace lede::speculation {


Status RunAdaptiveRound(ExitController& controller, const DecisionSpec& spec, int32_t n_layers,
                        const DraftRequest& request, int64_t d_cap, DraftProbes& probes, Draft& d) {
  d.trace.round_index = request.round_index;
  float draft_conf = 1.0f;  // product of the drafted tokens' top-1 probabilities
  auto decide = [&](const ExitState& st, int32_t draft_index_if_exit) {
    const Action a = controller.Decide(st);
    ++d.n_decisions;
    if (request.record_trace) {
      d.trace.decisions.push_back(Decision{st, a, a == Action::kExit ? draft_index_if_exit : -1, false});
    }
    return a;
  };
  // A probe that drafted nothing: counted in the record and marked on the
  // decision that wasted it (rewards charge it there).
  auto waste_probe = [&]() {
    ++d.n_probes;
    if (request.record_trace) d.trace.decisions.back().wasted_probe = true;
  };
  auto with_request = [&](ExitState st) {
    st.trace_nll = static_cast<float>(request.trace_nll);
    st.accept_ema = static_cast<float>(request.accept_ema);
    st.load = request.load;
    st.draft_conf = draft_conf;
    return st;
  };
  // The context the next draft follows: the committed tokens, then this
  // round's drafts so far.
  std::vector<int32_t> context = request.context;
  // The state of a probe `sig` whose top-1 would follow `context`.
  auto probe_state = [&](const ExitSignals& sig, Phase phase, int32_t layer, int32_t row) {
    ExitState st = with_request(ProbeState(sig, phase, layer, n_layers, row, spec.max_draft_len));
    const NgramSignals ng =
        ContextNgram(context.data(), static_cast<int64_t>(context.size()), sig.top1);
    st.lookup_match = ng.lookup_match;
    st.trigram_seen = ng.trigram_seen;
    return st;
  };
  auto drafted = [&](int32_t token) {
    d.tokens.push_back(token);
    if (!context.empty()) context.push_back(token);
  };
  if (d_cap <= 0) return OkStatus();
  // Round start: speculate at all? (no probe paid yet)
  const ExitState start = with_request(RoundStartState(n_layers, spec.max_draft_len));
  if (decide(start, -1) != Action::kExit) return OkStatus();
  const int32_t first_probe = controller.FirstProbeLayer(start);
  int32_t done_layers = 0;
  ExitSignals last;  // the probe the next draft is taken from
  for (int32_t cand : spec.candidate_layers) {
    if (cand >= n_layers) break;
    if (cand < first_probe) continue;
    if (!spec.probe_candidates) {  // decided from the history; the head only at l*
      const ExitState st = with_request(
          ProbeState(ExitSignals{}, Phase::kExitLayer, cand, n_layers, 0, spec.max_draft_len));
      if (decide(st, 0) != Action::kExit) continue;
      LEDE_ASSIGN_OR_RETURN(last, probes.ProbeLayer(cand));
      done_layers = cand;
      d.exit_layer = cand;
      draft_conf = last.top1_prob;
      break;
    }
    LEDE_ASSIGN_OR_RETURN(ExitSignals sig, probes.ProbeLayer(cand));
    done_layers = cand;
    const ExitState st = probe_state(sig, Phase::kExitLayer, cand, 0);
    if (decide(st, 0) == Action::kExit) {
      d.exit_layer = cand;
      draft_conf = st.top1_prob;
      last = sig;
      break;
    }
    waste_probe();
  }
  if (d.exit_layer == 0) {  // no exit: the verifier resumes the full-depth step here
    d.ready_layer = done_layers;
    return OkStatus();
  }
  // The context n-gram signals of `last` (before its token joins the context).
  NgramSignals last_ngram =
      ContextNgram(context.data(), static_cast<int64_t>(context.size()), last.top1);
  LEDE_ASSIGN_OR_RETURN(int32_t first, probes.DraftFromProbe());
  drafted(first);
  while (static_cast<int64_t>(d.tokens.size()) < d_cap) {
    const int32_t row = static_cast<int32_t>(d.tokens.size());
    if (!spec.lookahead_probe) {
      // Decide on the token just drafted (its signals are in `last` and in
      // draft_conf); only a "keep drafting" pays the next probe.
      ExitState st = with_request(
          ProbeState(last, Phase::kDraftLength, d.exit_layer, n_layers, row, spec.max_draft_len));
      st.lookup_match = last_ngram.lookup_match;
      st.trigram_seen = last_ngram.trigram_seen;
      if (decide(st, row) != Action::kExit) break;  // the verifier runs row `row` itself
      LEDE_ASSIGN_OR_RETURN(last, probes.ProbeDraft(row, d.tokens.back()));
      draft_conf *= last.top1_prob;
      last_ngram = ContextNgram(context.data(), static_cast<int64_t>(context.size()), last.top1);
      LEDE_ASSIGN_OR_RETURN(int32_t next, probes.DraftFromProbe());
      drafted(next);
      continue;
    }
    LEDE_ASSIGN_OR_RETURN(ExitSignals sig, probes.ProbeDraft(row, d.tokens.back()));
    const ExitState st = probe_state(sig, Phase::kDraftLength, d.exit_layer, row);
    if (decide(st, row) != Action::kExit) {
      d.ready_layer = d.exit_layer;  // row `row` holds d_K's hidden state at l*
      waste_probe();
      break;
    }
    draft_conf *= st.top1_prob;
    last = sig;
    LEDE_ASSIGN_OR_RETURN(int32_t next, probes.DraftFromProbe());
    drafted(next);
  }
  return OkStatus();
}

}  // namespace lede::speculation
