#include "shared/model/exit_signals.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "shared/model/cpu/cpu_kernels.h"

namespace lede::model {

speculation::ExitSignals ProbeSignals(const float* x, int64_t V, int64_t top_k) {
  const int64_t k = std::max<int64_t>(1, std::min<int64_t>({top_k, V, kMaxProbeTopK}));
  const int64_t kept = std::min<int64_t>(std::max<int64_t>(k, 2), V);  // the margin needs the top 2
  // Pass 1: the `kept` largest logits (descending) and the argmax.
  float top[kMaxProbeTopK + 1];
  int32_t arg = 0;
  float best = x[0];
  int64_t filled = 0;
  for (int64_t v = 0; v < V; ++v) {
    const float xv = x[v];
    if (xv > best) best = xv, arg = static_cast<int32_t>(v);
    if (filled == kept && xv <= top[kept - 1]) continue;
    int64_t i = filled < kept ? filled++ : kept - 1;
    while (i > 0 && top[i - 1] < xv) {
      top[i] = top[i - 1];
      --i;
    }
    top[i] = xv;
  }
  const float m = best;  // == top[0], the maximum
  // Pass 2: sum exp(x - m) and sum exp(x - m) * (x - m), for the log-sum-exp
  // and the entropy H = lse - E_p[x - m] (both relative to the max).
  double z = 0.0, zx = 0.0;
  cpu::ExpSums(x, V, m, &z, &zx);
  const double lse = std::log(z);  // log sum exp(x - m)
  speculation::ExitSignals s;
  s.top1 = arg;
  s.top1_nll = static_cast<float>(lse);
  s.top1_prob = static_cast<float>(1.0 / z);
  double topk_sum = 0.0;
  for (int64_t i = 0; i < k; ++i) topk_sum += lse - (top[i] - m);
  s.top_k_nll = static_cast<float>(topk_sum / k);
  s.entropy = static_cast<float>(std::max(0.0, lse - zx / z));
  s.margin = filled >= 2 ? top[0] - top[1] : 0.0f;
  return s;
}

speculation::ExitSignals ComputeExitSignals(const at::Tensor& logits, int64_t top_k) {
  at::Tensor l = logits.reshape({-1});
  if (!l.device().is_cpu() || l.scalar_type() != at::kFloat || !l.is_contiguous()) {
    l = l.to(at::kCPU, at::kFloat).contiguous();
  }
  return ProbeSignals(l.data_ptr<float>(), l.numel(), top_k);
}

float Top1Nll(const at::Tensor& logits) { return ComputeExitSignals(logits, 1).top1_nll; }

}  // namespace lede::model
