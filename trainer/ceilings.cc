#include "trainer/ceilings.h"

#include <algorithm>
#include <limits>

#include "trainer/calibrated_rule.h"

namespace lede::trainer {

TraceCost HindsightOracleCost(const ShadowTrace& t, int32_t max_draft, const model::cost::CostModel& cost) {
  const int64_t N = static_cast<int64_t>(t.target.size());
  if (N < 2) return {};
  // f[i]: cost of emitting target[i..N) when target[i-1] is pending.
  std::vector<double> f(N + 1, 0.0);
  for (int64_t i = N - 1; i >= 1; --i) {
    double best = cost.Step() + f[i + 1];
    for (int32_t l = 1; l < t.n_layers; ++l) {
      int64_t run = 0;  // consecutive accepted drafts from i
      while (i + run < N && run < max_draft && t.Accepts(l, i + run)) ++run;
      for (int64_t d = 1; d <= run && i + d + 1 <= N; ++d) {
        best = std::min(best, d * cost.DraftToken(l) + cost.Verify(l, d) + f[i + d + 1]);
      }
    }
    f[i] = best;
  }
  return {static_cast<double>(N - 1), f[1]};
}

AcceptanceTable CalibratedAcceptanceTable(const ShadowTrace& trace, const policy::AcceptanceModel& model,
                                          int32_t trace_window) {
  const auto x = TraceAcceptanceFeatures(trace, trace_window);
  const size_t N = trace.target.size();
  AcceptanceTable p(trace.n_layers, std::vector<double>(N, 0.0));
  for (int32_t l = 1; l < trace.n_layers; ++l) {
    for (size_t t = 1; t < N; ++t) p[l][t] = model.Predict(l, x[l][t]);
  }
  return p;
}

TraceCost BeliefOptimalCost(const ShadowTrace& t, const AcceptanceTable& p, int32_t max_draft,
                            const model::cost::CostModel& cost) {
  const int64_t N = static_cast<int64_t>(t.target.size());
  if (N < 2) return {};
  // v[i]: least expected cost of emitting target[i..N) when target[i-1] is
  // pending; (layer[i], draft[i]) the round that attains it (layer 0: an
  // autoregressive step). A round of d drafts from i that has its first
  // rejection at draft k (k = d: none) emits k + 1 tokens and goes on at
  // i + k + 1; drafts stop one short of the end so that the verifier's token
  // exists, as the oracle's do.
  std::vector<double> v(N + 1, 0.0);
  std::vector<int32_t> layer(N + 1, 0), draft(N + 1, 0);
  for (int64_t i = N - 1; i >= 1; --i) {
    double best = cost.Step() + v[i + 1];
    int32_t best_l = 0, best_d = 0;
    for (int32_t l = 1; l < t.n_layers; ++l) {
      double reach = 1.0;     // P(drafts i..i+k-1 all accepted)
      double tail = 0.0;      // sum over k' < k of P(first rejection at k') * v[i + k' + 1]
      for (int32_t d = 1; d <= max_draft && i + d + 1 <= N; ++d) {
        const double q = p[l][i + d - 1];
        tail += reach * (1.0 - q) * v[i + d];  // first rejection at draft d - 1 (0-based)
        reach *= q;
        const double expected = d * cost.DraftToken(l) + cost.Verify(l, d) + tail + reach * v[i + d + 1];
        if (expected < best) best = expected, best_l = l, best_d = d;
      }
    }
    v[i] = best;
    layer[i] = best_l;
    draft[i] = best_d;
  }
  // The policy acts on its beliefs and pays for what really happens.
  TraceCost out{static_cast<double>(N - 1), 0.0};
  for (int64_t i = 1; i < N;) {
    if (layer[i] == 0) {
      out.cost += cost.Step();
      ++i;
      continue;
    }
    int64_t run = 0;
    while (run < draft[i] && t.Accepts(layer[i], i + run)) ++run;
    out.cost += draft[i] * cost.DraftToken(layer[i]) + cost.Verify(layer[i], draft[i]);
    i += run + 1;
  }
  return out;
}

}  // namespace lede::trainer
