// File: shared/speculation/cost_features.h
//
// The cost profile a cost-conditioned exit policy sees (ExitState::cost,
// exit_controller.h CostFeatures; docs/training.md "What the policy sees of
// the hardware"), computed from cost tables in units of one autoregressive
// step. One function for every source of costs, so that a policy trained
// on a cost model's features sees the same numbers when served:
//  - a cost model in-process or in training (shared/model/cost/cost_model.h
//    CostFeaturesOf fills the tables from CostModel's prices);
//  - a served deployment's measured step costs (shared/experience/
//    served_costs.h ServedCostFeatures fills them from lede.v1.CostProfile).
// Torch-free, allocation-free apart from the caller's tables.
#ifndef LEDE_SHARED_SPECULATION_COST_FEATURES_H_
#define LEDE_SHARED_SPECULATION_COST_FEATURES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shared/speculation/exit_controller.h"
#include "shared/status/status.h"

namespace lede::speculation {

// Cost tables in units of one autoregressive step; an entry <= 0 (or not
// finite) is "not known" and left out of the fits.
struct CostTables {
  // [L + 1]: one drafted token at exit layer l, l in [1, L) (the draft step
  // as a controller-driven round pays it: blocks [0, l), the exit head and
  // its signals); [0] and [L] unused.
  std::vector<double> draft;
  // [D + 1]: a verification of k drafts, k in [0, D] ([0] an
  // autoregressive step, 1 by definition when known).
  std::vector<double> verify;
  double probe = 0;  // a probe that drafted nothing (an exit head and its signals)
};

// CostFeatures of `tables` (L = draft.size() - 1):
//   probe  = tables.probe (0 when unknown or not finite);
//   layer  = L x the least-squares slope of draft[l] on l over the known
//            entries; with one known entry l, L x (draft[l] - probe) / l;
//            none, 0;
//   verify = what each more drafted token adds to a round beyond its
//            draft's blocks and head: the least-squares slope of
//            verify[k] on k over the known entries (>= 2), plus the
//            intercept of the draft line (at l = 0) above the probe. A cost
//            model may book the verification of a drafted position with
//            the draft (a measured round table does: it times K drafts and
//            their verification together), so only their sum is its price.
// Negative parts (noise in measured tables) are clamped to 0. With the
// accelerator model of a model with L layers and an LM head of h
// layer-equivalents: probe = h / L, layer = 1, verify = 0.
CostFeatures CostFeaturesOfTables(const CostTables& tables);

// The exit layer at which the verify feature prices a verification (M =
// floor(L / 2)): CostFeaturesOf takes Verify(M, K), and a served profile's
// verification line counts drafts at M (MiddleExitLayerDrafts).
inline int64_t MiddleExitLayer(int64_t n_layers) { return n_layers / 2; }

// K drafts verified at exit layer E, counted as drafts verified at the
// middle exit layer M: K (L - E + h) / (L - M + h), the blocks and LM head
// (h layer-equivalents) each drafted row runs through in the verifier, as a
// share of those at M (proto/lede/v1/experience.proto CostProfile
// verify_slope_s). One scale for the served meter (experience::
// ServedCostMeter) and the cost model priced from it (model::cost::
// MakeServedCostModel).
inline double MiddleExitLayerDrafts(int64_t n_layers, double head_layers, int64_t exit_layer, int64_t n_drafts) {
  const double L = static_cast<double>(n_layers), M = static_cast<double>(MiddleExitLayer(n_layers));
  return static_cast<double>(n_drafts) * (L - static_cast<double>(exit_layer) + head_layers) / (L - M + head_layers);
}

// The median of `xs` (the mean of the middle two for an even count); 0 for
// none.
double Median(std::vector<double> xs);

// Theil-Sen line through (x[i], y[i]): slope = the median of the slopes of
// every pair with different x, intercept = the median of y - slope x.
// Returns {intercept, slope}; {0, 0} when fewer than two different x.
// Sen 1968; the breakdown point is 29%: up to that share of outliers
// leaves the line near the bulk's. The verification line of a deployment's
// measured step costs (shared/experience/served_costs.h), whether a model
// service or `lede calibrate` timed them.
std::pair<double, double> TheilSenLine(const std::vector<double>& x, const std::vector<double>& y);

// The cost features of step costs measured as a model service measures its
// served steps (seconds; entries <= 0 or not finite are not measured), in
// units of the autoregressive step: verify_s[0] when measured, else
// `verify_intercept_s`:
//   draft_step_s[E], E in [0, L]: seconds per drafted token at exit layer E
//   verify_s[K], K in [0, D]: seconds of a verification of K drafts
//   verify_intercept_s, verify_slope_s: the verification line in drafts
//     verified at the middle exit layer (0, 0 when not fitted)
// CostFeaturesOfTables over draft_step_s[E] / unit for the exit layers E
// in [1, M] (M = MiddleExitLayer(L): the shallow half, where
// self-speculative policies draft; deeper entries are left out, so that a
// calibration that timed every exit layer and a deployment that served a
// few shallow ones fit the same line) and verify_s / unit, with the verify
// feature slope / unit when the line is fitted. What is not measured comes
// from `prior`: the probe always (a drafted token's time holds its
// probes), the layer feature until an exit layer in [1, M] was timed, the verify feature until a line or two draft lengths were. No
// unit: `prior`. One function for the served profile (experience::
// ServedCostFeatures) and a calibration's in-context steps
// (model::cost::CostFeaturesOfCalibration), so that a policy trained on a
// calibration's features is served the same numbers.
CostFeatures MeasuredStepFeatures(const std::vector<double>& draft_step_s, const std::vector<double>& verify_s,
                                  double verify_intercept_s, double verify_slope_s, const CostFeatures& prior);

// OK when every feature of `f` is finite and >= 0; otherwise
// kInvalidArgument naming the first that is not as `field_prefix` +
// "probe" / "layer" / "verify" (a NaN or a negative cost would reach the
// policy's input).
Status CheckCostFeatures(const CostFeatures& f, const std::string& field_prefix);

}  // namespace lede::speculation

#endif  // LEDE_SHARED_SPECULATION_COST_FEATURES_H_
