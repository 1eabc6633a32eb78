#include "shared/model/cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "shared/file/file.h"
#include "shared/model/batch.h"
#include "shared/model/exit_signals.h"
#include "shared/model/torch_boundary.h"
#include "shared/status/status_macros.h"

namespace lede::model {
namespace {

constexpr int64_t kMaxCalibratedPositions = 16;

class AcceleratorCostModel : public CostModel {
 public:
  explicit AcceleratorCostModel(const ModelConfig& c)
      : L_(static_cast<double>(c.n_layers)), h_(HeadLayerEquivalents(c)) {}
  std::string name() const override { return "accelerator"; }
  double DraftToken(int64_t l) const override { return (l + h_) / L_; }
  double Verify(int64_t, int64_t) const override { return 1.0; }
  double Probe() const override { return h_ / L_; }

 private:
  double L_, h_;
};

// The non-decreasing sequence nearest to `y` in least squares (pool
// adjacent violators): a round of more drafts never costs less.
std::vector<double> Isotonic(const std::vector<double>& y) {
  std::vector<double> mean, weight;
  for (double v : y) {
    mean.push_back(v), weight.push_back(1.0);
    while (mean.size() >= 2 && mean[mean.size() - 2] > mean.back()) {
      const double w = weight[weight.size() - 2] + weight.back();
      const double m = (mean[mean.size() - 2] * weight[weight.size() - 2] + mean.back() * weight.back()) / w;
      mean.pop_back(), weight.pop_back();
      mean.back() = m, weight.back() = w;
    }
  }
  std::vector<double> out;
  for (size_t i = 0; i < mean.size(); ++i) out.insert(out.end(), static_cast<size_t>(weight[i]), mean[i]);
  return out;
}

// Solves the n x n system a x = b in place (Gaussian elimination, partial
// pivoting); false when it is singular.
bool SolveLinear(std::vector<std::vector<double>> a, std::vector<double> b, std::vector<double>* x) {
  const size_t n = b.size();
  for (size_t c = 0; c < n; ++c) {
    size_t piv = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[piv][c])) piv = r;
    }
    if (std::abs(a[piv][c]) < 1e-12) return false;
    std::swap(a[c], a[piv]), std::swap(b[c], b[piv]);
    for (size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (size_t j = c; j < n; ++j) a[r][j] -= f * a[c][j];
      b[r] -= f * b[c];
    }
  }
  x->resize(n);
  for (size_t i = 0; i < n; ++i) (*x)[i] = b[i] / a[i][i];
  return true;
}

}  // namespace

std::vector<std::vector<double>> SmoothRoundTable(const std::vector<std::vector<double>>& round_us) {
  const size_t n_e = round_us.size(), n_k = n_e == 0 ? 0 : round_us[0].size();
  if (n_e < kMinSmoothedExitLayers || n_k == 0) return round_us;
  for (const auto& row : round_us) {
    if (row.size() != n_k) return round_us;
  }
  // Unknowns: a_1..a_K, g, d. Cell (E, K): a_K + g E + d E K.
  const size_t n = n_k + 2;
  auto features = [&](size_t e, size_t k) {
    std::vector<double> x(n, 0.0);
    x[k] = 1.0;
    x[n_k] = static_cast<double>(e + 1);
    x[n_k + 1] = static_cast<double>((e + 1) * (k + 1));
    return x;
  };
  std::vector<double> cells;
  for (const auto& row : round_us) cells.insert(cells.end(), row.begin(), row.end());
  std::vector<double> sorted = cells;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const double floor = 1e-3 * std::max(1e-9, sorted[sorted.size() / 2]);
  // Least absolute deviations by iteratively reweighted least squares: a
  // cell a noisy pass made 20% slow pulls the fit far less than in plain
  // least squares. A fixed number of iterations keeps the prices identical
  // run to run.
  std::vector<double> w(cells.size(), 1.0), beta;
  auto fitted = [&](size_t e, size_t k) {
    const std::vector<double> x = features(e, k);
    double fit = 0;
    for (size_t p = 0; p < n; ++p) fit += x[p] * beta[p];
    return fit;
  };
  for (int it = 0; it < 50; ++it) {
    std::vector<std::vector<double>> a(n, std::vector<double>(n, 0.0));
    std::vector<double> b(n, 0.0);
    for (size_t e = 0; e < n_e; ++e) {
      for (size_t k = 0; k < n_k; ++k) {
        const std::vector<double> x = features(e, k);
        const double wi = w[e * n_k + k], y = cells[e * n_k + k];
        for (size_t p = 0; p < n; ++p) {
          if (x[p] == 0.0) continue;
          b[p] += wi * x[p] * y;
          for (size_t q = 0; q < n; ++q) a[p][q] += wi * x[p] * x[q];
        }
      }
    }
    if (!SolveLinear(a, b, &beta)) return round_us;
    for (size_t e = 0; e < n_e; ++e) {
      for (size_t k = 0; k < n_k; ++k) {
        w[e * n_k + k] = 1.0 / std::max(std::abs(cells[e * n_k + k] - fitted(e, k)), floor);
      }
    }
  }
  std::vector<std::vector<double>> out(n_e, std::vector<double>(n_k));
  for (size_t e = 0; e < n_e; ++e) {
    for (size_t k = 0; k < n_k; ++k) {
      const double fit = fitted(e, k);
      out[e][k] = fit > 0 ? fit : round_us[e][k];
    }
  }
  return out;
}

namespace {

class MeasuredCostModel : public CostModel {
 public:
  explicit MeasuredCostModel(Calibration c) : c_(std::move(c)) {
    unit_us_ = c_.round_us.empty() || c_.ar_step_us <= 0 ? c_.step_us : c_.ar_step_us;
    for (const std::vector<double>& row : SmoothRoundTable(c_.round_us)) {
      // Least-squares slope of the round times over K = 1..n: the price of a
      // draft, and of each draft beyond the table.
      const double n = static_cast<double>(row.size());
      double sk = 0, sy = 0, skk = 0, sky = 0;
      for (size_t i = 0; i < row.size(); ++i) {
        const double k = static_cast<double>(i + 1);
        sk += k;
        sy += row[i];
        skk += k * k;
        sky += k * row[i];
      }
      const double den = n * skk - sk * sk;
      const double slope = den > 0 ? std::max(0.0, (n * sky - sk * sy) / den) : 0.0;
      draft_us_.push_back(slope);
      rounds_us_.push_back(Isotonic(row));
    }
  }
  std::string name() const override { return "measured"; }
  double DraftToken(int64_t l) const override {
    if (InTable(l)) return draft_us_[l - 1] / unit_us_;
    return (l * Block(1) + Head(1)) / unit_us_;
  }
  // Within the table, K drafts and their verification cost the round's own
  // entry (made monotone): Verify = entry - K * DraftToken. Beyond it, the
  // last entry plus DraftToken per further draft.
  double Verify(int64_t e, int64_t k) const override {
    if (InTable(e) && k >= 1) {
      const std::vector<double>& row = rounds_us_[e - 1];
      const int64_t at = std::min<int64_t>(k, static_cast<int64_t>(row.size()));
      return std::max(0.0, row[at - 1] - at * draft_us_[e - 1]) / unit_us_;
    }
    return (e * Block(1) + (c_.n_layers - e) * Block(k + 1) + Head(k + 1)) / unit_us_;
  }
  double Probe() const override { return Head(1) / unit_us_; }
  double Decision() const override { return c_.decision_us / unit_us_; }
  double Signals() const override { return c_.signals_us / unit_us_; }

 private:
  static double At(const std::vector<double>& v, int64_t t) {
    const int64_t n = static_cast<int64_t>(v.size());
    if (t <= n) return v[t - 1];
    const double slope = n >= 2 ? v[n - 1] - v[n - 2] : 0.0;  // linear beyond the table
    return v[n - 1] + slope * (t - n);
  }
  bool InTable(int64_t l) const {
    return l >= 1 && l <= static_cast<int64_t>(c_.round_us.size()) && !c_.round_us[l - 1].empty();
  }
  double Block(int64_t t) const { return At(c_.block_us, t); }
  double Head(int64_t t) const { return At(c_.head_us, t); }
  Calibration c_;
  double unit_us_ = 1;
  // Per exit layer: the slope of round_us over K, and the row made
  // non-decreasing in K.
  std::vector<double> draft_us_;
  std::vector<std::vector<double>> rounds_us_;
};

// Another cost model's prices times per-load factors (the cost models at a
// load, cost_model.h): verifications by verify[K] (K = 0 is a plain step,
// factor 1; K beyond the vector takes its last entry), drafts and probes by
// `draft`, decisions and signals by `session`.
class LoadedCostModel : public CostModel {
 public:
  LoadedCostModel(std::unique_ptr<CostModel> base, std::vector<double> verify, double draft, double session)
      : base_(std::move(base)), verify_(std::move(verify)), draft_(draft), session_(session) {}
  std::string name() const override { return base_->name(); }
  double DraftToken(int64_t l) const override { return base_->DraftToken(l) * draft_; }
  double Verify(int64_t e, int64_t k) const override {
    if (k <= 0 || verify_.empty()) return base_->Verify(e, k);
    return base_->Verify(e, k) * verify_[std::min<size_t>(static_cast<size_t>(k), verify_.size()) - 1];
  }
  double Probe() const override { return base_->Probe() * draft_; }
  double Decision() const override { return base_->Decision() * session_; }
  double Signals() const override { return base_->Signals() * session_; }

 private:
  std::unique_ptr<CostModel> base_;
  std::vector<double> verify_;  // [K - 1]
  double draft_, session_;
};

// Batch sizes as the batch tables hold them: distinct, ascending, from 1.
bool AscendingFromOne(const std::vector<int64_t>& sizes) {
  return !sizes.empty() && sizes.front() == 1 && std::is_sorted(sizes.begin(), sizes.end()) &&
         std::adjacent_find(sizes.begin(), sizes.end()) == sizes.end();
}

// What batching B sessions does to the prices, relative to one session
// (MakeMeasuredCostModelAtLoad): verifications of K = 1.. drafts, drafts
// and probes, per-session CPU work (decisions, signals).
struct LoadFactors {
  std::vector<double> verify;  // [K - 1]
  double draft = 1, session = 1;
};

// The factors at timed batch size index i of the calibration's tables.
LoadFactors FactorsAt(const Calibration& c, size_t i) {
  const double s = c.batch_step_us[i], s1 = c.batch_step_us[0];
  LoadFactors f;
  for (size_t k = 0; k < c.batch_verify_us[i].size(); ++k) {
    f.verify.push_back((c.batch_verify_us[i][k] / s) / (c.batch_verify_us[0][k] / s1));
  }
  f.draft = (c.batch_draft_us[i] / s) / (c.batch_draft_us[0] / s1);
  f.session = static_cast<double>(c.batch_sizes[i]) * s1 / s;
  return f;
}

// a + w (b - a), factor by factor.
LoadFactors Lerp(const LoadFactors& a, const LoadFactors& b, double w) {
  LoadFactors f = b;
  for (size_t k = 0; k < f.verify.size(); ++k) f.verify[k] = a.verify[k] + w * (b.verify[k] - a.verify[k]);
  f.draft = a.draft + w * (b.draft - a.draft);
  f.session = a.session + w * (b.session - a.session);
  return f;
}

// The median of `v` (the upper one for an even count); 0 when empty.
double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Times several measurements interleaved: each repetition runs every one of
// them once, in order, so that a change of load on the machine (other
// processes, frequency) during calibration shifts all of them alike instead
// of distorting their ratios, which is what the cost model uses. Returns
// each measurement's median in microseconds.
std::vector<double> InterleavedMedianMicros(int repeats, const std::vector<std::function<void()>>& fns) {
  std::vector<std::vector<double>> us(fns.size());
  for (const auto& fn : fns) fn();  // warm-up
  for (int i = 0; i < repeats; ++i) {
    for (size_t j = 0; j < fns.size(); ++j) {
      auto t0 = std::chrono::steady_clock::now();
      fns[j]();
      us[j].push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::vector<double> out;
  for (auto& v : us) out.push_back(Median(std::move(v)));
  return out;
}

}  // namespace

double CostModel::RoundCost(const RoundRecord& r) const {
  // A controller-driven round (any decision) computes the signals of every
  // probe it pays and of every token it drafts; static rounds compute none.
  const double signals = r.n_decisions > 0 ? (r.n_drafted + r.n_probes) * Signals() : 0.0;
  const double probes = r.n_probes * Probe() + r.n_decisions * Decision() + signals;
  if (r.n_drafted == 0) return Step() + probes;
  return r.n_drafted * DraftToken(r.exit_layer) + Verify(r.exit_layer, r.n_drafted) + probes;
}

double CostModel::PredictedSpeedup(const std::vector<RoundRecord>& rounds) const {
  double cost = 0.0, tokens = 0.0;
  for (const RoundRecord& r : rounds) {
    cost += RoundCost(r);
    tokens += r.n_emitted;
  }
  return cost > 0 ? tokens / cost : 1.0;
}

double HeadLayerEquivalents(const ModelConfig& c) {
  const double hd = static_cast<double>(c.head_dim());
  const double block = c.dim * (c.n_heads * hd + 2.0 * c.n_kv_heads * hd)  // wq, wk, wv
                       + c.n_heads * hd * c.dim                            // wo
                       + 3.0 * c.dim * c.hidden_dim;                       // w1, w2, w3
  return static_cast<double>(c.vocab_size) * c.dim / block;
}

std::unique_ptr<CostModel> MakeAcceleratorCostModel(const ModelConfig& config) {
  return std::make_unique<AcceleratorCostModel>(config);
}

std::unique_ptr<CostModel> MakeMeasuredCostModel(const Calibration& calibration) {
  return std::make_unique<MeasuredCostModel>(calibration);
}

std::unique_ptr<CostModel> MakeAcceleratorCostModelAtLoad(const ModelConfig& config, int64_t load,
                                                          double ridge_tokens) {
  const double b = static_cast<double>(std::max<int64_t>(load, 1));
  const double ridge = ridge_tokens > 0 ? ridge_tokens : kDefaultRidgeTokens;
  const double step = std::max(1.0, b / ridge);
  std::vector<double> verify;
  for (int64_t k = 1; k <= 64; ++k) verify.push_back(std::max(1.0, b * static_cast<double>(k + 1) / ridge) / step);
  return std::make_unique<LoadedCostModel>(MakeAcceleratorCostModel(config), std::move(verify), 1.0, 1.0);
}

namespace {

class ServedCostModel : public CostModel {
 public:
  ServedCostModel(std::vector<double> draft, std::vector<double> verify, double intercept, double slope,
                  double block, double h, double unit)
      : draft_(std::move(draft)), verify_(std::move(verify)), intercept_(intercept), slope_(slope), block_(block),
        h_(h), unit_(unit) {}
  std::string name() const override { return "served"; }
  double DraftToken(int64_t l) const override {
    if (l >= 1 && l < static_cast<int64_t>(draft_.size()) && draft_[l] > 0) return draft_[l] / unit_;
    return (static_cast<double>(l) + h_) * block_;
  }
  double Verify(int64_t, int64_t k) const override {
    if (k >= 0 && k < static_cast<int64_t>(verify_.size()) && verify_[k] > 0) return verify_[k] / unit_;
    double floor = 0;
    for (int64_t j = std::min<int64_t>(k, static_cast<int64_t>(verify_.size())) - 1; j >= 0; --j) {
      if (verify_[j] > 0) {
        floor = verify_[j];
        break;
      }
    }
    const double line = intercept_ + slope_ * static_cast<double>(k);
    return std::max(floor, line > 0 ? line : unit_) / unit_;
  }
  double Probe() const override { return h_ * block_; }

 private:
  std::vector<double> draft_, verify_;
  double intercept_, slope_, block_, h_, unit_;
};

}  // namespace

StatusOr<std::unique_ptr<CostModel>> MakeServedCostModel(const ModelConfig& config, const ServedStepCosts& costs) {
  const int64_t L = config.n_layers;
  if (static_cast<int64_t>(costs.draft_step_s.size()) != L + 1) {
    return InvalidArgumentError("draft_step_s: " + std::to_string(costs.draft_step_s.size()) +
                                " entries for a model of " + std::to_string(L) + " layers (want L + 1)");
  }
  double unit = 0;
  if (!costs.verify_s.empty() && costs.verify_s[0] > 0 && std::isfinite(costs.verify_s[0])) {
    unit = costs.verify_s[0];
  } else if (costs.verify_intercept_s > 0 && std::isfinite(costs.verify_intercept_s)) {
    unit = costs.verify_intercept_s;
  }
  if (unit <= 0) {
    return FailedPreconditionError("verify_s: no autoregressive step measured (verify_s[0] or the line's intercept)");
  }
  const double h = HeadLayerEquivalents(config);
  std::vector<double> draft(costs.draft_step_s.size(), 0.0), per_block;
  for (int64_t l = 1; l <= L; ++l) {
    const double x = costs.draft_step_s[l];
    if (x > 0 && std::isfinite(x)) {
      draft[l] = x;
      per_block.push_back(x / unit / (static_cast<double>(l) + h));
    }
  }
  if (per_block.empty()) return FailedPreconditionError("draft_step_s: no exit layer measured");
  std::vector<double> verify;
  for (double x : costs.verify_s) verify.push_back(x > 0 && std::isfinite(x) ? x : 0.0);
  const double slope = std::isfinite(costs.verify_slope_s) ? costs.verify_slope_s : 0.0;
  const double intercept = std::isfinite(costs.verify_intercept_s) ? costs.verify_intercept_s : 0.0;
  return std::unique_ptr<CostModel>(std::make_unique<ServedCostModel>(std::move(draft), std::move(verify), intercept,
                                                                      slope, Median(per_block), h, unit));
}

StatusOr<std::unique_ptr<CostModel>> MakeMeasuredCostModelAtLoad(const Calibration& c, int64_t load) {
  const size_t n = c.batch_sizes.size();
  if (n == 0) {
    return FailedPreconditionError(
        "calibration has no batch tables: time them with lede calibrate --batch-sizes");
  }
  if (load < 1 || load > c.batch_sizes.back()) {
    return InvalidArgumentError("load: " + std::to_string(load) + " is outside [1, " +
                                std::to_string(c.batch_sizes.back()) + "], the batch sizes of the calibration");
  }
  size_t hi = 0;
  while (c.batch_sizes[hi] < load) ++hi;
  LoadFactors f = FactorsAt(c, hi);
  if (c.batch_sizes[hi] != load) {  // between sizes hi - 1 and hi: linear in log2(B)
    const double x0 = std::log2(static_cast<double>(c.batch_sizes[hi - 1]));
    const double x1 = std::log2(static_cast<double>(c.batch_sizes[hi]));
    f = Lerp(FactorsAt(c, hi - 1), f, (std::log2(static_cast<double>(load)) - x0) / (x1 - x0));
  }
  return std::unique_ptr<CostModel>(
      std::make_unique<LoadedCostModel>(MakeMeasuredCostModel(c), std::move(f.verify), f.draft, f.session));
}

namespace {

// The kernel tables of Calibrate (blocks, head, step, decision).
StatusOr<Calibration> CalibrateKernels(const LlamaModel& model, int repeats, const std::function<void()>& decide) {
  return TorchBoundary("calibrate", [&]() -> StatusOr<Calibration> {
    c10::InferenceMode guard;
    const ModelConfig& c = model.config();
    KvCacheOptions ko;
    ko.capacity = std::min<int64_t>(c.max_seq_len, 256);
    ko.device = model.options().device;
    ko.dtype = model.options().dtype;
    LEDE_ASSIGN_OR_RETURN(KvCache cache, KvCache::Create(c, ko));
    const int64_t start = std::min<int64_t>(64, ko.capacity - kMaxCalibratedPositions - 1);
    auto opts = at::TensorOptions().device(ko.device).dtype(ko.dtype);
    const bool cuda = ko.device.is_cuda();
    auto sync = [&]() {
      if (cuda) at::zeros({1}, opts).cpu();  // waits for queued kernels
    };
    Calibration cal;
    cal.model_fingerprint = c.ArchitectureFingerprint();
    cal.device = ko.device.str();
    cal.n_layers = c.n_layers;
    cal.threads = at::get_num_threads();
    // A block is timed as a pass through all L blocks divided by L, so that
    // each block's weights come from where they live during decoding (a
    // single block timed in a loop would keep its weights in L2 and look
    // cheaper than it is).
    std::vector<at::Tensor> hidden;
    for (int64_t t = 1; t <= kMaxCalibratedPositions; ++t) hidden.push_back(at::randn({1, t, c.dim}, opts));
    at::Tensor token = at::full({1, 1}, c.bos_id, at::TensorOptions().dtype(at::kLong).device(ko.device));
    volatile float sink = 0;
    std::vector<std::function<void()>> fns;
    for (const at::Tensor& h : hidden) {
      fns.push_back([&, h] {
        model.Forward(h, 0, c.n_layers, start, &cache, 0);
        sync();
      });
      fns.push_back([&, h] {
        model.ExitLogits(h);
        sync();
      });
    }
    // The signals and the decision, each timed right after a full step, as
    // the decoding loop runs them: the signals over the logits that step
    // just wrote, the decision after the step's weights have gone through
    // the caches. (On lede-tiny, signals over logits left from before
    // the step measured 7-8 us here, over the step's own logits 6 us here
    // and 2-4 us in a loop of steps and probes.)
    at::Tensor step_logits;  // set by every step before the signals read it
    auto step = [&] {
      at::Tensor h = model.Forward(model.Embed(token), 0, c.n_layers, start, &cache, 0);
      step_logits = model.ExitLogits(h).view({-1});
      step_logits.argmax().item<int64_t>();
    };
    fns.push_back(step);  // the autoregressive step (step_us)
    fns.push_back([&] { sink = sink + ComputeExitSignals(step_logits, 4).entropy; });
    fns.push_back(step);
    fns.push_back([&] {
      if (decide) decide();
    });
    const std::vector<double> us = InterleavedMedianMicros(repeats, fns);
    for (int64_t t = 0; t < kMaxCalibratedPositions; ++t) {
      cal.block_us.push_back(us[2 * t] / c.n_layers);
      cal.head_us.push_back(us[2 * t + 1]);
    }
    cal.step_us = us[2 * kMaxCalibratedPositions];
    cal.signals_us = us[2 * kMaxCalibratedPositions + 1];
    cal.decision_us = decide ? us[2 * kMaxCalibratedPositions + 3] : 0.0;
    return cal;
  });
}

Status CalibrateRoundsOnPrompts(const LlamaModel& model, int passes, int64_t max_k,
                                const std::vector<std::vector<int32_t>>& prompts, int64_t new_tokens,
                                Calibration* cal);

// round_us[E-1][K-1] = the median of ratios[E-1][K-1] (round time over the
// autoregressive step of the same pass) times ar_step_us.
Status FillRoundTable(const std::vector<std::vector<std::vector<double>>>& ratios, double ar_step_us,
                      Calibration* cal) {
  cal->ar_step_us = ar_step_us;
  cal->round_us.assign(ratios.size(), std::vector<double>());
  for (size_t e = 0; e < ratios.size(); ++e) {
    for (const std::vector<double>& r : ratios[e]) {
      if (r.empty()) return InternalError("calibrate: no round of K drafts was timed");
      cal->round_us[e].push_back(Median(r) * ar_step_us);
    }
  }
  return OkStatus();
}

// The round table of Calibrate (see the header): interleaved passes over
// every (E, K), each timed against the autoregressive steps just before it.
Status CalibrateRounds(const LlamaModel& model, int passes, int64_t max_k,
                       const std::vector<std::vector<int32_t>>& prompts, int64_t new_tokens, Calibration* cal) {
  const ModelConfig& c = model.config();
  const int64_t L = c.n_layers;
  if (L < 2 || max_k < 1) return OkStatus();
  if (!prompts.empty()) return CalibrateRoundsOnPrompts(model, passes, max_k, prompts, new_tokens, cal);
  KvCacheOptions ko;
  ko.n_slots = 1;
  ko.capacity = std::min<int64_t>(c.max_seq_len, 256);
  ko.max_draft_len = max_k;
  ko.device = model.options().device;
  ko.dtype = model.options().dtype;
  // The engine shares the caller's model for this call only.
  std::shared_ptr<const LlamaModel> shared(&model, [](const LlamaModel*) {});
  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(shared, ko));
  // A fixed prompt of 97 tokens, or half the context. Its content does not
  // change the cost of a round, only how many tokens it emits; its length
  // does (attention over the context is a larger share of a many-position
  // verification than of a step): with a 25-token prompt the rounds were
  // priced 12% below what they cost on the benchmark's 32-192-token prompts.
  std::vector<int32_t> prompt = {static_cast<int32_t>(c.bos_id)};
  const int64_t n_prompt = std::min<int64_t>(96, ko.capacity / 2 - 1);
  for (int64_t i = 0; i < n_prompt; ++i) prompt.push_back(static_cast<int32_t>((7 + 131 * i) % c.vocab_size));
  const int64_t rounds_per_config = 6;
  // The first rounds after a prefill are slower than the rest (measured on
  // lede-tiny: autoregressive steps of 795, 765, 675, 648 us after a
  // 97-token prefill against about 500 us warm, and the first static round
  // 1.2-1.4x the later ones): the rounds generations are made of are the
  // warm ones, so the first kWarmupRounds of every timed generation are
  // left out, for the autoregressive reference and the rounds alike.
  constexpr int64_t kWarmupRounds = 4;
  // A small context leaves room for shorter drafts only (at least three
  // rounds of K + 1 tokens after the prompt and the warm-up rounds); none:
  // no round table.
  const int64_t room = ko.capacity - 1 - static_cast<int64_t>(prompt.size());
  max_k = std::min(max_k, room / (kWarmupRounds + 3) - 1);
  if (max_k < 1) return OkStatus();
  // The speed of this machine drifts by 10% and more within seconds (shared
  // cores, frequency): each configuration is timed right after a short
  // autoregressive generation and recorded as a ratio to its steps, and the
  // table is those ratios' medians times the median step.
  std::vector<std::vector<std::vector<double>>> ratios(L - 1, std::vector<std::vector<double>>(max_k));
  std::vector<double> ar_all;
  GenerateOptions ar;
  ar.stop_at_eos = false;
  ar.max_new_tokens = kWarmupRounds + rounds_per_config;
  auto ar_step = [&]() -> StatusOr<double> {
    LEDE_ASSIGN_OR_RETURN(GenerationResult r, engine->Generate(prompt, ar));
    std::vector<double> us;
    for (size_t i = kWarmupRounds; i < r.stats.rounds.size(); ++i) {
      us.push_back(r.stats.rounds[i].latency_s * 1e6);
    }
    ar_all.insert(ar_all.end(), us.begin(), us.end());
    const double m = Median(us);
    if (!(m > 0)) return InternalError("calibrate: no autoregressive round was timed");
    return m;
  };
  for (int pass = 0; pass < passes; ++pass) {
    for (int64_t e = 1; e < L; ++e) {
      for (int64_t k = 1; k <= max_k; ++k) {
        LEDE_ASSIGN_OR_RETURN(const double step, ar_step());
        GenerateOptions o;
        o.stop_at_eos = false;
        o.mode = speculation::SpeculationMode::kStatic;
        o.exit_layer = static_cast<int32_t>(e);
        o.draft_len = static_cast<int32_t>(k);
        // At least rounds_per_config rounds after the warm-up ones, most of
        // them of exactly K drafts.
        o.max_new_tokens = std::min<int64_t>((kWarmupRounds + rounds_per_config) * (k + 1),
                                             ko.capacity - 1 - static_cast<int64_t>(prompt.size()) - k);
        LEDE_ASSIGN_OR_RETURN(GenerationResult r, engine->Generate(prompt, o));
        std::vector<double> us;
        for (size_t i = kWarmupRounds; i < r.stats.rounds.size(); ++i) {
          const RoundRecord& rr = r.stats.rounds[i];
          if (rr.exit_layer == e && rr.n_drafted == k) us.push_back(rr.latency_s * 1e6);
        }
        if (!us.empty()) ratios[e - 1][k - 1].push_back(Median(us) / step);
      }
    }
  }
  return FillRoundTable(ratios, Median(ar_all), cal);
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

// The round table from whole generations of the workload's own prompts (see
// the header): each (E, K) of a pass on the next prompt, against an
// autoregressive generation of the same length on the same prompt, every
// round counted (those right after the prefill too).
Status CalibrateRoundsOnPrompts(const LlamaModel& model, int passes, int64_t max_k,
                                const std::vector<std::vector<int32_t>>& prompts, int64_t new_tokens,
                                Calibration* cal) {
  const ModelConfig& c = model.config();
  const int64_t L = c.n_layers;
  if (new_tokens < 2) return InvalidArgumentError("calibrate: round_new_tokens must be >= 2");
  KvCacheOptions ko;
  ko.n_slots = 1;
  ko.capacity = c.max_seq_len;
  ko.max_draft_len = max_k;
  ko.device = model.options().device;
  ko.dtype = model.options().dtype;
  // Prompts that leave no room for the generation and one round of drafts
  // are not used; none usable is an error naming the flag's field.
  std::vector<std::vector<int32_t>> usable;
  for (const auto& p : prompts) {
    const bool ids_ok = std::all_of(p.begin(), p.end(), [&](int32_t id) { return id >= 0 && id < c.vocab_size; });
    if (!p.empty() && ids_ok && static_cast<int64_t>(p.size()) + new_tokens + max_k + 1 < ko.capacity) {
      usable.push_back(p);
    }
  }
  if (usable.empty()) {
    return InvalidArgumentError("calibrate: no round_prompts prompt fits the context window of " +
                                std::to_string(ko.capacity) + " with " + std::to_string(new_tokens) +
                                " new tokens (or every one has a token id outside the vocabulary)");
  }
  std::shared_ptr<const LlamaModel> shared(&model, [](const LlamaModel*) {});
  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(shared, ko));
  std::vector<std::vector<std::vector<double>>> ratios(L - 1, std::vector<std::vector<double>>(max_k));
  std::vector<double> ar_all;
  size_t next = 0;
  for (int pass = 0; pass < passes; ++pass) {
    for (int64_t e = 1; e < L; ++e) {
      for (int64_t k = 1; k <= max_k; ++k) {
        const std::vector<int32_t>& prompt = usable[next++ % usable.size()];
        GenerateOptions ar;
        ar.stop_at_eos = false;
        ar.max_new_tokens = new_tokens;
        LEDE_ASSIGN_OR_RETURN(GenerationResult a, engine->Generate(prompt, ar));
        std::vector<double> ar_us;
        for (const RoundRecord& rr : a.stats.rounds) ar_us.push_back(rr.latency_s * 1e6);
        const double step = Mean(ar_us);
        if (!(step > 0)) return InternalError("calibrate: no autoregressive round was timed");
        ar_all.insert(ar_all.end(), ar_us.begin(), ar_us.end());
        GenerateOptions o = ar;
        o.mode = speculation::SpeculationMode::kStatic;
        o.exit_layer = static_cast<int32_t>(e);
        o.draft_len = static_cast<int32_t>(k);
        LEDE_ASSIGN_OR_RETURN(GenerationResult r, engine->Generate(prompt, o));
        std::vector<double> us;
        for (const RoundRecord& rr : r.stats.rounds) {
          if (rr.exit_layer == e && rr.n_drafted == k) us.push_back(rr.latency_s * 1e6);
        }
        if (!us.empty()) ratios[e - 1][k - 1].push_back(Mean(us) / step);
      }
    }
  }
  return FillRoundTable(ratios, Mean(ar_all), cal);
}

}  // namespace

Status CalibrateBatches(const LlamaModel& model, int repeats, const std::vector<int64_t>& batch_sizes,
                        int64_t exit_layer, int64_t max_draft_len, int64_t context, Calibration* cal) {
  const ModelConfig& c = model.config();
  if (!AscendingFromOne(batch_sizes) || batch_sizes.back() > 64) {
    return InvalidArgumentError("batch_sizes: want distinct ascending sizes starting at 1, at most 64");
  }
  if (exit_layer < 1 || exit_layer >= c.n_layers) {
    return InvalidArgumentError("exit_layer: " + std::to_string(exit_layer) + " is outside [1, " +
                                std::to_string(c.n_layers) + ")");
  }
  if (max_draft_len < 1 || max_draft_len > 16) return InvalidArgumentError("max_draft_len: must be in [1, 16]");
  if (context < 1 || context + max_draft_len + 2 > c.max_seq_len) {
    return InvalidArgumentError("context: " + std::to_string(context) + " plus the steps must fit max_seq_len " +
                                std::to_string(c.max_seq_len));
  }
  if (repeats < 1) return InvalidArgumentError("repeats: must be >= 1");
  return TorchBoundary("calibrate batches", [&]() -> Status {
    c10::InferenceMode guard;
    const int64_t max_b = batch_sizes.back();
    KvCacheOptions ko;
    ko.n_slots = max_b;
    ko.capacity = std::min<int64_t>(c.max_seq_len, context + max_draft_len + 2);
    ko.max_draft_len = max_draft_len;
    ko.device = model.options().device;
    ko.dtype = model.options().dtype;
    LEDE_ASSIGN_OR_RETURN(KvCache cache, KvCache::Create(c, ko));
    Verifier verifier(model, cache);
    Drafter drafter(model, cache);
    std::vector<int32_t> prompt(static_cast<size_t>(context));
    for (int64_t i = 0; i < context; ++i) prompt[i] = static_cast<int32_t>(1 + (i * 37) % (c.vocab_size - 1));
    const int32_t token = static_cast<int32_t>(std::min<int64_t>(5, c.vocab_size - 1));
    for (int64_t s = 0; s < max_b; ++s) {
      LEDE_RETURN_IF_ERROR(verifier.Prefill(s, prompt).status());
      // Scratch rows for the verifications: K drafts at the exit layer (the
      // values do not matter to the timing, only that the rows exist).
      for (int64_t k = 0; k < max_draft_len; ++k) {
        LEDE_RETURN_IF_ERROR(drafter.DraftStep(s, k, token, exit_layer).status());
      }
    }
    auto reset = [&](int64_t b) {
      for (int64_t s = 0; s < b; ++s) (void)cache.Truncate(s, context);
    };
    std::vector<std::function<void()>> fns;
    for (int64_t b : batch_sizes) {
      std::vector<VerifierWork> steps(b);
      std::vector<std::vector<VerifierWork>> verifies(max_draft_len, std::vector<VerifierWork>(b));
      std::vector<DraftWork> drafts(b);
      for (int64_t s = 0; s < b; ++s) {
        steps[s].slot = s;
        steps[s].tokens = {token};
        for (int64_t k = 1; k <= max_draft_len; ++k) {
          VerifierWork& w = verifies[k - 1][s];
          w.kind = VerifierWork::Kind::kVerify;
          w.slot = s;
          w.exit_layer = exit_layer;
          w.tokens.assign(static_cast<size_t>(k), token);
        }
        drafts[s].slot = s;
        drafts[s].token = token;
        drafts[s].last = exit_layer;
      }
      fns.push_back([&, b, steps] {
        (void)RunVerifierBatch(model, cache, steps);
        reset(b);
      });
      for (int64_t k = 1; k <= max_draft_len; ++k) {
        fns.push_back([&, w = verifies[k - 1]] { (void)RunVerifierBatch(model, cache, w); });
      }
      fns.push_back([&, drafts] { (void)RunDrafterBatch(model, cache, drafts); });
    }
    const std::vector<double> us = InterleavedMedianMicros(repeats, fns);
    cal->batch_sizes = batch_sizes;
    cal->batch_exit_layer = exit_layer;
    cal->batch_context = context;
    cal->batch_step_us.clear();
    cal->batch_verify_us.clear();
    cal->batch_draft_us.clear();
    size_t i = 0;
    for (size_t b = 0; b < batch_sizes.size(); ++b) {
      cal->batch_step_us.push_back(us[i++]);
      cal->batch_verify_us.emplace_back(us.begin() + static_cast<std::ptrdiff_t>(i),
                                        us.begin() + static_cast<std::ptrdiff_t>(i + max_draft_len));
      i += static_cast<size_t>(max_draft_len);
      cal->batch_draft_us.push_back(us[i++]);
    }
    return OkStatus();
  });
}

StatusOr<Calibration> Calibrate(const LlamaModel& model, int repeats, const std::function<void()>& decide,
                                int round_passes, int64_t round_max_draft_len,
                                const std::vector<std::vector<int32_t>>& round_prompts, int64_t round_new_tokens) {
  LEDE_ASSIGN_OR_RETURN(Calibration cal, CalibrateKernels(model, repeats, decide));
  if (round_passes > 0) {
    LEDE_RETURN_IF_ERROR(
        CalibrateRounds(model, round_passes, round_max_draft_len, round_prompts, round_new_tokens, &cal));
  }
  return cal;
}

std::string CalibrationToJson(const Calibration& c) {
  nlohmann::json j;
  j["model_fingerprint"] = c.model_fingerprint;
  j["device"] = c.device;
  j["n_layers"] = c.n_layers;
  j["threads"] = c.threads;
  j["block_us"] = c.block_us;
  j["head_us"] = c.head_us;
  j["step_us"] = c.step_us;
  j["decision_us"] = c.decision_us;
  j["signals_us"] = c.signals_us;
  if (!c.round_us.empty()) {
    j["round_us"] = c.round_us;
    j["ar_step_us"] = c.ar_step_us;
  }
  if (!c.batch_sizes.empty()) {
    j["batch_sizes"] = c.batch_sizes;
    j["batch_exit_layer"] = c.batch_exit_layer;
    j["batch_context"] = c.batch_context;
    j["batch_step_us"] = c.batch_step_us;
    j["batch_verify_us"] = c.batch_verify_us;
    j["batch_draft_us"] = c.batch_draft_us;
  }
  j["units"] = "microseconds; block_us[i] and head_us[i] are for i+1 positions; round_us[E-1][K-1] is a round "
               "of K drafts at exit layer E, ar_step_us an autoregressive round, both timed in the decoding loop";
  return j.dump(2) + "\n";
}

StatusOr<Calibration> CalibrationFromJson(const std::string& text) {
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    Calibration c;
    c.model_fingerprint = j.at("model_fingerprint").get<std::string>();
    c.device = j.at("device").get<std::string>();
    c.n_layers = j.at("n_layers").get<int64_t>();
    c.threads = j.value("threads", int64_t{0});
    c.block_us = j.at("block_us").get<std::vector<double>>();
    c.head_us = j.at("head_us").get<std::vector<double>>();
    c.step_us = j.at("step_us").get<double>();
    c.decision_us = j.value("decision_us", 0.0);
    c.signals_us = j.value("signals_us", 0.0);
    if (c.block_us.empty() || c.head_us.empty() || c.step_us <= 0 || c.n_layers <= 0) {
      return InvalidArgumentError("calibration: empty tables or non-positive step_us/n_layers");
    }
    if (j.contains("round_us")) {
      c.round_us = j.at("round_us").get<std::vector<std::vector<double>>>();
      c.ar_step_us = j.at("ar_step_us").get<double>();
      if (static_cast<int64_t>(c.round_us.size()) != c.n_layers - 1 || c.ar_step_us <= 0) {
        return InvalidArgumentError("calibration: round_us must have n_layers - 1 rows and ar_step_us be positive");
      }
      for (const auto& row : c.round_us) {
        if (row.empty() || row.size() != c.round_us[0].size() ||
            std::any_of(row.begin(), row.end(), [](double v) { return !(v > 0); })) {
          return InvalidArgumentError("calibration: round_us rows must be equally long and positive");
        }
      }
    }
    if (j.contains("batch_sizes")) {
      c.batch_sizes = j.at("batch_sizes").get<std::vector<int64_t>>();
      c.batch_exit_layer = j.at("batch_exit_layer").get<int64_t>();
      c.batch_context = j.value("batch_context", int64_t{0});
      c.batch_step_us = j.at("batch_step_us").get<std::vector<double>>();
      c.batch_verify_us = j.at("batch_verify_us").get<std::vector<std::vector<double>>>();
      c.batch_draft_us = j.at("batch_draft_us").get<std::vector<double>>();
      const size_t n = c.batch_sizes.size();
      auto positive = [](const std::vector<double>& v) {
        return !v.empty() && std::all_of(v.begin(), v.end(), [](double x) { return x > 0; });
      };
      bool ok = AscendingFromOne(c.batch_sizes) && c.batch_step_us.size() == n && c.batch_draft_us.size() == n &&
                c.batch_verify_us.size() == n && positive(c.batch_step_us) && positive(c.batch_draft_us);
      for (size_t b = 0; ok && b < n; ++b) {
        ok = positive(c.batch_verify_us[b]) && c.batch_verify_us[b].size() == c.batch_verify_us[0].size();
      }
      if (!ok) {
        return InvalidArgumentError(
            "calibration: batch_sizes must ascend from 1, and batch_step_us, batch_verify_us (equally long rows) "
            "and batch_draft_us hold one positive entry per size");
      }
    }
    return c;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("calibration JSON: ") + e.what());
  }
}

StatusOr<Calibration> ReadCalibrationFile(const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::string text, file::ReadFile(path));
  return CalibrationFromJson(text);
}

}  // namespace lede::model
