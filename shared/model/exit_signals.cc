#include "shared/model/exit_signals.h"

#include <ATen/ATen.h>

namespace lede::model {

ExitSignals ComputeExitSignals(const at::Tensor& logits, int64_t top_k) {
  at::Tensor lp = at::log_softmax(logits.reshape({-1}).to(at::kFloat), -1);
  at::Tensor top = std::get<0>(at::topk(lp, top_k));
  // One transfer for the three reductions.
  at::Tensor stats = at::stack({top[0], top.mean(), (lp.exp() * lp).sum()}).to(at::kCPU);
  const float* s = stats.data_ptr<float>();
  ExitSignals out;
  out.top1_nll = -s[0];
  out.top1_prob = std::exp(s[0]);
  out.top_k_nll = -s[1];
  out.entropy = -s[2];
  return out;
}

float Top1Nll(const at::Tensor& logits) {
  at::Tensor l = logits.reshape({-1}).to(at::kFloat);
  return (at::logsumexp(l, 0) - l.max()).item<float>();
}

}  // namespace lede::model
