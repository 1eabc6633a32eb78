// File: shared/model/cost/cost_model.h
//
// Cost models of decoding, in units of one full-depth autoregressive step
// (docs/design.md §1 "accelerator cost model"), and the calibration that measures
// this machine's own costs (the models: cost_model.cc; the calibration:
// calibration.cc).
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
#ifndef LEDE_SHARED_MODEL_COST_COST_MODEL_H_
#define LEDE_SHARED_MODEL_COST_COST_MODEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/status/status.h"

namespace lede::model::cost {

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

// docs/design.md §1 accelerator model for a config.
std::unique_ptr<CostModel> MakeAcceleratorCostModel(const checkpoint::ModelConfig& config);
// h = V*d / (weights of one block): the LM head in layer-equivalents.
double HeadLayerEquivalents(const checkpoint::ModelConfig& config);

// Step costs a deployment measured on its own served steps, in seconds
// (lede.v1.CostProfile, filled by the model service's ServedCostMeter:
// shared/experience/served_costs.h; unpacked here so that the engine needs
// no proto). Entries not measured are 0.
struct ServedStepCosts {
  // [L + 1]: seconds per drafted token at exit layer E as served (blocks
  // [0, E) and the exit head, with the round's probes, probe signals and
  // controller decisions spread over its drafts); [0] unused.
  std::vector<double> draft_step_s;
  // [D + 1]: seconds of a verification of K drafts run as a step of its
  // own, at whichever exit layers were served; [0] is an autoregressive
  // step.
  std::vector<double> verify_s;
  // The robust line of a verification's seconds on the drafts it verified,
  // counted as drafts verified at the middle exit layer M = floor(L / 2):
  // K drafts at exit layer E count K (L - E + h) / (L - M + h), h the LM
  // head in layer-equivalents (proto/lede/v1/experience.proto CostProfile;
  // Theil-Sen over the service's window). 0, 0 when not fitted.
  double verify_intercept_s = 0;
  double verify_slope_s = 0;
  std::string weight_format;  // of the deployment that measured them ("q8_0", ...)
  int32_t threads = 0;
  // Example: ServedStepCosts{.draft_step_s = {0, 1.1e-3, 1.9e-3},
  //                          .verify_s = {8e-3, 9e-3, 1e-2}}
};

// Whether a round's verify_s times a verification of its drafts or an
// autoregressive step: not for a round that probed and drafted nothing,
// whose step resumed after the probe's blocks (cheaper than a full one;
// the verifier meters it at the probe's layer, which ServedCostMeter
// ignores).
inline bool TimesAVerification(const RoundRecord& round) { return round.n_drafted > 0 || round.n_probes == 0; }

// The step costs of rounds as a model service meters its served steps
// (shared/experience/served_costs.h ServedCostMeter, whose windows this
// keeps whole): per drafted token at each exit layer (RoundRecord::draft_s
// / n_drafted, the round's probes and decisions included), and each
// verification by the exit layer and drafts it verified (E = K = 0: an
// autoregressive step). A round that probed and drafted nothing is left
// out of the verifications, as the meter leaves it: its step resumed after
// the probe's blocks, cheaper than a full one. Fed the rounds of a
// calibration's generations (Calibration::context_steps,
// TimeStepsInContext) or of a benchmark's own timed runs (lede-bench's
// prediction from the run's own steps, docs/training.md).
// Thread-compatible.
class RoundStepTimings {
 public:
  explicit RoundStepTimings(int64_t n_layers);
  // Adds one round's draft and verification; rounds with a drafted exit
  // layer outside [1, L), or with no timing (0 s), add only what they have.
  void Add(const RoundRecord& round);
  // The medians (seconds; 0 where nothing was timed) and the Theil-Sen line
  // of the verifications through the median of every (E, K), at the drafts
  // they verified counted at the middle exit layer (speculation::
  // MiddleExitLayerDrafts, the LM head `head_layers` layer-equivalents).
  ServedStepCosts Costs(double head_layers) const;

 private:
  std::vector<std::vector<double>> draft_;                          // [L + 1]: seconds per drafted token
  std::map<std::pair<int32_t, int32_t>, std::vector<double>> verify_;  // (E, K) -> seconds
};

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
  // The steps of the round table's generations when it was timed on the
  // workload's prompts (Calibrate round_prompts), as a model service
  // times its served steps (RoundRecord::draft_s / verify_s; in seconds,
  // like a served profile): draft_step_s[E] the median per drafted token
  // at exit layer E, verify_s[K] the median verification of K drafts (K = 0
  // an autoregressive step), and the Theil-Sen line of the verifications
  // on the drafts they verified at the middle exit layer, through the
  // per-(E, K) medians. The features a policy sees of this calibration
  // come from these when present (cost_profiles.h
  // CostFeaturesOfCalibration): steps timed in context cost what they cost
  // in serving, where steps timed apart (block_us, head_us) read their
  // weights from warmer caches. Empty otherwise (and in older files).
  ServedStepCosts context_steps;
  // The controller's decide function given to Calibrate, timed after a
  // full step (0 without one). Files from before signals_us was measured
  // hold both here.
  double decision_us = 0;
  // ProbeSignals over V exit logits (ComputeExitSignals, top-4), timed
  // after a full step (0 in files from before it was measured).
  double signals_us = 0;
  int64_t threads = 0;            // intra-op threads during calibration

  // Batched steps (prices as a function of load), timed when
  // Calibrate is given batch sizes; empty in files without them. For each
  // B = batch_sizes[b] (ascending, the first one 1), the median wall time
  // of one batched step in which B sessions (batch_context committed
  // tokens each) do the same work (shared/model/batch.h):
  //   batch_step_us[b]          B autoregressive steps (RunVerifierBatch)
  //   batch_verify_us[b][K-1]   B verifications of K drafts at
  //                             batch_exit_layer, K = 1..size of the row
  //   batch_draft_us[b]         B draft steps at batch_exit_layer
  //                             (RunDrafterBatch: blocks [0, E) and the head)
  std::vector<int64_t> batch_sizes;
  int64_t batch_exit_layer = 0;
  int64_t batch_context = 0;
  std::vector<double> batch_step_us;
  std::vector<std::vector<double>> batch_verify_us;
  std::vector<double> batch_draft_us;
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

// Calibration::context_steps in a few seconds, without the workload's
// prompts: `passes` interleaved runs of an autoregressive generation and a
// static one at each of `exit_layers` (each in [1, L)) with `draft_len`
// drafts per round, `new_tokens` tokens each, on a fixed synthetic prompt
// of 97 tokens (an engine of its own, one KV slot); every round's draft
// and verification timed as a model service times its served steps. What
// `lede generate` shows a policy priced by the deployment when no
// calibration file is given (on the 5x widening at q8_0, exit layers 1-6,
// 3 drafts, 16 tokens, 2 passes: about 5 s). The draft line of the
// features needs two exit layers in [1, L / 2].
// Errors: kInvalidArgument naming exit_layers, draft_len (outside [1, 16]),
// passes (< 1) or new_tokens (< 2, or the generation does not fit the
// context after the prompt); kInternal on a libtorch failure.
StatusOr<ServedStepCosts> TimeStepsInContext(const LlamaModel& model, const std::vector<int64_t>& exit_layers,
                                             int64_t draft_len, int64_t new_tokens, int passes = 2);

// The batch tables of Calibration (batch_*): for every B of `batch_sizes`
// (ascending, the first 1, at most 64), B sessions of `context` committed
// tokens (a KV pool of its own) run one batched autoregressive step, one
// batched verification of K drafts at `exit_layer` for K = 1..max_draft_len
// and one batched draft step at `exit_layer`, `repeats` interleaved times
// (median); the steps are truncated back after each timing so the context
// stays put. Costs about repeats x sizes x (max_draft_len + 2) batched steps
// (lede-tiny, 20 repeats, B <= 16, K <= 6: about 15 s on one thread).
// Errors: kInvalidArgument naming batch_sizes, exit_layer (outside
// [1, L)), max_draft_len (outside [1, 16]) or context (the steps must fit
// max_seq_len); kInternal on a libtorch failure.
Status CalibrateBatches(const LlamaModel& model, int repeats, const std::vector<int64_t>& batch_sizes,
                        int64_t exit_layer, int64_t max_draft_len, int64_t context, Calibration* calibration);

std::string CalibrationToJson(const Calibration& calibration);
// Errors: kInvalidArgument for bad JSON or missing fields.
StatusOr<Calibration> CalibrationFromJson(const std::string& text);

// CalibrationFromJson of a file. Errors: kNotFound if unreadable; as above.
StatusOr<Calibration> ReadCalibrationFile(const std::string& path);

// The round table with the noise of single cells taken out: each row E
// priced by the fit of round_us[E'-1][K-1] ~ a_K + (g + d K) E' over the
// kSmoothingWindowRows rows E' around it (per draft length K an intercept
// a_K; the cost grows linearly in the exit layer, by g for the split of the
// verification at E and by d per draft token and layer), by least absolute
// deviations. Physically: K drafts through E layers cost K E blocks, the
// verification the rest; a_K holds what does not depend on E (verifying
// K + 1 positions, K exit heads). With 3 passes on the 5x widened
// lede-tiny on a quiet VM, single cells were 20-40% off their neighbours
// (E = 2, K = 2 timed 28.4 ms between 20.0 and 28.1), which priced a
// static E = 2, D = 2 19% under its wall-clock and E = 4, D = 5 25% over;
// with the fit, every method's predicted speed-up on the factor-3 and
// factor-5 tables is within -5% to +7% of its wall-clock
// (docs/benchmarks.md, "Cost-model predictions"). The fit is local because
// the line does not hold over all L - 1 exit layers: on the Emerald Rapids
// VM a q8_0 calibration of the 5x widening timed its three deepest exit
// layers at 1.3-1.9 steps for K = 1 (the shallow ones at 1.05-1.15), and
// one fit over all eleven rows priced the rows of E = 2 5-11% under their
// timed cells and a static E = 2, D = 3 11% under its wall-clock; another
// calibration there put E = 1, K = 1 at 0.89 steps, timed 1.04. The local
// fits keep the rows of E = 1 to 6 within 5% of their timed cells.
// Tables of fewer than kMinSmoothedExitLayers rows are returned unchanged.
// Deterministic (a fixed number of reweighting iterations).
inline constexpr size_t kMinSmoothedExitLayers = 3;
inline constexpr size_t kSmoothingWindowRows = 5;  // E - 2 .. E + 2
std::vector<std::vector<double>> SmoothRoundTable(const std::vector<std::vector<double>>& round_us);

// The measured model from a calibration (T above 16 extrapolates linearly).
// With a round table (all in units of ar_step_us), the table smoothed
// (SmoothRoundTable), then per exit layer E: the
// row round_us[E-1][.] made non-decreasing in K (least squares, pool
// adjacent violators: a round of more drafts never costs less) is the cost
// of a round of K drafts, RoundCost = K * DraftToken(E) + Verify(E, K) with
// DraftToken(E) = d_E, the least-squares slope of the row over K, and
// Verify(E, K) = row[K-1] - K * d_E; beyond the table each further draft
// costs d_E. (A line through the row was the price before; on lede-tiny it
// put a round of one draft at E = 2 9% under its own timed entry.) Exit
// layers outside the table, K = 0 and probes use the block and head tables.
std::unique_ptr<CostModel> MakeMeasuredCostModel(const Calibration& calibration);

// Cost models at a load: B sessions decoding at once, every step of the
// server batching the same kind of work of all B (continuous batching,
// an idealization: in a server the sessions of a step are at
// different phases). Prices stay per session and in units of an
// autoregressive step *at that load*, so a predicted speed-up is against
// autoregressive decoding of the same B sessions batched: under lock-step
// rounds of K drafts and tau emitted tokens per session, B sessions emit
// B * tau tokens in K batched draft steps, one batched verification and B
// sessions' decisions, against B tokens per batched autoregressive step.
//
// Accelerator (roofline): a pass over the weights that processes N tokens
// costs max(1, N / ridge_tokens) of a one-token pass, where ridge_tokens
// is the accelerator's peak FLOP/s over its memory bandwidth in tokens (2
// FLOP per weight per token, 2 bytes per bf16 weight: about 150 on an
// A100, 210 on an H200, 295 on an H100). So at load B an autoregressive
// step costs max(1, B / ridge), a draft token at l costs (l + h) / L of it
// as alone, and a verification of K drafts max(1, B (K + 1) / ridge) /
// max(1, B / ridge): verifying more positions is free until the batch
// fills the ridge, then costs in proportion (vLLM's and TensorRT-LLM's
// reason to draft less at large batches). Attention's KV reads, which grow
// with B, are left out.
inline constexpr double kDefaultRidgeTokens = 256;
std::unique_ptr<CostModel> MakeAcceleratorCostModelAtLoad(const checkpoint::ModelConfig& config, int64_t load,
                                                          double ridge_tokens = kDefaultRidgeTokens);

// Measured: the measured model of `calibration` (its round table prices a
// round alone) scaled by the batch tables. With s_B, v_B(K), d_B the
// batched step, verification and draft times at load B:
//   Verify(E, K)     x (v_B(K) / s_B) / (v_1(K) / s_1)   (K beyond the table: its last entry)
//   DraftToken, Probe  x (d_B / s_B) / (d_1 / s_1)
//   Decision, Signals  x B s_1 / s_B   (per-session CPU work, not batched,
//                                        against a step that B sessions share)
// A load between two timed sizes interpolates the three factors linearly
// in log2(B). These are the engine's prices only: a server also pays per
// round for its RPC hops and scheduling, unbatched and different for a
// round that drafts (two hops in the split deployment) and one that does
// not (docs/benchmarks.md, `lede-bench load`, measures them).
// Errors: kFailedPrecondition if the calibration has no batch tables
// ("lede calibrate --batch-sizes"); kInvalidArgument naming `load` outside
// [1, the largest timed size].
StatusOr<std::unique_ptr<CostModel>> MakeMeasuredCostModelAtLoad(const Calibration& calibration, int64_t load);


// The cost model of a deployment's measured step costs (name "served"),
// in units of its autoregressive step: verify_s[0] when measured, else the
// line's intercept.
//  - DraftToken(E) = draft_step_s[E] / unit where measured; elsewhere
//    (E + h) c, c = the median over the measured E of draft_step_s[E] /
//    (E + h) / unit (one block's share, the exit head h blocks:
//    HeadLayerEquivalents), so that exit layers the policy never chose are
//    priced from those it did.
//  - Verify(E, K) = the line at K drafts at E, (intercept + slope K (L - E
//    + h) / (L - M + h)) / unit, at least 1, when fitted (intercept > 0):
//    the drafted rows run through the verifier's blocks [E, L) and the
//    head, so the exit layer enters, and at E = M the verify feature a
//    policy is shown (experience::ServedCostFeatures: slope / unit) is
//    the slope of this model's Verify(M, K) (CostFeaturesOf). Without a
//    line: verify_s[K] / unit where measured, else that of the largest
//    measured K below, else 1. Verify(E, 0) = 1.
//  - Probe() = h c; Decision() = Signals() = 0: a served draft's time
//    already holds the round's decisions and signals.
// Errors: kInvalidArgument naming draft_step_s when its size is not L + 1;
// kFailedPrecondition when the costs hold no autoregressive step (no
// verify_s[0] and no positive intercept) or no draft entry: nothing to
// price a round with (the caller falls back to its own cost model).
StatusOr<std::unique_ptr<CostModel>> MakeServedCostModel(const checkpoint::ModelConfig& config, const ServedStepCosts& costs);

}  // namespace lede::model::cost

#endif  // LEDE_SHARED_MODEL_COST_COST_MODEL_H_
