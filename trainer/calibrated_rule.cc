#include "trainer/calibrated_rule.h"

#include <algorithm>
#include <cstdio>
#include <deque>

#include "shared/status/status_macros.h"

namespace lede::trainer {

std::vector<std::vector<policy::AcceptanceFeatures>> TraceAcceptanceFeatures(const ShadowTrace& t,
                                                                             int32_t trace_window) {
  const size_t N = t.target.size();
  std::vector<std::vector<policy::AcceptanceFeatures>> x(t.n_layers + 1);
  for (int32_t l = 1; l < t.n_layers; ++l) x[l].resize(N);
  double sum = 0;
  std::deque<double> window;
  std::vector<int32_t> context = t.prompt;  // prompt + target[0, i)
  for (size_t i = 0; i < N; ++i) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(context.size()), speculation::kNgramWindow);
    const int32_t* ctx = context.data() + context.size() - n;
    const double trace_nll = window.empty() ? 0.0 : sum / window.size();
    if (i > 0) {  // position 0 is the prefill's token
      for (int32_t l = 1; l < t.n_layers; ++l) {
        const speculation::ExitSignals& s = t.At(l, static_cast<int64_t>(i));
        const speculation::NgramSignals ng = speculation::ContextNgram(ctx, n, s.top1);
        x[l][i] = policy::AcceptanceFeaturesOf(s.top1_prob, s.margin, s.entropy, static_cast<float>(trace_nll),
                                               ng.lookup_match, ng.trigram_seen);
      }
    }
    context.push_back(t.target[i]);
    const double v = t.At(t.n_layers, static_cast<int64_t>(i)).top1_nll;
    window.push_back(v);
    sum += v;
    if (static_cast<int32_t>(window.size()) > trace_window) sum -= window.front(), window.pop_front();
  }
  return x;
}

std::vector<std::vector<policy::AcceptanceSample>> AcceptanceSamples(const std::vector<ShadowTrace>& traces,
                                                                     int32_t trace_window, int64_t shift) {
  std::vector<std::vector<policy::AcceptanceSample>> by_layer;
  for (const ShadowTrace& t : traces) {
    if (by_layer.empty()) by_layer.resize(t.n_layers + 1);
    const auto x = TraceAcceptanceFeatures(t, trace_window);
    const int64_t N = static_cast<int64_t>(t.target.size());
    for (int64_t i = 1; i + shift < N; ++i) {
      for (int32_t l = 1; l < t.n_layers; ++l) by_layer[l].push_back({x[l][i], t.Accepts(l, i + shift)});
    }
  }
  return by_layer;
}

StatusOr<AcceptanceModels> FitAcceptanceModels(const std::vector<ShadowTrace>& traces, int32_t trace_window) {
  AcceptanceModels m;
  LEDE_ASSIGN_OR_RETURN(auto current, policy::AcceptanceModel::Fit(AcceptanceSamples(traces, trace_window, 0)));
  LEDE_ASSIGN_OR_RETURN(auto next, policy::AcceptanceModel::Fit(AcceptanceSamples(traces, trace_window, 1)));
  m.current = std::make_shared<const policy::AcceptanceModel>(std::move(current));
  m.next = std::make_shared<const policy::AcceptanceModel>(std::move(next));
  return m;
}

std::shared_ptr<const policy::RoundCosts> RoundCostsOf(const model::cost::CostModel& cm, int32_t L, int32_t max_draft) {
  auto c = std::make_shared<policy::RoundCosts>();
  c->marginal.assign(L + 1, std::vector<double>(max_draft + 1, 0.0));
  c->round.assign(L + 1, std::vector<double>(max_draft + 1, 0.0));
  for (int32_t l = 1; l < L; ++l) {
    for (int32_t i = 1; i <= max_draft; ++i) {
      c->marginal[l][i] = cm.ControlledDraftToken(l) + cm.Verify(l, i) - (i == 1 ? cm.Step() : cm.Verify(l, i - 1));
      c->round[l][i] = i * cm.ControlledDraftToken(l) + cm.Verify(l, i) + (i + 1) * cm.Decision();
    }
  }
  return c;
}

std::string CalibratedRule::Describe() const {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "calibrated E=%d rho=%.1f", exit_layer, rho);
  return buf;
}

std::unique_ptr<speculation::ExitController> CalibratedRule::Make(const speculation::DecisionSpec& spec) const {
  return std::make_unique<policy::CalibratedStopController>(acceptance.current, exit_layer, rho, costs,
                                                            spec.lookahead_probe, acceptance.next,
                                                            spec.probe_candidates);
}

StatusOr<CalibratedRule> TuneCalibratedRule(const std::vector<ShadowTrace>& traces, const speculation::DecisionSpec& spec,
                                            const model::cost::CostModel& cost) {
  if (traces.empty()) return InvalidArgumentError("calibrated rule: no traces");
  const int32_t L = traces.front().n_layers;
  CalibratedRule best;
  LEDE_ASSIGN_OR_RETURN(best.acceptance, FitAcceptanceModels(traces, spec.trace_window));
  best.costs = RoundCostsOf(cost, L, spec.max_draft_len);
  CalibratedRule candidate = best;
  for (int32_t e : spec.candidate_layers) {
    if (e < 1 || e >= L) continue;
    for (double rho : kCalibratedRhos) {
      candidate.exit_layer = e;
      candidate.rho = rho;
      ControllerMaker make = [&candidate, &spec](int64_t) { return candidate.Make(spec); };
      LEDE_ASSIGN_OR_RETURN(double s, SimulatedSpeedup(traces, spec, make, cost));
      if (s > best.speedup) {
        best.exit_layer = e;
        best.rho = rho;
        best.speedup = s;
      }
    }
  }
  if (best.exit_layer == 0) return InvalidArgumentError("calibrated rule: no candidate layer in [1, L)");
  return best;
}

}  // namespace lede::trainer
