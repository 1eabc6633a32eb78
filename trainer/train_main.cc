// lede-train: offline DQN training of the exit policy from experience shards
// (DESIGN.md §2, §5). Reads every complete shard in --experience, a plain
// directory (its *.lexp files, not recursive) or an object store URL
// (file:///abs/dir or s3://bucket/prefix?..., every *.lexp under it,
// recursively, as ExperienceLogger writes them); bad or truncated shards are
// reported and skipped. Then it trains (trainer/dqn.h), prints
// one line per epoch and writes the policy artifact to --out
// (policy/dqn/artifact.h). Publishing it (the SERVING pointer) is a separate
// step, taken only when its held-out metrics beat the serving version.
//
// Retraining modes (trainer/retrain.h): `--once` runs one batch retraining
// pass over the shards new since the last run (a Kubernetes CronJob) and
// `--watch` repeats it every --interval-s seconds until SIGTERM/SIGINT.
// Both warm-start from the SERVING version of --policy-root, evaluate the
// candidate against it (held-out experience, and replaying held-out
// prompts through the in-process engine when --model is given), publish a
// new version only when it beats the serving one by --publish-margin, and
// write report.json beside the artifact.
//
// Example:
//   lede-train --experience out/experience --out policies/stories15M/v2 --version v2 --seed 1
//   lede-train --experience s3://lede/experience/stories15M?region=eu-west-1 --out ...
//   lede-train --once --experience file:///var/lede/exp --policy-root policies/lede-tiny
//     --model models/lede-tiny --eval-prompts models/lede-tiny/prompts/story.jsonl --eval-prompt-skip 40
//   lede-train --watch --interval-s 300 --experience s3://lede/experience --policy-root ...
//
// Exit status: 0 on success (--once: also when nothing was new or the
// candidate was rejected), 1 on a failure, 2 on bad flags.
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "policy/dqn/artifact.h"
#include "shared/flags/flags.h"
#include "shared/storage/object_store.h"
#include "trainer/dqn.h"
#include "shared/experience/experience.h"
#include "trainer/retrain.h"

namespace {

using lede::Status;
using lede::StatusOr;

std::string DefaultVersion() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return buf;
}

std::string JoinSet(const std::set<std::string>& s) {
  std::string out;
  for (const std::string& x : s) out += (out.empty() ? "" : ", ") + ("\"" + x + "\"");
  return out;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "lede-train: %s\n", message.c_str());
  return 1;
}

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

// --once / --watch: Retrainer::RunOnce, once or every interval_s.
int RunRetraining(lede::trainer::RetrainOptions options, bool watch, double interval_s) {
  options.log = [](const std::string& line) {
    std::printf("lede-train: %s\n", line.c_str());
    std::fflush(stdout);
  };
  StatusOr<std::unique_ptr<lede::trainer::Retrainer>> retrainer = lede::trainer::Retrainer::Create(options);
  if (!retrainer.ok()) {
    std::fprintf(stderr, "lede-train: %s\n", std::string(retrainer.status().message()).c_str());
    return retrainer.status().code() == lede::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (watch) {
    std::signal(SIGTERM, OnSignal);
    std::signal(SIGINT, OnSignal);
  }
  while (true) {
    StatusOr<lede::trainer::RetrainOutcome> r = (*retrainer)->RunOnce();
    if (!r.ok()) {
      if (!watch) return Fail(r.status().ToString());
      std::fprintf(stderr, "lede-train: run failed (retrying in %.0f s): %s\n", interval_s,
                   r.status().ToString().c_str());
    } else {
      std::printf("event=retrain decision=%s serving=%s candidate=%s new_shards=%" PRId64
                  " new_transitions=%" PRId64 " report=%s\n",
                  lede::trainer::RetrainDecisionName(r->decision), r->serving_version.c_str(),
                  r->candidate_version.empty() ? "-" : r->candidate_version.c_str(), r->n_new_shards,
                  r->n_new_transitions, r->report_path.empty() ? "-" : r->report_path.c_str());
      std::fflush(stdout);
    }
    if (!watch) return 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(interval_s);
    while (!g_stop.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (g_stop.load()) return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  lede::trainer::DqnOptions o;
  std::string experience_dir, out_dir, version = DefaultVersion(), layers_text, fingerprint, cost_model;
  std::string target_update = "hard";
  int64_t seed = static_cast<int64_t>(o.seed), epochs = o.epochs, n_step = o.n_step, hidden = o.hidden;
  int64_t batch_size = o.batch_size, target_every = o.target_update_every, threads = o.num_threads;
  int64_t max_draft_len = 8, top_k = 4, trace_window = 8;
  bool overwrite = false;
  // Retraining (--once / --watch).
  bool once = false, watch = false;
  lede::trainer::RetrainOptions ro;
  double interval_s = 300, lr = std::nan("");
  int64_t retrain_epochs = ro.dqn.epochs, eval_skip = ro.eval_prompt_skip, eval_count = ro.eval_prompt_count;
  int64_t eval_tokens = ro.eval_new_tokens, eval_threads = 0;

  lede::flags::FlagSet f;
  f.Add("experience", &experience_dir,
        "experience shards (*.lexp): a directory, or a store URL (file:///abs/dir, s3://bucket/prefix?...)", true);
  f.Add("out", &out_dir, "artifact directory to write (policies/<model>/<version>); plain mode");
  f.Add("once", &once, "retrain once: new shards -> warm-started candidate -> publish if better");
  f.Add("watch", &watch, "retrain every --interval-s seconds until SIGTERM");
  f.Add("interval-s", &interval_s, "--watch: seconds between runs");
  f.Add("policy-root", &ro.policy_root, "--once/--watch: policy root (versions + SERVING)");
  f.Add("state", &ro.state_path, "--once/--watch: state checkpoint (default <policy-root>/retrain_state.json)");
  f.Add("experience-prefix", &ro.experience_prefix, "--once/--watch: key prefix of the shards in the store");
  f.Add("model", &ro.model_dir, "--once/--watch: model directory for the replay evaluation (empty: offline only)");
  f.Add("calibration", &ro.calibration, "--once/--watch: measured cost model JSON (default <model>/calibration-cpu.json)");
  f.Add("eval-prompts", &ro.eval_prompts, "--once/--watch: held-out prompts (.jsonl) replayed with each policy");
  f.Add("eval-prompt-skip", &eval_skip, "--once/--watch: prompts skipped at the start of --eval-prompts");
  f.Add("eval-prompt-count", &eval_count, "--once/--watch: prompts replayed");
  f.Add("eval-new-tokens", &eval_tokens, "--once/--watch: tokens generated per replayed prompt");
  f.Add("eval-threads", &eval_threads, "--once/--watch: libtorch threads for the replay (0 = default)");
  f.Add("publish-margin", &ro.publish_margin,
        "--once/--watch: publish iff candidate - serving predicted speed-up > this (-inf forces, inf never)");
  f.Add("window-shards", &ro.window_shards, "--once/--watch: replay window, most recent shards");
  f.Add("window-transitions", &ro.window_transitions, "--once/--watch: replay window, most transitions");
  f.Add("min-new-transitions", &ro.min_new_transitions, "--once/--watch: train only with this many new ones");
  f.Add("heldout-requests", &ro.heldout_fraction, "--once/--watch: share of requests held out");
  f.Add("version-prefix", &ro.version_prefix, "--once/--watch: versions <prefix>-<n> (default r<UTC timestamp>)");
  f.Add("retrain-epochs", &retrain_epochs, "--once/--watch: fine-tuning epochs");
  f.Add("version", &version, "policy version recorded in policy.json (default: UTC timestamp)");
  f.Add("seed", &seed, "training seed (split, minibatches, initial weights)");
  f.Add("epochs", &epochs, "passes over the training transitions");
  f.Add("gamma", &o.gamma, "discount of the TD targets");
  f.Add("n-step", &n_step, "n of the n-step TD targets");
  f.Add("hidden", &hidden, "hidden width H of the Q-network");
  f.Add("batch-size", &batch_size, "transitions per minibatch");
  f.Add("lr", &lr, "Adam learning rate (nan: 1e-3, or 3e-4 with --once/--watch)");
  f.Add("huber-delta", &o.huber_delta, "Huber loss threshold (reward units)");
  f.Add("max-grad-norm", &o.max_grad_norm, "global gradient-norm clip");
  f.Add("target-update", &target_update, "target network update: hard or polyak");
  f.Add("target-update-every", &target_every, "optimizer steps between hard target copies");
  f.Add("polyak-tau", &o.polyak_tau, "Polyak rate per step (--target-update polyak)");
  f.Add("heldout-fraction", &o.heldout_fraction, "share of episodes/requests held out");
  f.Add("threads", &threads, "libtorch intra-op threads");
  f.Add("candidate-layers", &layers_text, "comma-separated candidate exit layers (default: those in the data)");
  f.Add("max-draft-len", &max_draft_len, "D_max the experience was logged with");
  f.Add("top-k", &top_k, "k of C_k^l the experience was logged with");
  f.Add("trace-window", &trace_window, "W of C_trace the experience was logged with");
  f.Add("model-fingerprint", &fingerprint, "train only on this model's transitions (default: the data's only one)");
  f.Add("reward-cost-model", &cost_model, "train only on transitions rewarded under this cost model");
  f.Add("overwrite", &overwrite, "replace an existing artifact in --out");
  if (lede::flags::WantsHelp(std::vector<std::string>(argv + 1, argv + argc))) {
    std::printf("usage: lede-train --experience DIR|URL --out DIR [flags]\n"
                "       lede-train --once|--watch --experience URL --policy-root DIR [--model DIR --eval-prompts F]"
                " [flags]\nflags:\n%s",
                f.Usage().c_str());
    return 0;
  }
  if (Status s = f.Parse(std::vector<std::string>(argv + 1, argv + argc)); !s.ok()) {
    std::fprintf(stderr, "lede-train: %s\nflags:\n%s", std::string(s.message()).c_str(), f.Usage().c_str());
    return 2;
  }
  if (target_update != "hard" && target_update != "polyak") {
    std::fprintf(stderr, "lede-train: --target-update must be hard or polyak\n");
    return 2;
  }
  if (once && watch) {
    std::fprintf(stderr, "lede-train: --once and --watch exclude each other\n");
    return 2;
  }
  if (once || watch) {
    if (ro.policy_root.empty()) {
      std::fprintf(stderr, "lede-train: --once/--watch need --policy-root\n");
      return 2;
    }
    if (!out_dir.empty()) {
      std::fprintf(stderr, "lede-train: --out is for plain training; --once/--watch publish under --policy-root\n");
      return 2;
    }
    if (!(interval_s > 0)) {
      std::fprintf(stderr, "lede-train: --interval-s must be > 0\n");
      return 2;
    }
    ro.experience_url = experience_dir;
    ro.eval_prompt_skip = eval_skip;
    ro.eval_prompt_count = eval_count;
    ro.eval_new_tokens = eval_tokens;
    ro.eval_threads = static_cast<int32_t>(eval_threads);
    lede::trainer::DqnOptions& d = ro.dqn;
    d.seed = static_cast<uint64_t>(seed);
    d.epochs = retrain_epochs;
    d.n_step = static_cast<int32_t>(n_step);
    d.gamma = o.gamma;
    d.batch_size = batch_size;
    if (!std::isnan(lr)) d.lr = lr;
    d.huber_delta = o.huber_delta;
    d.max_grad_norm = o.max_grad_norm;
    d.target_update = target_update == "polyak" ? lede::trainer::TargetUpdate::kPolyak
                                                : lede::trainer::TargetUpdate::kHard;
    d.target_update_every = target_every;
    d.polyak_tau = o.polyak_tau;
    d.num_threads = static_cast<int32_t>(threads);
    return RunRetraining(ro, watch, interval_s);
  }
  if (out_dir.empty()) {
    std::fprintf(stderr, "lede-train: missing --out (or --once/--watch)\nflags:\n%s", f.Usage().c_str());
    return 2;
  }
  if (!std::isnan(lr)) o.lr = lr;
  o.seed = static_cast<uint64_t>(seed);
  o.epochs = epochs;
  o.n_step = static_cast<int32_t>(n_step);
  o.hidden = static_cast<int32_t>(hidden);
  o.batch_size = batch_size;
  o.target_update = target_update == "polyak" ? lede::trainer::TargetUpdate::kPolyak
                                              : lede::trainer::TargetUpdate::kHard;
  o.target_update_every = target_every;
  o.num_threads = static_cast<int32_t>(threads);
  if (Status s = lede::trainer::ValidateDqnOptions(o); !s.ok()) {
    std::fprintf(stderr, "lede-train: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (Status s = lede::policy::dqn::ValidateVersionName(version); !s.ok()) {
    std::fprintf(stderr, "lede-train: --version: %s\n", std::string(s.message()).c_str());
    return 2;
  }

  if (!overwrite && std::filesystem::exists(std::filesystem::path(out_dir) / lede::policy::dqn::kMetadataFile)) {
    return Fail(out_dir + " already holds a policy (versions are immutable); pass --overwrite to replace it");
  }

  // Experience: bad shards are reported and skipped, never fatal.
  StatusOr<lede::experience::ReadResult> read = lede::InternalError("experience not read");
  if (experience_dir.find("://") != std::string::npos) {
    StatusOr<std::unique_ptr<lede::storage::ObjectStore>> store = lede::storage::OpenObjectStore(experience_dir);
    if (!store.ok()) return Fail(store.status().ToString());
    read = lede::experience::ReadShardsFromStore(**store, "");
  } else {
    read = lede::experience::ReadShards(experience_dir);
  }
  if (!read.ok()) return Fail(read.status().ToString());
  lede::policy::dqn::PolicyMetadata meta;
  meta.version = version;
  for (const lede::experience::ShardReport& r : read->shards) {
    const std::string name = std::filesystem::path(r.path).filename().string();
    if (meta.training_data.first_shard.empty()) meta.training_data.first_shard = name;
    meta.training_data.last_shard = name;
    ++meta.training_data.n_shards;
    if (!r.error.empty()) {
      ++meta.training_data.n_bad_shards;
      std::fflush(stdout);
      std::fprintf(stderr, "lede-train: skipped part of %s after %" PRId64 " records: %s\n", r.path.c_str(),
                   r.records, r.error.c_str());
    }
  }
  std::printf("read %zu transitions from %" PRId64 " shards (%" PRId64 " with errors)\n",
              read->transitions.size(), meta.training_data.n_shards, meta.training_data.n_bad_shards);

  // One model and one reward definition per policy: transitions of other
  // models have other features' meaning, and rewards under other cost models
  // are not comparable.
  std::set<std::string> fingerprints, cost_models;
  std::vector<lede::policy::Transition> transitions;
  for (lede::policy::Transition& t : read->transitions) {
    if (!fingerprint.empty() && t.model_fingerprint != fingerprint) continue;
    if (!cost_model.empty() && t.reward_cost_model != cost_model) continue;
    fingerprints.insert(t.model_fingerprint);
    cost_models.insert(t.reward_cost_model);
    transitions.push_back(std::move(t));
  }
  if (transitions.empty()) return Fail("no transitions to train on in " + experience_dir);
  if (fingerprints.size() > 1) {
    return Fail("transitions of several models (" + JoinSet(fingerprints) + "); choose one with --model-fingerprint");
  }
  if (cost_models.size() > 1) {
    return Fail("transitions rewarded under several cost models (" + JoinSet(cost_models) +
                "); choose one with --reward-cost-model");
  }
  meta.model_fingerprint = *fingerprints.begin();
  meta.reward_cost_model = *cost_models.begin();

  if (!layers_text.empty()) {
    StatusOr<std::vector<int32_t>> layers = lede::flags::ParseIntList("candidate-layers", layers_text);
    if (!layers.ok()) {
      std::fprintf(stderr, "lede-train: %s\n", std::string(layers.status().message()).c_str());
      return 2;
    }
    meta.decision.candidate_layers = *layers;
  } else {
    std::set<int32_t> layers;
    for (const lede::policy::Transition& t : transitions) {
      if (t.phase == lede::model::Phase::kExitLayer && t.layer > 0) layers.insert(t.layer);
    }
    meta.decision.candidate_layers.assign(layers.begin(), layers.end());
  }
  meta.decision.max_draft_len = static_cast<int32_t>(max_draft_len);
  meta.decision.top_k = static_cast<int32_t>(top_k);
  meta.decision.trace_window = static_cast<int32_t>(trace_window);

  auto print_epoch = [](const lede::trainer::DqnEpochReport& r) {
    std::printf("epoch %3" PRId64 " steps %6" PRId64
                " td_loss %.4f mean_max_q %.3f exit_p1 %.3f exit_p2 %.3f agree %.3f |"
                " heldout td_loss %.4f agree %.3f reward behaviour %.4f matched %.4f"
                " return behaviour %.3f matched %.3f (%" PRId64 " eps) | %.1fs\n",
                r.epoch, r.steps, r.td_loss, r.mean_max_q, r.exit_fraction_phase1, r.exit_fraction_phase2,
                r.action_agreement, r.heldout_td_loss, r.heldout_action_agreement, r.heldout_behaviour_reward,
                r.heldout_matched_reward, r.heldout_behaviour_return, r.heldout_matched_return,
                r.heldout_matched_episodes, r.elapsed_s);
    std::fflush(stdout);
  };
  StatusOr<lede::trainer::DqnResult> result = lede::trainer::TrainDqn(transitions, o, print_epoch);
  if (!result.ok()) return Fail(result.status().ToString());
  std::printf("trained on %" PRId64 " transitions (%" PRId64 " episodes, %" PRId64 " requests; held out %" PRId64
              " episodes, %" PRId64 " transitions; dropped %" PRId64 " non-finite, %" PRId64 " duplicates)\n",
              result->n_train_transitions, result->n_train_episodes, result->n_requests,
              result->n_heldout_episodes, result->n_heldout_transitions, result->n_dropped,
              result->n_duplicates);

  const lede::policy::dqn::Artifact artifact = lede::trainer::MakeArtifact(*result, o, meta);
  if (Status s = lede::policy::dqn::SaveArtifact(out_dir, artifact, overwrite); !s.ok()) {
    return Fail(s.ToString());
  }
  std::printf("wrote policy %s for model %s to %s\n", version.c_str(), meta.model_fingerprint.c_str(),
              out_dir.c_str());
  return 0;
}
