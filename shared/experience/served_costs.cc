#include "shared/experience/served_costs.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "shared/speculation/cost_features.h"

namespace lede::experience {

ServedCostMeter::ServedCostMeter(ServedCostMeterOptions options) : options_(std::move(options)) {
  draft_.resize(static_cast<size_t>(std::max(0, options_.n_layers)) + 1);
  verify_.resize(static_cast<size_t>(std::max(0, options_.max_draft_len)) + 1);
  verify_drafts_.resize(verify_.size());
}

StatusOr<std::unique_ptr<ServedCostMeter>> ServedCostMeter::Create(ServedCostMeterOptions options) {
  if (options.n_layers < 1) return InvalidArgumentError("n_layers: must be >= 1");
  if (options.max_draft_len < 0) return InvalidArgumentError("max_draft_len: must be >= 0");
  if (options.window < 1) return InvalidArgumentError("window: must be >= 1");
  if (!(options.head_layers >= 0) || !std::isfinite(options.head_layers)) {
    return InvalidArgumentError("head_layers: must be finite and >= 0");
  }
  return std::make_unique<ServedCostMeter>(std::move(options));
}

void ServedCostMeter::Append(Window& w, double x) const {
  w.push_back(x);
  while (static_cast<int32_t>(w.size()) > options_.window) w.pop_front();
}

double ServedCostMeter::Push(Window& w, double x) {
  Append(w, x);
  return Median(std::vector<double>(w.begin(), w.end()));
}

namespace {
bool Usable(double seconds) { return std::isfinite(seconds) && seconds >= 0.0; }
}  // namespace

double ServedCostMeter::RecordDraft(int32_t exit_layer, int32_t n_drafts, double seconds) {
  if (exit_layer < 1 || exit_layer > options_.n_layers || n_drafts < 1 || !Usable(seconds)) return 0.0;
  absl::MutexLock lock(&mu_);
  return Push(draft_[exit_layer], seconds / n_drafts);
}

double ServedCostMeter::MiddleLayerDrafts(int32_t exit_layer, int32_t n_drafts) const {
  return speculation::MiddleExitLayerDrafts(options_.n_layers, options_.head_layers, exit_layer, n_drafts);
}

double ServedCostMeter::RecordVerify(int32_t exit_layer, int32_t n_drafts, double seconds) {
  if (n_drafts < 0 || n_drafts > options_.max_draft_len || !Usable(seconds)) return 0.0;
  const bool step = n_drafts == 0 && exit_layer == 0;
  const bool drafted = n_drafts > 0 && exit_layer >= 1 && exit_layer < options_.n_layers;
  if (!step && !drafted) return 0.0;
  absl::MutexLock lock(&mu_);
  Append(verify_drafts_[n_drafts], MiddleLayerDrafts(exit_layer, n_drafts));
  return Push(verify_[n_drafts], seconds);
}

double ServedCostMeter::RecordBatch(int32_t rows, double seconds) {
  if (rows < 1 || !Usable(seconds)) return 0.0;
  absl::MutexLock lock(&mu_);
  auto it = batch_.find(rows);
  if (it == batch_.end()) {
    if (batch_.size() >= kMaxBatchEntries) {
      if (rows > batch_.rbegin()->first) return 0.0;
      batch_.erase(std::prev(batch_.end()));
    }
    it = batch_.emplace(rows, Window()).first;
  }
  return Push(it->second, seconds);
}

lede::v1::CostProfile ServedCostMeter::Snapshot(absl::Time now) const {
  lede::v1::CostProfile p;
  p.set_weight_format(options_.weight_format);
  p.set_threads(options_.threads);
  p.set_window(options_.window);
  p.set_time_us(absl::ToUnixMicros(now));
  absl::MutexLock lock(&mu_);
  for (const Window& w : draft_) {
    p.add_draft_step_s(Median(std::vector<double>(w.begin(), w.end())));
    p.add_draft_step_samples(static_cast<int64_t>(w.size()));
  }
  std::vector<double> xs, ys;
  for (size_t k = 0; k < verify_.size(); ++k) {
    const Window& w = verify_[k];
    p.add_verify_s(Median(std::vector<double>(w.begin(), w.end())));
    p.add_verify_samples(static_cast<int64_t>(w.size()));
    xs.insert(xs.end(), verify_drafts_[k].begin(), verify_drafts_[k].end());
    ys.insert(ys.end(), w.begin(), w.end());
  }
  p.set_head_layers(options_.head_layers);
  const auto [a, b] = TheilSenLine(xs, ys);
  p.set_verify_intercept_s(a);
  p.set_verify_slope_s(b);
  for (const auto& [rows, w] : batch_) {
    p.add_batch_rows(rows);
    p.add_batch_step_s(Median(std::vector<double>(w.begin(), w.end())));
    p.add_batch_samples(static_cast<int64_t>(w.size()));
  }
  return p;
}

bool ServedCostMeter::AttachDue(absl::Time now, absl::Duration interval) {
  absl::MutexLock lock(&mu_);
  if (now - last_attached_ < interval) return false;
  last_attached_ = now;
  return true;
}

namespace {
bool HasAny(const google::protobuf::RepeatedField<int64_t>& samples) {
  return std::any_of(samples.begin(), samples.end(), [](int64_t n) { return n > 0; });
}
}  // namespace

lede::v1::CostProfile MergeCostProfiles(const lede::v1::CostProfile& drafter, const lede::v1::CostProfile& verifier) {
  lede::v1::CostProfile p = verifier;
  p.clear_draft_step_s();
  p.clear_draft_step_samples();
  *p.mutable_draft_step_s() = drafter.draft_step_s();
  *p.mutable_draft_step_samples() = drafter.draft_step_samples();
  const bool verifier_measured = HasAny(verifier.verify_samples()) || HasAny(verifier.batch_samples());
  if (!verifier_measured) {
    p.set_weight_format(drafter.weight_format());
    p.set_threads(drafter.threads());
    p.set_window(drafter.window());
  }
  p.set_time_us(std::max(drafter.time_us(), verifier.time_us()));
  return p;
}

bool CanPrice(const lede::v1::CostProfile& profile) {
  const bool step = (profile.verify_samples_size() > 0 && profile.verify_samples(0) > 0 && profile.verify_s(0) > 0) ||
                    profile.verify_intercept_s() > 0;
  return step && HasAny(profile.draft_step_samples());
}

speculation::CostFeatures ServedCostFeatures(const lede::v1::CostProfile& p, const speculation::CostFeatures& prior) {
  return speculation::MeasuredStepFeatures({p.draft_step_s().begin(), p.draft_step_s().end()},
                                           {p.verify_s().begin(), p.verify_s().end()}, p.verify_intercept_s(),
                                           p.verify_slope_s(), prior);
}

}  // namespace lede::experience
