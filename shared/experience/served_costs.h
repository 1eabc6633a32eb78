// File: shared/experience/served_costs.h
//
// The costs a deployment measures on its own served steps (docs/training.md
// "What the policy sees of the hardware"). A model service times every step
// it serves (a drafter: each Draft call, per drafted token at its exit layer;
// a verifier: each verification of K drafts that ran as a step of its own,
// and each batched step by its rows) with the weight format, thread count
// and load it actually runs, and keeps the last `window` timings of each
// entry. A snapshot (lede.v1.CostProfile, proto/lede/v1/experience.proto)
// holds per entry the median of its window, and a Theil-Sen line of the
// verification time on the drafts verified (at the middle exit layer's
// depth); the model service exports it as metrics
// (lede_model_draft_step_seconds{exit_layer}, lede_model_verify_seconds
// {draft_tokens}, lede_model_batch_step_seconds{rows}) and the coordinator
// writes it into every request-log record, so that the retrainer prices the
// rewards with the deployment's real costs (trainer/request_retrain.h)
// rather than a cost model of other hardware. `lede calibrate` stays the
// offline measurement (shared/model/cost/cost_model.h Calibrate).
//
// Why medians over a sliding window: a served step's wall time is noisy
// (other processes on the cores, page faults, a preempted thread: single
// steps 2-3x the typical), and the machine's speed drifts with load and
// temperature; a median ignores the outliers and the window follows the
// drift. Theil-Sen (the median of pairwise slopes) is the robust line
// through the verifications, for K not timed yet.
//
// Torch-free. Thread-safety: ServedCostMeter is thread-safe (one mutex; a
// record costs a window insert and a median of at most `window` numbers).
#ifndef LEDE_SHARED_EXPERIENCE_SERVED_COSTS_H_
#define LEDE_SHARED_EXPERIENCE_SERVED_COSTS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/lede/v1/experience.pb.h"
#include "shared/speculation/cost_features.h"
#include "shared/speculation/exit_controller.h"
#include "shared/status/status.h"

namespace lede::experience {

struct ServedCostMeterOptions {
  int32_t n_layers = 0;       // L: draft entries for exit layers [1, L]; >= 1
  int32_t max_draft_len = 0;  // D: verification entries for K in [0, D]; >= 0
  // Timings kept per entry (the median's window): 64 steps are a few
  // seconds of serving on lede-tiny, long enough that one stall moves no
  // median, short enough to follow a change of load within a minute.
  int32_t window = 64;
  std::string weight_format;  // recorded with every snapshot ("f32", "q8_0", ...)
  int32_t threads = 0;        // intra-op threads, recorded likewise
  // h: the LM head in layer-equivalents (shared/model/cost/cost_model.h
  // HeadLayerEquivalents), with which verifications at different exit
  // layers go on one line (experience.proto CostProfile); >= 0.
  double head_layers = 0;
  // Example: ServedCostMeterOptions{.n_layers = 12, .max_draft_len = 8,
  //                                 .head_layers = 0.2}
};

// The meter's median and verification line (shared/speculation/
// cost_features.h), which `lede calibrate` also fits to its in-context steps.
using speculation::Median;
using speculation::TheilSenLine;

class ServedCostMeter {
 public:
  // Options are checked by Create; the constructor assumes them valid.
  explicit ServedCostMeter(ServedCostMeterOptions options);

  // Errors: kInvalidArgument naming n_layers (< 1), max_draft_len (< 0)
  // or window (< 1).
  static StatusOr<std::unique_ptr<ServedCostMeter>> Create(ServedCostMeterOptions options);

  // A Draft call that drafted `n_drafts` >= 1 tokens at `exit_layer` in
  // [1, L] in `seconds` of compute: one sample of seconds / n_drafts.
  // Returns the entry's new median (seconds per drafted token); samples
  // outside those ranges, or with seconds not finite or < 0, are ignored
  // (returns 0).
  double RecordDraft(int32_t exit_layer, int32_t n_drafts, double seconds);
  // A verification of `n_drafts` K in [1, D] drafts at `exit_layer` E in
  // [1, L) that ran as a step of its own, in `seconds`; K = 0 with E = 0
  // is an autoregressive step. One sample of verify_s[K], and one point
  // (MiddleLayerDrafts(E, K), seconds) of the verification line. Returns
  // the entry's new median, 0 if ignored: samples outside those ranges, a
  // full-depth step resumed at a layer after a probe (K = 0, E > 0: no
  // verification, and cheaper than a step), seconds not finite or < 0.
  double RecordVerify(int32_t exit_layer, int32_t n_drafts, double seconds);
  // K drafts verified at exit layer E in drafts verified at the middle
  // exit layer: speculation::MiddleExitLayerDrafts of this meter's L and h.
  double MiddleLayerDrafts(int32_t exit_layer, int32_t n_drafts) const;
  // A batched verifier step of `rows` >= 1 rows, in `seconds`. Returns the
  // entry's new median, 0 if ignored. At most kMaxBatchEntries distinct row
  // counts are kept (the largest counts beyond it are dropped: rows above
  // that are rare and cost in proportion).
  static constexpr size_t kMaxBatchEntries = 128;
  double RecordBatch(int32_t rows, double seconds);

  // The current profile (see experience.proto CostProfile), stamped `now`.
  lede::v1::CostProfile Snapshot(absl::Time now = absl::Now()) const;

  // True at most once per `interval` (the first call is true): whether a
  // response should carry a snapshot. Thread-safe.
  bool AttachDue(absl::Time now, absl::Duration interval = absl::Seconds(1));

  const ServedCostMeterOptions& options() const { return options_; }

 private:
  using Window = std::deque<double>;
  // Appends `x`, dropping the oldest beyond the window; Push also returns
  // the window's new median.
  void Append(Window& w, double x) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double Push(Window& w, double x) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ServedCostMeterOptions options_;
  mutable absl::Mutex mu_;
  std::vector<Window> draft_ ABSL_GUARDED_BY(mu_);   // [L + 1]
  std::vector<Window> verify_ ABSL_GUARDED_BY(mu_);  // [D + 1]: seconds
  // [D + 1]: MiddleLayerDrafts of each sample of verify_, in step with it.
  std::vector<Window> verify_drafts_ ABSL_GUARDED_BY(mu_);
  std::map<int32_t, Window> batch_ ABSL_GUARDED_BY(mu_);
  absl::Time last_attached_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// `drafter`'s draft entries with `verifier`'s verification and batch
// entries (each process measures its own part); the weight format, threads
// and window of the verifier when it has any entry, else the drafter's;
// the later time. Either may be empty.
lede::v1::CostProfile MergeCostProfiles(const lede::v1::CostProfile& drafter, const lede::v1::CostProfile& verifier);

// The cost features a cost-conditioned policy sees (speculation::
// CostFeatures, docs/training.md "What the policy sees of the hardware")
// from a deployment's measured profile: speculation::MeasuredStepFeatures
// of its entries (in units of its autoregressive step, verify_s[0], else
// the line's intercept; the verify feature the fitted line's slope / unit,
// a draft verified at the middle exit layer, where cost_profiles.h
// CostFeaturesOf prices it). What the profile has not measured comes from
// `prior` (the features of the model service's own cost model, ModelInfo):
// the probe always (a served draft's time holds its probes), the layer
// feature until an exit layer was timed, the verify feature until two
// draft lengths were. No step measured at all: `prior`. A calibration
// timed in context (`lede calibrate --prompts`) shows a policy the same
// function of its own in-context steps (cost_profiles.h
// CostFeaturesOfCalibration), so a policy trained on it is served the
// features it was trained on.
speculation::CostFeatures ServedCostFeatures(const lede::v1::CostProfile& profile,
                                             const speculation::CostFeatures& prior);

// Whether a profile holds enough to price rounds: an autoregressive step
// (verify_s[0], or the fitted line's intercept) and at least one draft
// entry.
bool CanPrice(const lede::v1::CostProfile& profile);

}  // namespace lede::experience

#endif  // LEDE_SHARED_EXPERIENCE_SERVED_COSTS_H_
