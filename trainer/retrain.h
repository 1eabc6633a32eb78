// File: trainer/retrain.h
//
// Batch retraining of the serving exit policy (docs/design.md §3 "trainer (batch
// retraining)", §5): Retrainer::RunOnce() reads the experience shards that
// are new since its last run from an object store, fine-tunes the serving
// policy's Q-network on a replay window of recent experience, evaluates the
// candidate against the serving policy, and publishes it as a new version
// only when it is better. `lede-train --once` (a Kubernetes CronJob) runs it
// once; `lede-train --watch` polls the store and runs it whenever new shards
// appear.
//
// One run:
//  1. List "<experience_prefix>/**/*.lexp" in the store; shards whose keys
//     are in the state checkpoint (processed_shards) are old, the rest new.
//     No new shard (or fewer than min_new_transitions usable new
//     transitions, which stay new and accumulate) ends the run: kNoNewData.
//  2. Replay window: the new shards plus the most recent old ones, up to
//     window_shards shards and window_transitions transitions (most recent
//     first; shards are ordered by key, which ExperienceLogger makes
//     "<prefix>/<UTC date>/<writer>-<seq>", i.e. by date, then by writer).
//  3. Off-policy data, handled knowingly. DQN is off-policy by construction:
//     its Q-learning targets take max_a Q_target(s', a), so a transition
//     (s, a, r, s') is a valid sample of the dynamics whatever policy chose
//     a; the serving policy's greedy records, its exploration records
//     (policy_version "<v>+eps=<e>", from `--epsilon` requests) and those of
//     older versions are all kept. What is *not* comparable is filtered:
//     records of another model (model_fingerprint) or rewarded under another
//     cost model (reward_cost_model) than the serving artifact's, except for
//     a serving policy priced by the deployment's own measured costs
//     (reward_cost_model "served", what the request-log trainer publishes):
//     the coordinator logs transitions priced by the verifier's configured
//     cost model, so they are read and re-priced with the step costs the
//     request log carries (trainer/request_retrain.h ReadServedCostModel,
//     trainer/retrain_pricing.h), which also price the replay (6b); this
//     needs model_dir, and a request log with measured_costs (else
//     kFailedPrecondition). The n-step
//     targets (n = 3) carry the behaviour policy's next actions uncorrected
//     (a small bias, as in Rainbow); the replay window bounds how stale the
//     behaviour policies can be (recency by windowing, not by weights).
//     The report counts transitions and requests per behaviour version and
//     the greedy / exploration split.
//  4. Split by request (IsHeldOut of request_id, trainer/heldout_split.h,
//     so the same request is always on the same side across runs) into
//     training and held-out experience.
//  5. Warm start: the candidate starts from the serving artifact's weights
//     (DqnOptions::initial_network) with the same decision spec, model
//     fingerprint and reward cost model, and is fine-tuned (a smaller lr
//     than a fresh training run) on the training part.
//  6. Evaluate both policies (a) offline on the held-out transitions
//     (EvaluateOffline: TD loss, agreement with the behaviour actions,
//     rejection-sampling return of the greedy policy; under the throughput
//     reward a round's return is its tokens emitted minus its cost in
//     full-depth steps, i.e. tokens gained over autoregressive decoding) and
//     (b), when a model is given, by replaying held-out prompts through the
//     in-process engine (trainer/exit_eval.h RunPrompts, greedy) with each
//     policy: predicted speed-up under the cost model the reward was defined
//     with (deterministic: the main "tokens per unit of compute" measure),
//     acceptance rate, tokens per round, measured tokens/s (wall-clock, a
//     noisy secondary measure).
//  7. Decide: the metric is the replay's predicted speed-up (or, without a
//     model, the held-out matched return); publish iff
//       candidate - serving > publish_margin   (both finite),
//     and always with publish_margin = -inf (a forced rollout).
//     Published: SaveArtifact(policy_root/<version>), report.json beside it,
//     then PublishServingVersion (an atomic rename of SERVING; the policy
//     service and the drafters follow it). Rejected: the artifact and its
//     report go to policy_root/candidates/<version>/ and SERVING is kept.
//  8. Record the new shards and the decision in the state checkpoint
//     (written atomically; also after a rejection, so the same data does not
//     trigger the same run again).
//
// Version names: "r<UTC YYYYMMDD-HHMMSS>" (a "-<k>" suffix if taken) or,
// with version_prefix, "<prefix>-<n>" with n one more than the largest taken;
// either way reserved atomically (trainer/policy_root_lock.h,
// <policy_root>/.reserved/) so that two writers never take one name.
//
// One run at a time per policy root: RunOnce() holds an exclusive flock on
// <policy_root>/retrain.lock (trainer/policy_root_lock.h) from step 1 to
// step 8, and a second RunOnce() on the same root, in this process or
// another, fails at once (IsPolicyRootLocked()) without reading or writing
// anything; the state checkpoint therefore counts every run.
//
// Thread-safety: a Retrainer is not thread-safe; Retrainers of one policy
// root exclude each other through the lock (concurrent writers of one root
// are not supported otherwise, artifact.h).
// Ownership: the Retrainer owns its store handle and, after the first run
// with replay evaluation, the loaded model and engine (kept for --watch).
#ifndef LEDE_TRAINER_RETRAIN_H_
#define LEDE_TRAINER_RETRAIN_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/status/status.h"
#include "policy/dqn/artifact.h"
#include "trainer/dqn.h"
#include "trainer/policy_root_lock.h"  // IsPolicyRootLocked

namespace lede::trainer {
namespace internal {
struct RetrainRun;  // trainer/internal/retrain_run.h
}  // namespace internal

inline constexpr char kRetrainStateFile[] = "retrain_state.json";
inline constexpr char kRetrainReportFile[] = "report.json";
inline constexpr char kCandidatesDir[] = "candidates";
// The calibration the request trainer took of a model that had none
// (RetrainOptions::calibration), in policy_root.
inline constexpr char kOwnCalibrationFile[] = "calibration-cpu.json";

struct RetrainOptions {
  // Where the experience is: an object store URL (file:///abs/dir, a plain
  // path, s3://bucket/prefix?...) and the key prefix of the shards under it
  // ("" = the whole store; shards are found recursively).
  std::string experience_url;
  std::string experience_prefix;
  // The policy root (policies/<model>: version directories + SERVING), a
  // local directory: the serving version is the warm start and the
  // baseline, and new versions are published here.
  std::string policy_root;
  // Where policies are published for the policy services ("" = policy_root
  // alone, a shared file system): an object store URL (s3://bucket/prefix,
  // file:///dir). Each run first mirrors the store's SERVING version into
  // policy_root (seeding an empty store with policy_root's SERVING version)
  // and the store's copy of the state checkpoint; a published version is
  // uploaded with SERVING last (policy/dqn/artifact_store.h), then the state.
  // policy_root can then be scratch space (a Kubernetes emptyDir).
  // Rejected candidates stay in policy_root/candidates only.
  std::string policy_store_url;
  // The state checkpoint; "" = <policy_root>/retrain_state.json.
  std::string state_path;
  // Replay evaluation (step 6b): the model directory ("" = offline
  // evaluation only, and the decision uses the held-out matched return), the
  // measured cost model's calibration ("" = <model_dir>/calibration-cpu.json
  // when the reward was defined under "measured"; the counterfactual trainer
  // then falls back to <policy_root>/kOwnCalibrationFile, which it writes by
  // calibrating the model once, about a minute for lede-tiny, when neither
  // exists), and held-out prompts (a
  // .jsonl with "prompt" or "text" fields): eval_prompt_count of them from
  // line eval_prompt_skip on (skip the prompts the traffic used),
  // eval_new_tokens each. Few prompts x 32-64 tokens keep a run short.
  std::string model_dir;
  std::string calibration;
  std::string eval_prompts;
  int64_t eval_prompt_skip = 0;
  int64_t eval_prompt_count = 4;
  int64_t eval_new_tokens = 48;
  // libtorch intra-op threads for the replay (0 = libtorch's default).
  int32_t eval_threads = 0;
  // Replay window (step 2): at most this many shards and transitions, the
  // new ones first. Bounds memory and how stale a behaviour policy may be.
  int64_t window_shards = 256;
  int64_t window_transitions = 500000;
  // Fewer usable new transitions than this: nothing is trained and the new
  // shards stay new (they accumulate with the next ones).
  int64_t min_new_transitions = 1;
  // Share of requests held out for the offline evaluation, in (0, 1).
  double heldout_fraction = 0.2;
  // Publish iff candidate metric - serving metric > publish_margin (speed-up
  // units with replay evaluation, reward units without). -inf always
  // publishes (a forced rollout), +inf never does (a dry run).
  double publish_margin = 0.01;
  // "" = versions "r<UTC timestamp>"; else "<version_prefix>-<n>".
  std::string version_prefix;
  // Fine-tuning: the DQN options (hidden comes from the serving artifact and
  // initial_network is set by the Retrainer). lr is a fresh run's 1e-3, the
  // one default of trainer/dqn_flags.h: the publish gate (step 7), not a
  // lower rate, keeps a candidate that moved too far from serving.
  DqnOptions dqn = [] {
    DqnOptions o;
    o.epochs = 10;
    o.heldout_fraction = 0;  // the Retrainer holds out by itself (step 4)
    return o;
  }();
  // Which trainer: "counterfactual" trains on the request log
  // (trainer/request_retrain.h: whole logged greedy requests replayed
  // exactly, Dinkelbach, held-out requests; needs model_dir, no prompt
  // file); "td" fine-tunes on logged transitions (the steps above); "auto"
  // (default) is counterfactual when model_dir is set, eval_prompts is not
  // (a prompt file asks for td's replay evaluation) and the store holds
  // request-log shards under requests_prefix; td otherwise.
  std::string trainer = "auto";
  std::string requests_prefix = "requests";
  // Counterfactual training effort (Dinkelbach iterations, DQN epochs).
  int32_t counterfactual_iterations = 4;
  int64_t counterfactual_epochs = 16;
  // Called with progress lines ("read 3 new shards ..."); may be null.
  std::function<void(const std::string&)> log;
  // Example:
  //   RetrainOptions o;
  //   o.experience_url = "file:///var/lede/experience";
  //   o.policy_root = "policies/lede-tiny";
  //   o.model_dir = "models/lede-tiny";
  //   o.eval_prompts = "models/lede-tiny/prompts/story.jsonl";
  //   o.eval_prompt_skip = 40;
  //   LEDE_ASSIGN_OR_RETURN(auto retrainer, Retrainer::Create(o));
  //   LEDE_ASSIGN_OR_RETURN(RetrainOutcome r, retrainer->RunOnce());
};

enum class RetrainDecision {
  kNoNewData,  // nothing new (or too little) since the last run; nothing trained (new shards with
               // nothing usable, e.g. another model's, are recorded in the state as read)
  kPublished,  // a new version was saved and SERVING points at it
  kRejected,   // a candidate was trained and evaluated but is not better; SERVING unchanged
};

// "no_new_data", "published", "rejected".
const char* RetrainDecisionName(RetrainDecision decision);

struct RetrainOutcome {
  RetrainDecision decision = RetrainDecision::kNoNewData;
  std::string serving_version;    // SERVING before the run
  std::string candidate_version;  // "" for kNoNewData
  std::string artifact_dir;       // where the candidate was saved ("" for kNoNewData)
  std::string report_path;        // <artifact_dir>/report.json ("" for kNoNewData)
  std::string reason;             // one line: why this decision
  int64_t n_new_shards = 0;
  int64_t n_new_transitions = 0;  // usable ones, after filtering
  // Of the new shards, those skipped in part or whole (truncated, corrupt,
  // unreadable); never fatal.
  int64_t n_bad_shards = 0;
  // Of the new shards, those holding records of another model than the
  // serving policy's: skipped whole by the request-log trainer, their
  // records filtered by the td trainer; each logged once; never fatal.
  int64_t n_other_model_shards = 0;
  // The request log (counterfactual trainer): records in the new shards, and
  // the usable requests (new and recent old ones) traced for training and
  // held-out evaluation. 0 with the td trainer.
  int64_t n_new_requests = 0;
  int64_t n_requests = 0;
  // The decision metric of both policies (NaN when no candidate was
  // evaluated): metric_name "heldout_replay_speedup" (request log, held-out
  // requests replayed exactly), "replay_predicted_speedup" (td with a prompt
  // file) or "heldout_matched_return" (td offline; reward units, not a
  // speed-up).
  std::string metric_name;
  double candidate_metric = std::numeric_limits<double>::quiet_NaN();
  double serving_metric = std::numeric_limits<double>::quiet_NaN();
  // Wall time of training the candidate (request log: also tracing the
  // requests), seconds; 0 when nothing was trained.
  double train_seconds = 0;
  // The whole report (what report.json holds): data range and counts per
  // behaviour version, both policies' offline and replay numbers, the
  // decision and its reason. Empty for kNoNewData.
  nlohmann::json report;
};

// The state checkpoint (JSON, format "lede-retrain-state-v1"): which shards
// have been trained on, and the last run's outcome.
struct RetrainState {
  std::set<std::string> processed_shards;  // object keys
  std::string last_version;    // the last candidate (published or not)
  std::string last_decision;   // RetrainDecisionName
  std::string last_run_utc;    // "YYYY-MM-DDTHH:MM:SSZ"
  int64_t runs = 0;            // runs that trained a candidate
  int64_t published = 0;       // ... and published it
};

// Reads `path`; a missing file is an empty state. Errors: kInvalidArgument
// for unparsable JSON or a wrong format; kInternal if unreadable.
StatusOr<RetrainState> ReadRetrainState(const std::string& path);
// Writes `state` to `path` atomically (write + rename). Errors: kInternal.
Status WriteRetrainState(const std::string& path, const RetrainState& state);

class Retrainer {
 public:
  // Opens the experience store and checks the options. Nothing is read yet.
  // Errors: kInvalidArgument naming the option (empty experience_url or
  // policy_root, heldout_fraction outside (0, 1), window sizes < 1, a DQN
  // option out of range, a bad version_prefix), or the store URL's errors.
  static StatusOr<std::unique_ptr<Retrainer>> Create(RetrainOptions options);
  ~Retrainer();
  Retrainer(const Retrainer&) = delete;
  Retrainer& operator=(const Retrainer&) = delete;

  // One run (the file comment's steps 1-8), holding the policy root's lock.
  // Errors (the state and SERVING are unchanged): kAborted, with
  // IsPolicyRootLocked() true, when another run holds the policy root's lock
  // (the message names its pid); kFailedPrecondition if the
  // policy root has no loadable SERVING version (or is not a directory), or
  // (td trainer) when a served-priced serving policy cannot be priced: no
  // model_dir, or no usable measured_costs in the request log; the store's errors
  // (kUnavailable, ...) when listing; those of TrainDqn, of the replay
  // (model or prompt loading: kNotFound / kInvalidArgument; the engine) and
  // of SaveArtifact / PublishServingVersion / WriteRetrainState (kInternal);
  // with a policy store, those of the mirror and the upload
  // (policy/dqn/artifact_store.h; kFailedPrecondition when neither the store
  // nor policy_root has a SERVING version).
  // Bad shards and shards of another model are reported and skipped, never
  // fatal.
  StatusOr<RetrainOutcome> RunOnce();

  const RetrainOptions& options() const { return options_; }
  // Where the state checkpoint lives.
  std::string state_path() const;

 private:
  explicit Retrainer(RetrainOptions options);
  // RunOnce() once the lock is held.
  StatusOr<RetrainOutcome> RunOnceLocked();
  // The policy store's half of RunOnce (no-ops without one): mirror its
  // SERVING version and state in, upload a published version, the state.
  Status PullFromPolicyStore();
  Status PushToPolicyStore(const RetrainOutcome& out);
  Status PushStateToPolicyStore();
  // RunOnce with the counterfactual trainer on the request log.
  StatusOr<RetrainOutcome> RunOnceOnRequests(const policy::dqn::Artifact& serving, RetrainState state);
  // RunOnce with the td trainer on logged transitions: steps 1-6, then
  // DecideAndPublish (steps 7-8).
  StatusOr<RetrainOutcome> RunOnceOnTransitions(const policy::dqn::Artifact& serving, const RetrainState& state);
  StatusOr<RetrainOutcome> DecideAndPublish(const policy::dqn::PolicyMetadata& smeta,
                                            const policy::dqn::Artifact& candidate, const RetrainState& state,
                                            internal::RetrainRun* run, RetrainOutcome out);
  struct Impl;
  RetrainOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_RETRAIN_H_
