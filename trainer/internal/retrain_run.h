// File: trainer/internal/retrain_run.h
//
// The td retrainer's steps (trainer/retrain.h, steps 1-8 of its file
// comment) as functions over one run's state, RetrainRun, so that
// Retrainer::RunOnce reads as the list of steps; and the replay evaluation
// (step 6b), ReplayEvaluator. Private to trainer/retrain*.cc.
//
// Thread-safety: none; one run at a time per Retrainer (its policy-root
// lock).
#ifndef LEDE_TRAINER_INTERNAL_RETRAIN_RUN_H_
#define LEDE_TRAINER_INTERNAL_RETRAIN_RUN_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "policy/dqn/artifact.h"
#include "policy/dqn/q_network.h"
#include "shared/experience/transition.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/speculation/exit_controller.h"
#include "shared/status/status.h"
#include "shared/storage/object_store.h"
#include "trainer/dqn.h"
#include "trainer/offline_metrics.h"
#include "trainer/policy_root_lock.h"
#include "trainer/retrain.h"

namespace lede::trainer::internal {

// The UTC time now in strftime `format`.
std::string UtcNow(const char* format);

// The folder form of a key prefix ("" stays "", "a" becomes "a/").
std::string FolderPrefix(const std::string& prefix);

// What one RunOnce() gathers, step by step (the numbered steps of
// trainer/retrain.h).
struct RetrainRun {
  // 1. shards under the prefix (List's order), split by the state checkpoint
  std::string prefix;
  std::vector<std::string> keys, new_keys, old_keys;
  // 3. the replay window and what reading it found
  std::vector<experience::Transition> window;
  std::vector<std::string> used_keys, window_sorted;
  int64_t n_read = 0, n_bad_shards = 0, n_new_bad_shards = 0, other_model = 0, other_cost = 0, n_new = 0;
  int64_t n_new_other_model_shards = 0;  // new shards with records of another model
  nlohmann::json bad_shards = nlohmann::json::array();
  // Served pricing: transitions priced by these cost models are read and
  // re-priced to the serving policy's (empty: only its own are read), and
  // how many of each were.
  std::set<std::string> repriceable;
  std::map<std::string, int64_t> repriced;
  // 4. the held-out split
  std::vector<experience::Transition> train, held;
  std::string split_unit = "request";
  // 5-6. training and evaluation
  DqnOptions dqn;
  nlohmann::json epochs = nlohmann::json::array();
  std::optional<DqnResult> trained;  // DqnResult has no empty state
  OfflinePolicyMetrics off_serving, off_candidate;
  nlohmann::json replay;
  // 7. the decision
  std::string metric_name = "heldout_matched_return";
  double cand_metric = 0, serv_metric = 0;
  bool publish = false;
};

// 1. The experience shards under run->prefix, new (not in `state`) and old.
// Errors: those of the store's List().
Status ListShards(storage::ObjectStore& store, const RetrainState& state, RetrainRun* run);

// 2-3. The replay window, most recent first (new shards, then old ones),
// read and filtered to the serving policy's model and reward cost model.
// Unreadable or corrupt shards are counted in run->bad_shards, never fatal.
void ReadWindow(storage::ObjectStore& store, const RetrainOptions& o, const policy::dqn::PolicyMetadata& smeta,
                RetrainRun* run);

// 4. Splits run->window by request (by episode when that leaves a side
// empty). Errors: kFailedPrecondition when either side stays empty.
Status SplitHeldOut(double fraction, RetrainRun* run);

// The candidate's name, reserved (policy_root_lock.h) so that no other
// writer of the root takes it: "<prefix>-<n+1>" after the highest one in
// the policy root, its candidates or the reservations, or "r<UTC time>"
// ("-2", "-3", ... when taken) without a prefix. Errors: those of
// ReserveVersionName.
StatusOr<VersionReservation> ReserveCandidateVersion(const RetrainOptions& o);

// The candidate artifact: the fine-tuned network, the serving policy's
// model, decision spec and cost model, its data and offline metrics.
policy::dqn::Artifact MakeCandidate(const RetrainRun& run, const policy::dqn::PolicyMetadata& smeta,
                                    const std::string& version);

// The retrain report (report.json, format "lede-retrain-report-v1") of a
// decided run.
nlohmann::json RetrainReport(const RetrainRun& run, const RetrainOptions& o, const RetrainOutcome& out,
                             const policy::dqn::PolicyMetadata& smeta, const std::string& store_url);

// 8. The state checkpoint after a decided run: every new shard has been
// trained on; keys no longer in the store are forgotten.
RetrainState NextState(const RetrainState& state, const RetrainRun& run, const RetrainOutcome& out);

// The cost model name of the deployment's logged step costs
// (shared/model/cost/cost_model.h MakeServedCostModel).
inline constexpr char kServedCostModel[] = "served";

// The model and the cost models the td trainer prices with: served pricing
// (the deployment's logged costs, read each run) and step 6b, greedy
// replays of held-out prompts through the in-process engine
// (autoregressive, the serving policy, the candidate). The model (float32),
// engine and prompts are loaded on first use and kept (for --watch).
class ReplayEvaluator {
 public:
  // For a serving policy priced by "served": loads the model and reads the
  // deployment's step costs from the request log under o.requests_prefix
  // (trainer/request_retrain.h ReadServedCostModel), which then price the
  // replay; sets run->repriceable to the other cost models held (the
  // accelerator model; the measured one with a calibration), whose
  // transitions ReadWindow keeps for RepriceWindow. Errors:
  // kFailedPrecondition, naming the serving version, without model_dir,
  // for a model that is not the policy's, or when the log holds no usable
  // measured_costs; those of loading the model and calibration and of the
  // store.
  Status LoadServedCosts(const RetrainOptions& o, storage::ObjectStore& store,
                         const policy::dqn::PolicyMetadata& smeta, RetrainRun* run);
  // Re-prices the window's transitions of run->repriceable cost models to
  // smeta.reward_cost_model (trainer/retrain_pricing.h RepriceExperience),
  // counting them in run->repriced. Needs LoadServedCosts first. Errors:
  // those of RepriceExperience (the window is then partly re-priced and
  // the run must fail).
  Status RepriceWindow(const policy::dqn::PolicyMetadata& smeta, RetrainRun* run) const;

  // Replays the held-out prompts with the serving policy (run->dqn's
  // initial network, `smeta`) and `candidate`; the decision metric becomes
  // the predicted speed-up under smeta.reward_cost_model (run->replay,
  // metric_name, cand_metric, serv_metric; the candidate's offline_metrics
  // get the replay numbers). Errors: kFailedPrecondition when there is no
  // cost model of that name or the model is not the policy's; those of
  // loading the model, tokenizer and prompts (kNotFound, kInvalidArgument)
  // and of the engine.
  Status ReplayCandidate(const RetrainOptions& o, const policy::dqn::PolicyMetadata& smeta,
                         policy::dqn::Artifact* candidate, RetrainRun* run);

 private:
  Status LoadModel(const RetrainOptions& o);
  Status LoadReplay(const RetrainOptions& o, const speculation::DecisionSpec& spec);
  StatusOr<nlohmann::json> Replay(const RetrainOptions& o,
                                  const std::shared_ptr<const policy::dqn::QNetwork>& network,
                                  const policy::dqn::PolicyMetadata* meta);

  std::shared_ptr<const model::LlamaModel> model_;
  std::unique_ptr<model::Engine> engine_;
  std::vector<std::vector<int32_t>> prompts_;
  std::map<std::string, std::unique_ptr<model::cost::CostModel>> cost_models_;  // by name
};

}  // namespace lede::trainer::internal

#endif  // LEDE_TRAINER_INTERNAL_RETRAIN_RUN_H_
