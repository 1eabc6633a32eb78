#include "shared/model/sampling.h"

#include <algorithm>

#include <ATen/ATen.h>

namespace lede::model {

at::Tensor WarpedProbs(const at::Tensor& logits, const SamplingOptions& options) {
  at::Tensor l = logits.to(at::kCPU, at::kFloat).reshape({-1});
  if (options.greedy()) {
    at::Tensor p = at::zeros_like(l);
    p[l.argmax().item<int64_t>()] = 1.0f;
    return p;
  }
  at::Tensor probs = at::softmax(l / options.temperature, -1);
  if (options.top_p >= 1.0) return probs;
  auto sorted = at::sort(probs, /*dim=*/-1, /*descending=*/true);
  at::Tensor sorted_probs = std::get<0>(sorted);
  at::Tensor order = std::get<1>(sorted);
  at::Tensor cum = at::cumsum(sorted_probs, -1);
  // Keep token j if the mass before it is < top_p (so the crossing token stays).
  at::Tensor drop = at::ge(cum - sorted_probs, options.top_p);
  sorted_probs.masked_fill_(drop, 0.0f);
  at::Tensor out = at::zeros_like(probs);
  out.scatter_(0, order, sorted_probs);
  return out / out.sum();
}

double Sampler::Uniform() {
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
}

int32_t Sampler::Sample(const at::Tensor& probs) {
  at::Tensor p = probs.to(at::kCPU, at::kFloat).contiguous();
  const float* data = p.data_ptr<float>();
  const int64_t n = p.numel();
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += data[i];
  const double u = Uniform() * total;
  double acc = 0.0;
  int32_t last_positive = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (data[i] <= 0.0f) continue;
    acc += data[i];
    last_positive = static_cast<int32_t>(i);
    if (u < acc) return last_positive;
  }
  return last_positive;  // rounding at the top end
}

AcceptResult AcceptGreedy(const std::vector<int32_t>& draft, const at::Tensor& target_logits) {
  at::Tensor targets = target_logits.argmax(-1).to(at::kCPU, at::kLong).contiguous();
  const int64_t* t = targets.data_ptr<int64_t>();
  AcceptResult r;
  while (r.n_accepted < static_cast<int64_t>(draft.size()) && draft[r.n_accepted] == t[r.n_accepted]) {
    ++r.n_accepted;
  }
  r.next_token = static_cast<int32_t>(t[r.n_accepted]);
  return r;
}

AcceptResult AcceptSpeculative(const std::vector<int32_t>& draft, const at::Tensor& draft_probs,
                               const at::Tensor& target_probs, Sampler& sampler) {
  AcceptResult r;
  const int64_t K = static_cast<int64_t>(draft.size());
  for (; r.n_accepted < K; ++r.n_accepted) {
    const int64_t i = r.n_accepted;
    const int32_t x = draft[i];
    const double p = target_probs[i][x].item<float>();
    const double q = draft_probs[i][x].item<float>();
    if (q > 0.0 && sampler.Uniform() < std::min(1.0, p / q)) continue;
    at::Tensor residual = at::clamp_min(target_probs[i] - draft_probs[i], 0.0);
    if (residual.sum().item<float>() <= 0.0f) residual = target_probs[i];  // p == q
    r.next_token = sampler.Sample(residual);
    return r;
  }
  r.next_token = sampler.Sample(target_probs[K]);
  return r;
}

double Top2Margin(const at::Tensor& logits) {
  at::Tensor top = std::get<0>(at::topk(logits.reshape({-1}).to(at::kFloat), 2));
  return (top[0] - top[1]).item<double>();
}

}  // namespace lede::model
