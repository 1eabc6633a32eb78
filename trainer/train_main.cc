// lede-train: offline DQN training of the exit policy from experience shards
// (docs/design.md §2, §5). Reads every complete shard in --experience, a plain
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
// Progress and decisions (trainer/retrain_metrics.h): `--watch` serves
// Prometheus metrics at http://--metrics/metrics (default 127.0.0.1:9405,
// with /healthz and /readyz); every run prints them as one logfmt line
// (event=retrain_metrics ...), and --metrics-textfile writes them in the
// text exposition format after each run (node exporter's textfile
// collector; also with --once).
//
// One retraining per policy root at a time (trainer/policy_root_lock.h): a
// --once run that finds another holding <policy-root>/retrain.lock exits at
// once with one line naming the holder and status 75 (EX_TEMPFAIL: try again
// later); a --watch run logs the same line and tries again next interval.
//
// Exit status: 0 on success (--once: also when nothing was new or the
// candidate was rejected), 1 on a failure, 2 on bad flags, 75 (--once) when
// another retraining holds the policy root.
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

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "policy/dqn/artifact.h"
#include "shared/flags/flags.h"
#include "shared/storage/object_store.h"
#include "trainer/dqn.h"
#include "trainer/dqn_flags.h"
#include "shared/experience/experience.h"
#include "shared/telemetry/metrics.h"
#include "shared/telemetry/metrics_server.h"
#include "trainer/retrain.h"
#include "trainer/retrain_metrics.h"

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
  return absl::StrJoin(s, ", ", [](std::string* out, const std::string& x) { absl::StrAppend(out, "\"", x, "\""); });
}

// --once's exit status when another retraining holds the policy root
// (sysexits.h EX_TEMPFAIL).
constexpr int kExitLocked = 75;

int Fail(const std::string& message) {
  std::fprintf(stderr, "lede-train: %s\n", message.c_str());
  return 1;
}

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

// Where --once/--watch report their metrics.
struct MetricsFlags {
  std::string address = "127.0.0.1:9405";  // --watch: /metrics
  std::string textfile;                    // written after each run ("" = none)
};

// One RunOnce, timed; its outcome line and the metrics' logfmt line.
void RunAndRecord(lede::trainer::Retrainer& retrainer, lede::trainer::RetrainMetrics& metrics,
                  const lede::telemetry::Registry& registry, const MetricsFlags& mf, bool watch, double interval_s,
                  lede::Status* failure) {
  const auto start = std::chrono::steady_clock::now();
  StatusOr<lede::trainer::RetrainOutcome> r = retrainer.RunOnce();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!r.ok() && lede::trainer::IsPolicyRootLocked(r.status())) {
    metrics.RecordLocked(seconds);
    *failure = r.status();
    std::fflush(stdout);
    std::fprintf(stderr, "lede-train: %s%s\n", std::string(r.status().message()).c_str(),
                 watch ? "; skipping this run" : "; exiting");
  } else if (!r.ok()) {
    metrics.RecordFailure(seconds);
    *failure = r.status();
    if (watch) {
      std::fprintf(stderr, "lede-train: run failed (retrying in %.0f s): %s\n", interval_s,
                   r.status().ToString().c_str());
    }
  } else {
    metrics.RecordRun(*r, seconds);
    std::printf("event=retrain decision=%s serving=%s candidate=%s new_shards=%" PRId64
                " new_transitions=%" PRId64 " new_requests=%" PRId64 " bad_shards=%" PRId64
                " other_model_shards=%" PRId64 " run_seconds=%.1f report=%s\n",
                lede::trainer::RetrainDecisionName(r->decision), r->serving_version.c_str(),
                r->candidate_version.empty() ? "-" : r->candidate_version.c_str(), r->n_new_shards,
                r->n_new_transitions, r->n_new_requests, r->n_bad_shards, r->n_other_model_shards, seconds,
                r->report_path.empty() ? "-" : r->report_path.c_str());
  }
  std::printf("%s\n", metrics.Logfmt().c_str());
  std::fflush(stdout);
  if (!mf.textfile.empty()) {
    if (lede::Status s = lede::trainer::RetrainMetrics::WriteTextfile(registry, mf.textfile); !s.ok()) {
      std::fprintf(stderr, "lede-train: --metrics-textfile: %s\n", s.ToString().c_str());
    }
  }
}

// --once / --watch: Retrainer::RunOnce, once or every interval_s.
int RunRetraining(lede::trainer::RetrainOptions options, bool watch, double interval_s, const MetricsFlags& mf) {
  options.log = [](const std::string& line) {
    std::printf("lede-train: %s\n", line.c_str());
    std::fflush(stdout);
  };
  StatusOr<std::unique_ptr<lede::trainer::Retrainer>> retrainer = lede::trainer::Retrainer::Create(options);
  if (!retrainer.ok()) {
    std::fprintf(stderr, "lede-train: %s\n", std::string(retrainer.status().message()).c_str());
    return retrainer.status().code() == lede::StatusCode::kInvalidArgument ? 2 : 1;
  }
  lede::telemetry::Registry registry;
  lede::trainer::RetrainMetrics metrics(registry);
  std::unique_ptr<lede::telemetry::MetricsServer> server;
  if (watch) {
    StatusOr<std::unique_ptr<lede::telemetry::MetricsServer>> started =
        lede::telemetry::MetricsServer::Start(registry, mf.address);
    if (!started.ok()) return Fail("--metrics: " + std::string(started.status().message()));
    server = std::move(*started);
    const std::string host = mf.address.substr(0, mf.address.rfind(':'));
    std::printf("lede-train: msg=\"serving metrics\" url=http://%s:%d/metrics\n", host.c_str(), server->port());
    std::signal(SIGTERM, OnSignal);
    std::signal(SIGINT, OnSignal);
  }
  while (true) {
    lede::Status failure;
    RunAndRecord(**retrainer, metrics, registry, mf, watch, interval_s, &failure);
    if (!watch && lede::trainer::IsPolicyRootLocked(failure)) return kExitLocked;
    if (!watch) return failure.ok() ? 0 : Fail(failure.ToString());
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(interval_s);
    while (!g_stop.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (g_stop.load()) return 0;
  }
}

// Every flag of lede-train, with its default.
struct TrainFlags {
  lede::trainer::DqnFlags dqn{lede::trainer::DqnOptions{}};
  std::string experience_dir, out_dir, version = DefaultVersion(), layers_text, fingerprint, cost_model;
  int64_t max_draft_len = 8, top_k = 4, trace_window = 8;
  bool overwrite = false;
  // Retraining (--once / --watch).
  bool once = false, watch = false;
  lede::trainer::RetrainOptions ro;
  double interval_s = 300;
  int64_t retrain_epochs = ro.dqn.epochs, eval_skip = ro.eval_prompt_skip, eval_count = ro.eval_prompt_count;
  int64_t eval_tokens = ro.eval_new_tokens, eval_threads = 0;
  MetricsFlags metrics;
};

void AddRetrainFlags(lede::flags::FlagSet& f, TrainFlags* t) {
  lede::trainer::RetrainOptions& ro = t->ro;
  f.Add("once", &t->once, "retrain once: new shards -> warm-started candidate -> publish if better");
  f.Add("watch", &t->watch, "retrain every --interval-s seconds until SIGTERM");
  f.Add("interval-s", &t->interval_s, "--watch: seconds between runs");
  f.Add("policy-root", &ro.policy_root, "--once/--watch: policy root (versions + SERVING)");
  f.Add("policy-store", &ro.policy_store_url,
        "--once/--watch: object store the policy services follow (s3://bucket/prefix, file:///dir); "
        "--policy-root is then local scratch");
  f.Add("state", &ro.state_path, "--once/--watch: state checkpoint (default <policy-root>/retrain_state.json)");
  f.Add("experience-prefix", &ro.experience_prefix, "--once/--watch: key prefix of the shards in the store");
  f.Add("model", &ro.model_dir,
        "--once/--watch: model directory for the replay evaluation (empty: offline only); td needs it for a "
        "serving policy priced by the served costs (its transitions are re-priced with the request log's)");
  f.Add("calibration", &ro.calibration, "--once/--watch: measured cost model JSON (default <model>/calibration-cpu.json; with neither, "
        "the request trainer calibrates the model once into <policy-root>/calibration-cpu.json)");
  f.Add("eval-prompts", &ro.eval_prompts, "--once/--watch: held-out prompts (.jsonl) replayed with each policy");
  f.Add("trainer", &ro.trainer,
        "--once/--watch: counterfactual (the request log, with --model), td (transitions) or auto (counterfactual "
        "when the store holds a request log and --model is given without --eval-prompts)");
  f.Add("eval-prompt-skip", &t->eval_skip, "--once/--watch: prompts skipped at the start of --eval-prompts");
  f.Add("eval-prompt-count", &t->eval_count, "--once/--watch: prompts replayed");
  f.Add("eval-new-tokens", &t->eval_tokens, "--once/--watch: tokens generated per replayed prompt");
  f.Add("eval-threads", &t->eval_threads, "--once/--watch: libtorch threads for the replay (0 = default)");
  f.Add("publish-margin", &ro.publish_margin,
        "--once/--watch: publish iff candidate - serving predicted speed-up > this (-inf forces, inf never)");
  f.Add("window-shards", &ro.window_shards, "--once/--watch: replay window, most recent shards");
  f.Add("window-transitions", &ro.window_transitions, "--once/--watch: replay window, most transitions");
  f.Add("min-new-transitions", &ro.min_new_transitions, "--once/--watch: train only with this many new ones");
  f.Add("heldout-requests", &ro.heldout_fraction, "--once/--watch: share of requests held out");
  f.Add("version-prefix", &ro.version_prefix, "--once/--watch: versions <prefix>-<n> (default r<UTC timestamp>)");
  f.Add("retrain-epochs", &t->retrain_epochs, "--once/--watch: fine-tuning epochs");
  f.Add("metrics", &t->metrics.address, "--watch: HOST:PORT serving /metrics (Prometheus; 0 = any free port)");
  f.Add("metrics-textfile", &t->metrics.textfile,
        "--once/--watch: write the metrics here (Prometheus text format) after each run");
}

void AddTrainingFlags(lede::flags::FlagSet& f, TrainFlags* t) {
  f.Add("version", &t->version, "policy version recorded in policy.json (default: UTC timestamp)");
  lede::trainer::AddDqnFlags(f, &t->dqn, lede::trainer::DqnFlagScope::kTd);
  f.Add("candidate-layers", &t->layers_text, "comma-separated candidate exit layers (default: those in the data)");
  f.Add("max-draft-len", &t->max_draft_len, "D_max the experience was logged with");
  f.Add("top-k", &t->top_k, "k of C_k^l the experience was logged with");
  f.Add("trace-window", &t->trace_window, "W of C_trace the experience was logged with");
  f.Add("model-fingerprint", &t->fingerprint, "train only on this model's transitions (default: the data's only one)");
  f.Add("reward-cost-model", &t->cost_model, "train only on transitions rewarded under this cost model");
  f.Add("overwrite", &t->overwrite, "replace an existing artifact in --out");
}

// One-line error, exit status 2 (bad flags).
int Usage(const std::string& message) {
  std::fprintf(stderr, "lede-train: %s\n", message.c_str());
  return 2;
}

// --once / --watch: the retrain options from the flags, then the loop.
int RunRetrainMode(TrainFlags& t) {
  lede::trainer::RetrainOptions& ro = t.ro;
  if (ro.policy_root.empty()) return Usage("--once/--watch need --policy-root");
  if (!t.out_dir.empty()) return Usage("--out is for plain training; --once/--watch publish under --policy-root");
  if (!(t.interval_s > 0)) return Usage("--interval-s must be > 0");
  ro.experience_url = t.experience_dir;
  ro.eval_prompt_skip = t.eval_skip;
  ro.eval_prompt_count = t.eval_count;
  ro.eval_new_tokens = t.eval_tokens;
  ro.eval_threads = static_cast<int32_t>(t.eval_threads);
  // The serving artifact decides the hidden width and the Retrainer holds
  // out by itself; every other DQN flag applies as given.
  lede::trainer::DqnFlags dqn = t.dqn;
  dqn.epochs = t.retrain_epochs;
  dqn.hidden = ro.dqn.hidden;
  dqn.heldout_fraction = ro.dqn.heldout_fraction;
  if (Status s = lede::trainer::ApplyDqnFlags(dqn, lede::trainer::DqnFlagScope::kTd, &ro.dqn); !s.ok()) {
    return Usage(std::string(s.message()));
  }
  if (t.watch) {
    if (lede::StatusOr<std::pair<std::string, int>> a = lede::telemetry::ParseListenAddress(t.metrics.address);
        !a.ok()) {
      return Usage("--metrics: " + std::string(a.status().message()));
    }
  }
  return RunRetraining(ro, t.watch, t.interval_s, t.metrics);
}

// Every complete shard under `experience` (a directory or a store URL); bad
// shards are reported and skipped, never fatal. Fills meta's training data.
StatusOr<lede::experience::ReadResult> ReadExperience(const std::string& experience,
                                                      lede::policy::dqn::PolicyMetadata* meta) {
  StatusOr<lede::experience::ReadResult> read = lede::InternalError("experience not read");
  if (experience.find("://") != std::string::npos) {
    StatusOr<std::unique_ptr<lede::storage::ObjectStore>> store = lede::storage::OpenObjectStore(experience);
    if (!store.ok()) return store.status();
    read = lede::experience::ReadShardsFromStore(**store, "");
  } else {
    read = lede::experience::ReadShards(experience);
  }
  if (!read.ok()) return read.status();
  for (const lede::experience::ShardReport& r : read->shards) {
    const std::string name = std::filesystem::path(r.path).filename().string();
    if (meta->training_data.first_shard.empty()) meta->training_data.first_shard = name;
    meta->training_data.last_shard = name;
    ++meta->training_data.n_shards;
    if (!r.error.empty()) {
      ++meta->training_data.n_bad_shards;
      std::fflush(stdout);
      std::fprintf(stderr, "lede-train: skipped part of %s after %" PRId64 " records: %s\n", r.path.c_str(),
                   r.records, r.error.c_str());
    }
  }
  std::printf("read %zu transitions from %" PRId64 " shards (%" PRId64 " with errors)\n",
              read->transitions.size(), meta->training_data.n_shards, meta->training_data.n_bad_shards);
  return read;
}

// One model and one reward definition per policy: transitions of other
// models have other features' meaning, and rewards under other cost models
// are not comparable. Fills meta's fingerprint and cost model.
StatusOr<std::vector<lede::experience::Transition>> SelectTransitions(const TrainFlags& t,
                                                                  std::vector<lede::experience::Transition> all,
                                                                  lede::policy::dqn::PolicyMetadata* meta) {
  std::set<std::string> fingerprints, cost_models;
  std::vector<lede::experience::Transition> transitions;
  for (lede::experience::Transition& tr : all) {
    if (!t.fingerprint.empty() && tr.model_fingerprint != t.fingerprint) continue;
    if (!t.cost_model.empty() && tr.reward_cost_model != t.cost_model) continue;
    fingerprints.insert(tr.model_fingerprint);
    cost_models.insert(tr.reward_cost_model);
    transitions.push_back(std::move(tr));
  }
  if (transitions.empty()) return lede::FailedPreconditionError("no transitions to train on in " + t.experience_dir);
  if (fingerprints.size() > 1) {
    return lede::FailedPreconditionError("transitions of several models (" + JoinSet(fingerprints) +
                                         "); choose one with --model-fingerprint");
  }
  if (cost_models.size() > 1) {
    return lede::FailedPreconditionError("transitions rewarded under several cost models (" +
                                         JoinSet(cost_models) + "); choose one with --reward-cost-model");
  }
  meta->model_fingerprint = *fingerprints.begin();
  meta->reward_cost_model = *cost_models.begin();
  return transitions;
}

void PrintEpoch(const lede::trainer::DqnEpochReport& r) {
  std::printf("epoch %3" PRId64 " steps %6" PRId64
              " td_loss %.4f mean_max_q %.3f exit_p1 %.3f exit_p2 %.3f agree %.3f |"
              " heldout td_loss %.4f agree %.3f reward behaviour %.4f matched %.4f"
              " return behaviour %.3f matched %.3f (%" PRId64 " eps) | %.1fs\n",
              r.epoch, r.steps, r.td_loss, r.train.mean_max_q, r.train.exit_fraction_phase1,
              r.train.exit_fraction_phase2, r.train.action_agreement, r.heldout.td_loss, r.heldout.action_agreement,
              r.heldout.behaviour_reward, r.heldout.matched_reward, r.heldout.behaviour_return,
              r.heldout.matched_return, r.heldout.matched_episodes, r.elapsed_s);
  std::fflush(stdout);
}

// Plain mode: every shard -> one policy artifact in --out.
int RunPlainTraining(TrainFlags& t) {
  if (t.out_dir.empty()) return Usage("missing --out (or --once/--watch)");
  lede::trainer::DqnOptions o;
  if (Status s = lede::trainer::ApplyDqnFlags(t.dqn, lede::trainer::DqnFlagScope::kTd, &o); !s.ok()) {
    return Usage(std::string(s.message()));
  }
  if (Status s = lede::policy::dqn::ValidateVersionName(t.version); !s.ok()) {
    return Usage("--version: " + std::string(s.message()));
  }
  if (!t.overwrite && std::filesystem::exists(std::filesystem::path(t.out_dir) / lede::policy::dqn::kMetadataFile)) {
    return Fail(t.out_dir + " already holds a policy (versions are immutable); pass --overwrite to replace it");
  }
  lede::policy::dqn::PolicyMetadata meta;
  meta.version = t.version;
  StatusOr<lede::experience::ReadResult> read = ReadExperience(t.experience_dir, &meta);
  if (!read.ok()) return Fail(read.status().ToString());
  StatusOr<std::vector<lede::experience::Transition>> transitions =
      SelectTransitions(t, std::move(read->transitions), &meta);
  if (!transitions.ok()) return Fail(std::string(transitions.status().message()));

  if (!t.layers_text.empty()) {
    StatusOr<std::vector<int32_t>> layers = lede::flags::ParseIntList("candidate-layers", t.layers_text);
    if (!layers.ok()) return Usage(std::string(layers.status().message()));
    meta.decision.candidate_layers = *layers;
  } else {
    std::set<int32_t> layers;
    for (const lede::experience::Transition& tr : *transitions) {
      if (tr.phase == lede::speculation::Phase::kExitLayer && tr.layer > 0) layers.insert(tr.layer);
    }
    meta.decision.candidate_layers.assign(layers.begin(), layers.end());
  }
  meta.decision.max_draft_len = static_cast<int32_t>(t.max_draft_len);
  meta.decision.top_k = static_cast<int32_t>(t.top_k);
  meta.decision.trace_window = static_cast<int32_t>(t.trace_window);

  StatusOr<lede::trainer::DqnResult> result = lede::trainer::TrainDqn(*transitions, o, PrintEpoch);
  if (!result.ok()) return Fail(result.status().ToString());
  std::printf("trained on %" PRId64 " transitions (%" PRId64 " episodes, %" PRId64 " requests; held out %" PRId64
              " episodes, %" PRId64 " transitions; dropped %" PRId64 " non-finite, %" PRId64 " duplicates)\n",
              result->n_train_transitions, result->n_train_episodes, result->n_requests,
              result->n_heldout_episodes, result->n_heldout_transitions, result->n_dropped,
              result->n_duplicates);
  const lede::policy::dqn::Artifact artifact = lede::trainer::MakeArtifact(*result, o, meta);
  if (Status s = lede::policy::dqn::SaveArtifact(t.out_dir, artifact, t.overwrite); !s.ok()) return Fail(s.ToString());
  std::printf("wrote policy %s for model %s to %s\n", t.version.c_str(), meta.model_fingerprint.c_str(),
              t.out_dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  TrainFlags t;
  lede::flags::FlagSet f;
  f.Add("experience", &t.experience_dir,
        "experience shards (*.lexp): a directory, or a store URL (file:///abs/dir, s3://bucket/prefix?...)", true);
  f.Add("out", &t.out_dir, "artifact directory to write (policies/<model>/<version>); plain mode");
  AddRetrainFlags(f, &t);
  AddTrainingFlags(f, &t);
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (lede::flags::WantsHelp(args)) {
    std::printf("usage: lede-train --experience DIR|URL --out DIR [flags]\n"
                "       lede-train --once|--watch --experience URL --policy-root DIR [--model DIR --eval-prompts F]"
                " [flags]\nflags:\n%s",
                f.Usage().c_str());
    return 0;
  }
  if (Status s = f.Parse(args); !s.ok()) {
    std::fprintf(stderr, "lede-train: %s\nflags:\n%s", std::string(s.message()).c_str(), f.Usage().c_str());
    return 2;
  }
  if (t.once && t.watch) return Usage("--once and --watch exclude each other");
  return t.once || t.watch ? RunRetrainMode(t) : RunPlainTraining(t);
}
