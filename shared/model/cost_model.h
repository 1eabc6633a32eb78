// File: shared/model/cost_model.h
//
// Cost models of decoding, in units of one full-depth autoregressive step
// (DESIGN.md §1 "accelerator cost model"), and the calibration that measures
// this machine's own costs.
//
//  - accelerator: memory-bound hardware (GPUs, large models). A verification
//    pass costs 1 whatever its number of positions; an autoregressive step
//    costs 1; drafting one token at exit layer l costs (l + h) / L, where
//    h = V*d / (weights of one block) is the LM head in layer-equivalents;
//    a probe of one more candidate layer costs h / L.
//  - measured: the calibrated wall-clock of this machine. Speculation
//    rounds are priced from real rounds timed in context (Calibration::
//    round_us: K drafts at exit layer E and their verification, as the
//    decoding loop runs them); the per-block and head tables (one block for
//    T = 1..16 positions, the LM head for T positions) price probes and,
//    for files without a round table, everything.
//
// Predicted speed-up = tokens emitted / total cost, against 1 token per unit
// for autoregressive decoding.
#ifndef LEDE_SHARED_MODEL_COST_MODEL_H_
#define LEDE_SHARED_MODEL_COST_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/status/status.h"

namespace lede::model {

class CostModel {
 public:
  virtual ~CostModel() = default;
  virtual std::string name() const = 0;
  // One draft token at exit layer l in [1, L] (l blocks + exit head).
  virtual double DraftToken(int64_t exit_layer) const = 0;
  // Verification of a round of K drafts at exit layer E: layers < E for the
  // last draft, layers >= E for K+1 positions, head for K+1 positions.
  virtual double Verify(int64_t exit_layer, int64_t n_drafts) const = 0;
  // One more candidate-layer probe (exit head on one position).
  virtual double Probe() const = 0;
  // One decision of an exit controller: the controller's own work (a
  // Q-network forward). 0 under the accelerator model; measured by Calibrate.
  virtual double Decision() const { return 0.0; }
  // The probe signals over one exit distribution (exit_signals.h), which a
  // controller-driven round computes for every probe and every draft. 0
  // under the accelerator model; measured by Calibrate.
  virtual double Signals() const { return 0.0; }
  // An autoregressive step: 1 by definition.
  double Step() const { return 1.0; }
  // What a controller-driven round pays per draft at l (the draft and its
  // signals) and per wasted probe (the head and its signals): the prices of
  // rewards and of rule-based controllers, which only such rounds earn.
  double ControlledDraftToken(int64_t exit_layer) const { return DraftToken(exit_layer) + Signals(); }
  double ControlledProbe() const { return Probe() + Signals(); }

  // Cost of one step or round of the decoding loop: K draft tokens at l*,
  // one verification, the probes that drafted nothing (exit heads only:
  // their blocks are shared with the draft or the full-depth step), the
  // controller's decisions and, in a round with any decision, the signals
  // of its K drafts and of its wasted probes.
  double RoundCost(const RoundRecord& round) const;
  // tokens emitted by the rounds / their total cost (1.0 for pure AR).
  double PredictedSpeedup(const std::vector<RoundRecord>& rounds) const;
};

// DESIGN.md §1 accelerator model for a config.
std::unique_ptr<CostModel> MakeAcceleratorCostModel(const ModelConfig& config);
// h = V*d / (weights of one block): the LM head in layer-equivalents.
double HeadLayerEquivalents(const ModelConfig& config);

// Wall-clock costs measured on one machine (microseconds, medians).
//
// Why rounds are timed in context: a block timed in isolation (all L blocks
// / L) reads its weights from where a full step leaves them, but the draft
// steps of a round at a shallow exit layer E re-read only E blocks and the
// head, which stay in the faster caches. Measured on lede-tiny (1 thread):
// 8 drafts at E = 4 and their verification took 0.58x of what the block
// tables predict, 1 draft at E = 11 1.05x; a cost model that charges every
// draft at the cold price teaches policies to draft too little.
struct Calibration {
  std::string model_fingerprint;  // ModelConfig::ArchitectureFingerprint()
  std::string device;             // "cpu", "cuda:0"
  int64_t n_layers = 0;
  std::vector<double> block_us;   // [16]: one block for T = 1..16 positions (all L blocks / L)
  std::vector<double> head_us;    // [16]: final norm + LM head for T positions
  double step_us = 0;             // full autoregressive step incl. embedding and head
  // round_us[E-1][K-1], E in [1, L), K in [1, round_us[0].size()]: median
  // wall time of a static speculation round of the engine's decoding loop
  // (Engine::Generate, RoundRecord::latency_s) that drafted K tokens at
  // exit layer E, verification and acceptance included. Empty in files
  // from before rounds were timed (the cost model then uses the tables
  // above).
  std::vector<std::vector<double>> round_us;
  // Median wall time of an autoregressive round of the same loop (the unit
  // of the cost model when round_us is present; 0 otherwise).
  double ar_step_us = 0;
  // The controller's decide function given to Calibrate, timed after a
  // full step (0 without one). Files from before signals_us was measured
  // hold both here.
  double decision_us = 0;
  // ProbeSignals over V exit logits (ComputeExitSignals, top-4), timed
  // after a full step (0 in files from before it was measured).
  double signals_us = 0;
  int64_t threads = 0;            // intra-op threads during calibration
};

// Times the blocks, head and step of `model` (a scratch KV slot of its own),
// and a decision (the probe signals of one exit distribution, then
// `decide()` when given: the controller's own work, e.g. a Q-network
// forward), `repeats` times each (median), interleaved: every repetition
// times each measurement once, so that load changing during calibration
// shifts all of them alike rather than their ratios.
// Then, when round_passes > 0, the round table: greedy static generations
// (an engine of its own on `model`, one KV slot) at every exit layer E in
// [1, L) and draft length K in [1, round_max_draft_len], `round_passes`
// interleaved passes, each timed against an autoregressive generation just
// before it, as a ratio to its steps (this machine's speed drifts by 10%
// within seconds); an entry is the median ratio over the passes times the
// autoregressive step (ar_step_us). Two ways to choose what is timed:
//  - round_prompts empty: a fixed synthetic prompt of 97 tokens (or half
//    the context); short generations whose first 4 rounds are left out,
//    medians (fewer K when the context is short: three rounds of K + 1
//    tokens must fit after the prompt and those 4).
//  - round_prompts given (the workload's own prompts, token ids with BOS;
//    never evaluation prompts): each (E, K) of a pass runs on the next
//    prompt, round_new_tokens tokens, against an autoregressive generation
//    of the same prompt and length; every round counts, means. Round costs
//    depend on the context length and on how recently a prefill ran (the
//    first steps after a 96-token prefill of lede-tiny take up to 1.6x a
//    warm one: lede_engine_bench --after-prefill), so a table timed this
//    way prices generations as the workload has them. Prompts that do not
//    fit max_seq_len with the generation are skipped; none left is
//    kInvalidArgument naming round_prompts.
// Costs about round_passes x (L - 1) x round_max_draft_len x 2 generations
// (lede-tiny, 15 passes, K <= 6, 64 tokens: about a minute on one thread).
// Errors: kInternal on a libtorch failure; kInvalidArgument as above and
// for round_new_tokens < 2; those of Engine::Generate.
StatusOr<Calibration> Calibrate(const LlamaModel& model, int repeats = 50,
                                const std::function<void()>& decide = nullptr, int round_passes = 5,
                                int64_t round_max_draft_len = 8,
                                const std::vector<std::vector<int32_t>>& round_prompts = {},
                                int64_t round_new_tokens = 64);

std::string CalibrationToJson(const Calibration& calibration);
// Errors: kInvalidArgument for bad JSON or missing fields.
StatusOr<Calibration> CalibrationFromJson(const std::string& text);

// CalibrationFromJson of a file. Errors: kNotFound if unreadable; as above.
StatusOr<Calibration> ReadCalibrationFile(const std::string& path);

// The measured model from a calibration (T above 16 extrapolates linearly).
// With a round table (all in units of ar_step_us), per exit layer E: the
// row round_us[E-1][.] made non-decreasing in K (least squares, pool
// adjacent violators: a round of more drafts never costs less) is the cost
// of a round of K drafts, RoundCost = K * DraftToken(E) + Verify(E, K) with
// DraftToken(E) = d_E, the least-squares slope of the row over K, and
// Verify(E, K) = row[K-1] - K * d_E; beyond the table each further draft
// costs d_E. (A line through the row was the price before; on lede-tiny it
// put a round of one draft at E = 2 9% under its own timed entry.) Exit
// layers outside the table, K = 0 and probes use the block and head tables.
std::unique_ptr<CostModel> MakeMeasuredCostModel(const Calibration& calibration);

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_COST_MODEL_H_
