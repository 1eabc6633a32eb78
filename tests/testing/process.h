// File: tests/testing/process.h
//
// A LEDE deployment of real processes for end-to-end tests: LedeCluster
// (verifier + drafter, or one co-located model
// process, an optional policy service, and a coordinator, wired together on
// 127.0.0.1 with ports chosen by the kernel and read back from each
// process's `event=started grpc_port=N metrics_port=M` log line).
//
//   lede::testing::ClusterOptions o;
//   o.binaries = lede::testing::LedeBinaries{model_bin, coordinator_bin, policy_bin};
//   lede::testing::LedeCluster cluster(o);
//   ASSERT_THAT(cluster.Start(), IsOk());
//   auto stub = cluster.NewStub();
//
// Each process is a ChildProcess (tests/testing/child_process.h: killed with
// the test, reaped on every path). A LedeCluster signals all of its
// processes first, then reaps them, and removes its shared-memory pool name
// (a SIGKILLed verifier leaves it).
//
// Header-only; needs gRPC (grpc++) and lede::proto on the link line.
#ifndef LEDE_TESTS_TESTING_PROCESS_H_
#define LEDE_TESTS_TESTING_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "proto/lede/v1/generation.grpc.pb.h"
#include "shared/status/status.h"
#include "shared/status/status_macros.h"
#include "tests/testing/child_process.h"
#include "tests/testing/temp_dir.h"

namespace lede::testing {

// The reward cost model of the policy `policy_root`/SERVING names
// ("accelerator", "measured"), or "" if there is none. Launchers give the
// verifier this machine's calibration only for a measured-cost policy, so
// that logged experience is priced as the serving policy's rewards are
// (the retrainer keeps only experience of the serving policy's cost
// model); scripts/run applies the same rule.
inline std::string ServingRewardCostModel(const std::string& policy_root) {
  std::ifstream serving(policy_root + "/SERVING");
  std::string version;
  if (!(serving >> version)) return "";
  std::ifstream meta(policy_root + "/" + version + "/policy.json");
  if (!meta) return "";
  nlohmann::json j = nlohmann::json::parse(meta, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("reward") || !j["reward"].contains("cost_model")) return "";
  return j["reward"]["cost_model"].is_string() ? j["reward"]["cost_model"].get<std::string>() : "";
}

// The calibration a verifier serving `policy_dir`'s SERVING version is
// given: <model_dir>/calibration-cpu.json for a measured-cost policy (if the
// file exists), "" otherwise. Tests whose cluster follows a policy store (an
// empty mirror at start) pass the policies the store will serve.
inline std::string ServingCalibration(const std::string& model_dir, const std::string& policy_dir) {
  const std::string path = model_dir + "/calibration-cpu.json";
  return ServingRewardCostModel(policy_dir) == "measured" && std::filesystem::exists(path) ? path : "";
}

// Where the executables are (tests pass $<TARGET_FILE:...> paths).
struct LedeBinaries {
  std::string model;        // lede-model
  std::string coordinator;  // lede-coordinator
  std::string policy;       // lede-policy (only for ClusterOptions::policy_service)
};

struct ClusterOptions {
  LedeBinaries binaries;
  std::string model_dir;    // e.g. <source>/models/lede-tiny
  std::string policy_root;  // default: <model_dir>/policy
  // default: <model_dir>/calibration-cpu.json if it exists and the serving
  // policy was trained with the measured cost model (ServingRewardCostModel)
  std::string calibration;
  int slots = 4;
  int max_draft_len = 16;
  bool colocated = false;       // one `lede-model --role both` serves drafter and verifier
  bool policy_service = false;  // start lede-policy; the drafter follows it (--policy)
  // Coordinator: experience store URL ("" = a fresh directory under dir(),
  // "none" = no experience logging), shard age, fallback, extra flags.
  std::string experience_url;
  double experience_shard_age_s = 0.2;
  bool autoregressive_fallback = false;
  std::vector<std::string> model_args;        // extra lede-model flags (every model process)
  std::vector<std::string> coordinator_args;  // extra lede-coordinator flags
  std::vector<std::string> policy_args;       // extra lede-policy flags
  // A restarted coordinator listens on its predecessor's port (clients keep
  // their target, as behind a fixed address). Off by default: a fresh
  // channel to a reused port may first get the dead connection of another
  // channel's shared subchannel (UNAVAILABLE "Socket closed"), so tests that
  // expect one call to succeed right after a restart use a new port.
  bool coordinator_keeps_port = false;
  std::chrono::milliseconds start_timeout{60000};
};

// A LEDE deployment on loopback. Processes can be killed and restarted one
// by one (fault tests); each start writes a new log file under dir().
class LedeCluster {
 public:
  explicit LedeCluster(ClusterOptions options) : options_(std::move(options)) {
    if (options_.policy_root.empty()) options_.policy_root = options_.model_dir + "/policy";
    if (options_.calibration.empty()) options_.calibration = ServingCalibration(options_.model_dir, options_.policy_root);
    static std::atomic<int> counter{0};
    pool_name_ = "/lede-e2e-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    if (options_.experience_url.empty() && !dir_.path().empty()) {
      experience_dir_ = (dir_.path() / "experience").string();
      std::filesystem::create_directories(experience_dir_);
      options_.experience_url = experience_dir_;
    }
  }

  ~LedeCluster() {
    // Signal everything first, then reap: shutdowns overlap.
    for (ChildProcess* p : {coordinator_.get(), drafter_.get(), verifier_.get(), policy_.get()}) {
      if (p != nullptr) p->Signal(SIGTERM);
    }
    for (std::unique_ptr<ChildProcess>* p : {&coordinator_, &drafter_, &verifier_, &policy_}) p->reset();
    ::shm_unlink(pool_name_.c_str());  // left behind by a SIGKILLed verifier
  }
  LedeCluster(const LedeCluster&) = delete;
  LedeCluster& operator=(const LedeCluster&) = delete;

  // Starts every process and waits until each serves.
  Status Start() {
    if (dir_.path().empty()) return InternalError("no temporary directory");
    if (options_.policy_service) LEDE_RETURN_IF_ERROR(StartPolicy());
    LEDE_RETURN_IF_ERROR(StartVerifier());
    if (!options_.colocated) LEDE_RETURN_IF_ERROR(StartDrafter());
    return StartCoordinator();
  }

  // (Re)starts one process; the old one, if any, is stopped first (SIGTERM,
  // or reaped if it was killed). A restarted policy service, verifier or
  // drafter listens on its predecessor's gRPC port (the drafter's policy
  // target and the coordinator's model targets stay valid), a coordinator
  // too with ClusterOptions::coordinator_keeps_port; the verifier recreates
  // the pool under the same name (a new epoch).
  Status StartPolicy() {
    std::vector<std::string> args = {options_.binaries.policy, "--policy-root", options_.policy_root,
                                     "--model-config", options_.model_dir + "/config.json",
                                     "--listen", ListenAddress(policy_.get()), "--metrics", "127.0.0.1:0",
                                     "--reload-interval-ms", "200"};
    args.insert(args.end(), options_.policy_args.begin(), options_.policy_args.end());
    return Launch(&policy_, args, "policy");
  }
  Status StartVerifier() {
    std::vector<std::string> args =
        ModelArgs(options_.colocated ? "both" : "verifier", ListenAddress(verifier_.get()));
    if (!options_.colocated) args.insert(args.end(), {"--kv-pool", pool_name_});
    return Launch(&verifier_, args, options_.colocated ? "model" : "verifier");
  }
  Status StartDrafter() {
    std::vector<std::string> args = ModelArgs("drafter", ListenAddress(drafter_.get()));
    args.insert(args.end(), {"--kv-pool", pool_name_, "--attach-timeout-s", "30"});
    return Launch(&drafter_, args, "drafter");
  }
  Status StartCoordinator() {
    std::vector<std::string> args =
        CoordinatorArgs(options_.autoregressive_fallback, {},
                        options_.coordinator_keeps_port ? ListenAddress(coordinator_.get()) : "127.0.0.1:0");
    return Launch(&coordinator_, args, "coordinator");
  }

  // Starts another coordinator over the same model processes (not owned by
  // the cluster; the caller stops it). `experience_url` "" = no experience.
  StatusOr<std::unique_ptr<ChildProcess>> StartExtraCoordinator(bool autoregressive_fallback,
                                                                const std::string& experience_url,
                                                                const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = CoordinatorArgs(autoregressive_fallback, experience_url);
    args.insert(args.end(), extra.begin(), extra.end());
    std::unique_ptr<ChildProcess> p;
    LEDE_RETURN_IF_ERROR(Launch(&p, args, "coordinator-extra"));
    return p;
  }

  ChildProcess* verifier() { return verifier_.get(); }  // the `both` process when co-located
  ChildProcess* drafter() { return colocated() ? verifier_.get() : drafter_.get(); }
  ChildProcess* coordinator() { return coordinator_.get(); }
  ChildProcess* policy() { return policy_.get(); }
  bool colocated() const { return options_.colocated; }

  std::string verifier_target() const { return verifier_ ? verifier_->grpc_target() : ""; }
  std::string drafter_target() const {
    return colocated() ? verifier_target() : (drafter_ ? drafter_->grpc_target() : "");
  }
  std::string coordinator_target() const { return coordinator_ ? coordinator_->grpc_target() : ""; }
  const std::string& pool_name() const { return pool_name_; }
  const std::string& experience_dir() const { return experience_dir_; }  // "" if not a directory
  const std::filesystem::path& dir() const { return dir_.path(); }
  const ClusterOptions& options() const { return options_; }

  // A stub of the coordinator's public API (a fresh channel).
  std::unique_ptr<lede::v1::Generation::Stub> NewStub() const { return NewStub(coordinator_target()); }
  static std::unique_ptr<lede::v1::Generation::Stub> NewStub(const std::string& target) {
    return lede::v1::Generation::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  }

 private:
  // 127.0.0.1:0 for a first start, the previous port for a restart.
  static std::string ListenAddress(const ChildProcess* previous) {
    return "127.0.0.1:" + std::to_string(previous != nullptr ? previous->grpc_port() : 0);
  }

  std::vector<std::string> ModelArgs(const std::string& role, const std::string& listen) const {
    std::vector<std::string> args = {options_.binaries.model, "--role", role,
                                     "--model", options_.model_dir,
                                     "--slots", std::to_string(options_.slots),
                                     "--max-draft-len", std::to_string(options_.max_draft_len),
                                     "--listen", listen, "--metrics", "127.0.0.1:0",
                                     "--shutdown-grace-s", "1",
                                     // One thread, as the in-process references
                                     // run (lede-model's default is every CPU).
                                     "--threads", "1"};
    if (!options_.calibration.empty()) args.insert(args.end(), {"--calibration", options_.calibration});
    if (role != "verifier") {
      if (options_.policy_service && policy_) {
        args.insert(args.end(), {"--policy", policy_->grpc_target()});
      } else {
        args.insert(args.end(), {"--policy-dir", options_.policy_root});
      }
    }
    args.insert(args.end(), options_.model_args.begin(), options_.model_args.end());
    return args;
  }

  std::vector<std::string> CoordinatorArgs(bool fallback, std::optional<std::string> experience = {},
                                           const std::string& listen = "127.0.0.1:0") const {
    const std::string url = experience.has_value() ? *experience : options_.experience_url;
    std::vector<std::string> args = {options_.binaries.coordinator, "--model", options_.model_dir,
                                     "--verifier", verifier_target(), "--drafter", drafter_target(),
                                     "--listen", listen, "--metrics", "127.0.0.1:0",
                                     "--http", "127.0.0.1:0",
                                     "--rpc-timeout-s", "20", "--shutdown-grace-s", "2"};
    if (!url.empty() && url != "none") {
      std::ostringstream age;
      age << options_.experience_shard_age_s;
      args.insert(args.end(), {"--experience", url, "--experience-shard-age-s", age.str()});
    }
    if (fallback) args.push_back("--autoregressive-fallback");
    args.insert(args.end(), options_.coordinator_args.begin(), options_.coordinator_args.end());
    return args;
  }

  Status Launch(std::unique_ptr<ChildProcess>* slot, const std::vector<std::string>& args,
                const std::string& name) {
    if (*slot) slot->reset();  // SIGTERM + reap the previous one
    const std::string log =
        (dir_.path() / (name + "-" + std::to_string(launches_++) + ".log")).string();
    auto p = ChildProcess::Start(args, log);
    if (!p.ok()) return p.status();
    Status s = (*p)->WaitForStarted(options_.start_timeout);
    if (!s.ok()) return Status(s.code(), name + ": " + std::string(s.message()));
    *slot = std::move(*p);
    return OkStatus();
  }

  ClusterOptions options_;
  TempDir dir_;
  std::string pool_name_;
  std::string experience_dir_;
  int launches_ = 0;
  std::unique_ptr<ChildProcess> policy_, verifier_, drafter_, coordinator_;
};

}  // namespace lede::testing

#endif  // LEDE_TESTS_TESTING_PROCESS_H_
