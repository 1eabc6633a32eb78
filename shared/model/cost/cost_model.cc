#include "shared/model/cost/cost_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "shared/model/cost/internal/median.h"
#include "shared/speculation/cost_features.h"
#include "shared/status/status_macros.h"

namespace lede::model::cost {
namespace {

using internal::Median;

class AcceleratorCostModel : public CostModel {
 public:
  explicit AcceleratorCostModel(const checkpoint::ModelConfig& c)
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

// The terms of a_K + g E + d E K at cell (E, K) = (e + 1, k + 1) of a table
// with n_k draft lengths, in the order of the coefficients
// beta = (a_1..a_K, g, d) of FitRoundRows.
std::vector<double> RoundFeatures(size_t n_k, size_t e, size_t k) {
  std::vector<double> x(n_k + 2, 0.0);
  x[k] = 1.0;
  x[n_k] = static_cast<double>(e + 1);
  x[n_k + 1] = static_cast<double>((e + 1) * (k + 1));
  return x;
}

// The fitted cost of cell (e + 1, k + 1) under beta.
double FittedRound(const std::vector<double>& beta, size_t n_k, size_t e, size_t k) {
  const std::vector<double> x = RoundFeatures(n_k, e, k);
  double fit = 0;
  for (size_t p = 0; p < x.size(); ++p) fit += x[p] * beta[p];
  return fit;
}

// The least-absolute-deviations fit of rows [lo, hi) of a round table to
// a_K + g E + d E K (SmoothRoundTable): the coefficients (a_1..a_K, g, d),
// or empty when the system is singular. Iteratively reweighted least
// squares with a fixed number of iterations, so the prices are identical
// run to run: a cell a noisy pass made 20% slow pulls the fit far less
// than in plain least squares.
std::vector<double> FitRoundRows(const std::vector<std::vector<double>>& round_us, size_t lo, size_t hi) {
  const size_t n_k = round_us[0].size(), n = n_k + 2;
  std::vector<double> cells;
  for (size_t e = lo; e < hi; ++e) cells.insert(cells.end(), round_us[e].begin(), round_us[e].end());
  std::vector<double> sorted = cells;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const double floor = 1e-3 * std::max(1e-9, sorted[sorted.size() / 2]);
  std::vector<double> w(cells.size(), 1.0), beta;
  for (int it = 0; it < 50; ++it) {
    std::vector<std::vector<double>> a(n, std::vector<double>(n, 0.0));
    std::vector<double> b(n, 0.0);
    for (size_t e = lo; e < hi; ++e) {
      for (size_t k = 0; k < n_k; ++k) {
        const std::vector<double> x = RoundFeatures(n_k, e, k);
        const double wi = w[(e - lo) * n_k + k], y = cells[(e - lo) * n_k + k];
        for (size_t p = 0; p < n; ++p) {
          if (x[p] == 0.0) continue;
          b[p] += wi * x[p] * y;
          for (size_t q = 0; q < n; ++q) a[p][q] += wi * x[p] * x[q];
        }
      }
    }
    if (!SolveLinear(a, b, &beta)) return {};
    for (size_t e = lo; e < hi; ++e) {
      for (size_t k = 0; k < n_k; ++k) {
        const double fit = FittedRound(beta, n_k, e, k);
        w[(e - lo) * n_k + k] = 1.0 / std::max(std::abs(cells[(e - lo) * n_k + k] - fit), floor);
      }
    }
  }
  return beta;
}

}  // namespace

std::vector<std::vector<double>> SmoothRoundTable(const std::vector<std::vector<double>>& round_us) {
  const size_t n_e = round_us.size(), n_k = n_e == 0 ? 0 : round_us[0].size();
  if (n_e < kMinSmoothedExitLayers || n_k == 0) return round_us;
  for (const auto& row : round_us) {
    if (row.size() != n_k) return round_us;
  }
  // Each row from the fit of the kSmoothingWindowRows rows around it (the
  // window shifted inward at the ends; one fit for a table that short).
  const size_t window = std::min(n_e, kSmoothingWindowRows);
  std::vector<std::vector<double>> out(n_e, std::vector<double>(n_k));
  std::vector<double> beta;
  size_t fitted_lo = n_e;  // the window `beta` belongs to
  for (size_t e = 0; e < n_e; ++e) {
    const size_t lo = std::min(e > window / 2 ? e - window / 2 : 0, n_e - window);
    if (lo != fitted_lo) {
      beta = FitRoundRows(round_us, lo, lo + window);
      if (beta.empty()) return round_us;
      fitted_lo = lo;
    }
    for (size_t k = 0; k < n_k; ++k) {
      const double fit = FittedRound(beta, n_k, e, k);
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

double HeadLayerEquivalents(const checkpoint::ModelConfig& c) {
  const double hd = static_cast<double>(c.head_dim());
  const double block = c.dim * (c.n_heads * hd + 2.0 * c.n_kv_heads * hd)  // wq, wk, wv
                       + c.n_heads * hd * c.dim                            // wo
                       + 3.0 * c.dim * c.hidden_dim;                       // w1, w2, w3
  return static_cast<double>(c.vocab_size) * c.dim / block;
}

std::unique_ptr<CostModel> MakeAcceleratorCostModel(const checkpoint::ModelConfig& config) {
  return std::make_unique<AcceleratorCostModel>(config);
}

std::unique_ptr<CostModel> MakeMeasuredCostModel(const Calibration& calibration) {
  return std::make_unique<MeasuredCostModel>(calibration);
}

std::unique_ptr<CostModel> MakeAcceleratorCostModelAtLoad(const checkpoint::ModelConfig& config, int64_t load,
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
                  double block, double h, double unit, int64_t n_layers)
      : draft_(std::move(draft)), verify_(std::move(verify)), intercept_(intercept), slope_(slope), block_(block),
        h_(h), unit_(unit), n_layers_(n_layers) {}
  std::string name() const override { return "served"; }
  double DraftToken(int64_t l) const override {
    if (l >= 1 && l < static_cast<int64_t>(draft_.size()) && draft_[l] > 0) return draft_[l] / unit_;
    return (static_cast<double>(l) + h_) * block_;
  }
  double Verify(int64_t e, int64_t k) const override {
    if (k <= 0) return 1.0;
    if (intercept_ > 0) {  // the line, on drafts verified at the middle exit layer
      const double drafts = speculation::MiddleExitLayerDrafts(n_layers_, h_, e, k);
      return std::max(unit_, intercept_ + slope_ * drafts) / unit_;
    }
    if (k < static_cast<int64_t>(verify_.size()) && verify_[k] > 0) return verify_[k] / unit_;
    for (int64_t j = std::min<int64_t>(k, static_cast<int64_t>(verify_.size())) - 1; j >= 1; --j) {
      if (verify_[j] > 0) return verify_[j] / unit_;  // at least what fewer drafts cost
    }
    return 1.0;
  }
  double Probe() const override { return h_ * block_; }

 private:
  std::vector<double> draft_, verify_;
  double intercept_, slope_, block_, h_, unit_;
  int64_t n_layers_;
};

}  // namespace

StatusOr<std::unique_ptr<CostModel>> MakeServedCostModel(const checkpoint::ModelConfig& config, const ServedStepCosts& costs) {
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
  const bool line = std::isfinite(costs.verify_slope_s) && std::isfinite(costs.verify_intercept_s) &&
                    costs.verify_intercept_s > 0;
  return std::unique_ptr<CostModel>(std::make_unique<ServedCostModel>(
      std::move(draft), std::move(verify), line ? costs.verify_intercept_s : 0.0, line ? costs.verify_slope_s : 0.0,
      Median(per_block), h, unit, L));
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

RoundStepTimings::RoundStepTimings(int64_t n_layers) : draft_(static_cast<size_t>(std::max<int64_t>(n_layers, 1)) + 1) {}

void RoundStepTimings::Add(const RoundRecord& r) {
  if (r.n_drafted > 0 && r.exit_layer >= 1 && r.exit_layer < static_cast<int32_t>(draft_.size()) - 1 && r.draft_s > 0) {
    draft_[static_cast<size_t>(r.exit_layer)].push_back(r.draft_s / r.n_drafted);
  }
  if (!TimesAVerification(r)) return;
  const int32_t e = r.n_drafted > 0 ? r.exit_layer : 0;
  if (r.verify_s > 0) verify_[{e, r.n_drafted}].push_back(r.verify_s);
}

ServedStepCosts RoundStepTimings::Costs(double head_layers) const {
  ServedStepCosts c;
  const int64_t L = static_cast<int64_t>(draft_.size()) - 1;
  for (const std::vector<double>& d : draft_) c.draft_step_s.push_back(speculation::Median(d));
  std::vector<std::vector<double>> by_k;
  std::vector<double> x, y;
  for (const auto& [ek, seconds] : verify_) {
    const auto [e, k] = ek;
    if (static_cast<size_t>(k) >= by_k.size()) by_k.resize(static_cast<size_t>(k) + 1);
    by_k[static_cast<size_t>(k)].insert(by_k[static_cast<size_t>(k)].end(), seconds.begin(), seconds.end());
    x.push_back(k == 0 ? 0.0 : speculation::MiddleExitLayerDrafts(L, head_layers, e, k));
    y.push_back(speculation::Median(seconds));
  }
  for (const std::vector<double>& v : by_k) c.verify_s.push_back(speculation::Median(v));
  std::tie(c.verify_intercept_s, c.verify_slope_s) = speculation::TheilSenLine(x, y);
  return c;
}

}  // namespace lede::model::cost
