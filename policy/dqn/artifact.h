// File: policy/dqn/artifact.h
//
// Policy artifacts (docs/design.md §5 "Policy artifacts"): one directory per
// policy version, policies/<model>/<version>/, holding
//
//   policy.safetensors  the Q-network (q_network.h), float32, torch layout:
//                         fc1.weight [H, 8]  fc1.bias [H]
//                         fc2.weight [H, H]  fc2.bias [H]
//                         fc3.weight [2, H]  fc3.bias [2]
//   policy.json         metadata (format "lede-dqn-v1"):
//     {"format": "lede-dqn-v1", "version": "...", "model_fingerprint": "...",
//      "features": {"names": [8 names], "dim": 8},
//      "network": {"hidden": H, "activation": "relu",
//                  "actions": ["continue", "exit"]},
//      "candidate_layers": [...], "max_draft_len": D, "top_k": k,
//      "trace_window": W,
//      "reward": {"cost_model": "accelerator"},
//      "gamma": g, "n_step": n, "seed": s, "training_options": {...},
//      "training_data": {"first_shard", "last_shard", "n_shards", ...},
//      "offline_metrics": {"heldout_td_loss": ..., ...},
//      "weights_sha256": "<64 hex digits of policy.safetensors>"}
//
// and beside the versions a serving pointer, policies/<model>/SERVING, whose
// content is the version that drafters and the policy service should run.
// Versions are immutable once written; publishing a version is an atomic
// rename of SERVING, so a reader sees the old or the new pointer, never a
// torn one. policy.json is written last, so a directory without it is an
// unfinished save and loads as kNotFound.
//
// Thread-safety: free functions over the file system; concurrent readers are
// safe, concurrent writers of one directory are not (one trainer publishes).
// Torch-free header; the .cc uses shared/model/loaders/checkpoint.h for safetensors.
#ifndef LEDE_POLICY_DQN_ARTIFACT_H_
#define LEDE_POLICY_DQN_ARTIFACT_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "policy/dqn/q_network.h"
#include "shared/speculation/exit_controller.h"
#include "shared/status/status.h"

namespace lede::policy::dqn {

inline constexpr char kArtifactFormat[] = "lede-dqn-v1";
inline constexpr char kWeightsFile[] = "policy.safetensors";
inline constexpr char kMetadataFile[] = "policy.json";
inline constexpr char kServingFile[] = "SERVING";

// The names of speculation::ExitFeatures' outputs, in order (kExitFeatureDim):
// is_draft_phase, layer_frac, draft_pos_frac, top1_prob, top_k_nll_div4,
// entropy_div4, trace_nll_div4, margin_div8, draft_conf, accept_ema,
// lookup_match, trigram_seen, bias, load_log2_div8, cost_probe,
// cost_layer_div2, cost_verify, temperature_div2. An artifact whose feature
// names differ was trained on other inputs and is refused; one of spec
// lede-features-v3 (the first 13, no load), v4 (the first 14, no cost
// profile) or v5 (the first 17, no temperature) is read with a zero weight
// on what it lacks, which leaves its Q-values exactly as they were.
const std::vector<std::string>& ExitFeatureNames();

// Where the training data came from and how it was split.
struct TrainingDataInfo {
  std::string first_shard;       // first shard file name read (name order)
  std::string last_shard;        // last shard file name read
  int64_t n_shards = 0;          // shard files found
  int64_t n_bad_shards = 0;      // shards with an error (read up to it)
  int64_t n_transitions = 0;     // transitions used (after filtering)
  int64_t n_episodes = 0;        // (request_id, round_index) groups
  int64_t n_requests = 0;        // distinct request ids
  int64_t n_train_transitions = 0;
  int64_t n_heldout_transitions = 0;
  int64_t n_train_episodes = 0;
  int64_t n_heldout_episodes = 0;
  std::vector<std::string> behaviour_versions;  // policy_version values seen, sorted
};

// Everything in policy.json except the network itself.
struct PolicyMetadata {
  std::string version;            // e.g. "v3" or "20250101-1200"; see ValidateVersionName
  std::string model_fingerprint;  // ModelConfig::ArchitectureFingerprint() of the drafting model
  // Where the policy is consulted (candidate_layers, max_draft_len, top_k,
  // trace_window); the features were computed under these settings.
  speculation::DecisionSpec decision;
  std::string reward_cost_model = "accelerator";  // RewardSpec::cost_model of the data
  double gamma = 0;                // discount of the TD targets
  int32_t n_step = 0;              // n of the n-step TD targets
  uint64_t seed = 0;               // training seed
  std::map<std::string, double> training_options;  // lr, batch_size, epochs, ...
  TrainingDataInfo training_data;
  std::map<std::string, double> offline_metrics;   // NaN is stored as null
  // SHA-256 (lowercase hex) of policy.safetensors: set by SaveArtifact,
  // checked and filled by LoadArtifact.
  std::string weights_sha256;
};

struct Artifact {
  PolicyMetadata metadata;
  QNetwork network;
};

// Writes `artifact` under `dir` (created with its parents):
// policy.safetensors first, then policy.json with its SHA-256 (both atomic:
// write + rename). metadata.weights_sha256 is ignored and recomputed.
// Errors: kInvalidArgument for an invalid version name (ValidateVersionName)
// or decision spec; kAlreadyExists if `dir` already holds a policy.json and
// !overwrite (versions are immutable); kInternal on I/O failure or a libtorch
// error (a failed save leaves no policy.json).
Status SaveArtifact(const std::string& dir, const Artifact& artifact, bool overwrite = false);

// Reads and validates the artifact in `dir`. When `expected_fingerprint` is
// not empty, the artifact must have been trained for that model.
// Errors: kNotFound if `dir`, policy.json or policy.safetensors is missing;
// kInvalidArgument, with a message naming the fault, for unparsable JSON, a
// format other than "lede-dqn-v1", a feature spec other than
// kExitFeatureSpec and lede-features-v3 (the message names both), a feature
// dim or feature names other than the spec's, a SHA-256 that does not match
// policy.safetensors ("checksum mismatch"), a missing, unexpected or
// misshapen tensor, non-finite weights, an invalid decision spec, or a model
// fingerprint that differs from `expected_fingerprint`.
StatusOr<Artifact> LoadArtifact(const std::string& dir, const std::string& expected_fingerprint = "");

// --- serving pointer --------------------------------------------------------
// `model_dir` is policies/<model>; version v lives in model_dir/v.

// A version name is 1-128 characters of [A-Za-z0-9._-], not "." or "..",
// and not "SERVING" (so it is a single, safe path component).
// Errors: kInvalidArgument naming the fault.
Status ValidateVersionName(const std::string& version);

// model_dir/version.
std::string VersionDir(const std::string& model_dir, const std::string& version);

// Points model_dir/SERVING at `version` after checking that
// model_dir/version loads (LoadArtifact with `expected_fingerprint`) and that
// its metadata names the same version. The pointer is written to a temporary
// file, fsynced and renamed over SERVING.
// Errors: those of ValidateVersionName and LoadArtifact (the pointer is left
// unchanged); kInvalidArgument if the artifact's version differs; kInternal on
// I/O failure.
Status PublishServingVersion(const std::string& model_dir, const std::string& version,
                             const std::string& expected_fingerprint = "");

// The version model_dir/SERVING names (surrounding whitespace trimmed).
// Errors: kNotFound if there is no SERVING file; kInvalidArgument if its
// content is not a valid version name.
StatusOr<std::string> ResolveServingVersion(const std::string& model_dir);

// The version a SERVING pointer's bytes name (surrounding whitespace
// trimmed), wherever they were read (a file, an object store); `where`
// prefixes the error. Errors: kInvalidArgument for an invalid version name.
StatusOr<std::string> ParseServingPointer(const std::string& text, const std::string& where);

// ResolveServingVersion + LoadArtifact of that version, whose metadata must
// name the same version. Errors: those of both; kInvalidArgument on a
// version mismatch.
StatusOr<Artifact> LoadServingArtifact(const std::string& model_dir,
                                       const std::string& expected_fingerprint = "");

// Of the versions under `model_dir` whose rewards were priced by
// `cost_model` (PolicyMetadata::reward_cost_model), the one trained on the
// most requests (TrainingDataInfo::n_requests: a policy of one domain is not
// the general one), the last by name among equals. Versions that do not
// load (LoadArtifact with `expected_fingerprint`) are skipped. For a host
// whose hardware calls for another cost model than SERVING's (lede generate
// on CUDA). Errors: kNotFound if no version qualifies.
StatusOr<Artifact> LoadBroadestVersion(const std::string& model_dir, const std::string& cost_model,
                                       const std::string& expected_fingerprint = "");


}  // namespace lede::policy::dqn

#endif  // LEDE_POLICY_DQN_ARTIFACT_H_
