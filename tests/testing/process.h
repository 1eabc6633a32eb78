// File: tests/testing/process.h
//
// Real processes for end-to-end tests: ChildProcess (fork/exec with stdout
// and stderr appended to a log file, waits on that log, signals, reaped on
// every path) and LedeCluster (verifier + drafter, or one co-located model
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
// Every child gets PR_SET_PDEATHSIG(SIGKILL), so nothing outlives a crashed
// test. Caveat: the signal fires when the *thread* that forked exits, so
// start children from the test's main thread (gtest runs tests and suite
// fixtures there), never from a short-lived std::thread. A ChildProcess is
// SIGTERMed (then SIGKILLed after a grace period) and reaped when destroyed;
// a LedeCluster signals all of its processes first, then reaps them, and
// removes its shared-memory pool name (a SIGKILLed verifier leaves it).
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

#include "proto/lede/v1/generation.grpc.pb.h"
#include "shared/status/status.h"
#include "shared/status/status_macros.h"
#include "tests/testing/temp_dir.h"

extern char** environ;

namespace lede::testing {

// A child process whose stdout and stderr go (appended) to a log file.
// Thread-safety: not thread-safe; use from one thread.
class ChildProcess {
 public:
  using Duration = std::chrono::milliseconds;

  // Forks and execs argv[0] (a path) with `argv`, plus `extra_env`
  // ("NAME=value") on top of this process's environment. Errors:
  // kInvalidArgument for an empty argv; kInternal if the log file cannot be
  // opened or fork fails. A failing exec shows as exit status 127 and a line
  // in the log.
  static StatusOr<std::unique_ptr<ChildProcess>> Start(const std::vector<std::string>& argv,
                                                       const std::string& log_path,
                                                       const std::vector<std::string>& extra_env = {}) {
    if (argv.empty()) return InvalidArgumentError("argv: empty");
    // Everything the child needs is built before fork(): between fork and
    // exec only async-signal-safe calls are allowed (gRPC and libtorch
    // threads may hold locks in the parent).
    std::vector<std::string> args = argv;
    std::vector<char*> cargv;
    for (std::string& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    for (const std::string& e : extra_env) env.push_back(e);
    std::vector<char*> cenv;
    for (std::string& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    const std::string exec_failed = "ChildProcess: exec failed: " + args[0] + "\n";

    const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) return InternalError("cannot open log file " + log_path);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(log_fd);
      return InternalError("fork failed");
    }
    if (pid == 0) {  // child
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
      // Unblock every signal: the parent may block SIGTERM in some thread.
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::setpgid(0, 0);  // its own group: a terminal's ^C reaches the test only
      const int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, 0);
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
      ::execve(cargv[0], cargv.data(), cenv.data());
      ssize_t ignored = ::write(2, exec_failed.data(), exec_failed.size());
      (void)ignored;
      ::_exit(127);
    }
    ::close(log_fd);
    std::unique_ptr<ChildProcess> p(new ChildProcess());
    p->pid_ = pid;
    p->log_path_ = log_path;
    p->name_ = std::filesystem::path(args[0]).filename().string();
    return p;
  }

  ~ChildProcess() { Stop(std::chrono::seconds(5)); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

  // True while the child has not exited (reaps it when it has).
  bool Running() {
    if (exited_) return false;
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) Reaped(status);
    return !exited_;
  }

  // Sends `sig` to the child (no-op once it has been reaped).
  void Signal(int sig) {
    if (!exited_ && pid_ > 0) ::kill(pid_, sig);
  }

  // Waits for the child to exit. Returns its exit code (128 + N when signal
  // N killed it), or nullopt if it is still running after `timeout`.
  std::optional<int> Wait(Duration timeout = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (Running()) {
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return exit_code_;
  }

  // SIGTERM, then SIGKILL if it has not exited after `grace`; reaps it.
  // Returns the exit code.
  int Stop(Duration grace = std::chrono::seconds(5)) {
    if (pid_ <= 0) return -1;
    Signal(SIGTERM);
    if (!Wait(grace).has_value()) Kill();
    return exit_code_;
  }

  // SIGKILL and reap.
  int Kill() {
    if (pid_ <= 0) return -1;
    Signal(SIGKILL);
    if (!exited_) {
      int status = 0;
      if (::waitpid(pid_, &status, 0) == pid_) Reaped(status);
    }
    return exit_code_;
  }

  // The whole log so far.
  std::string Log() const {
    std::ifstream in(log_path_, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // Waits until the log (from its start) matches `pattern` (ECMAScript
  // regex), polling every 20 ms. Returns the match's groups (group 0 = the
  // whole match). Errors: kDeadlineExceeded after `timeout`; kAborted if the
  // child exits first without having logged it (the log tail is in the
  // message).
  StatusOr<std::vector<std::string>> WaitForLog(const std::string& pattern, Duration timeout) {
    const std::regex re(pattern);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const bool running = Running();  // before reading: a last line is not lost
      const std::string log = Log();
      std::smatch m;
      if (std::regex_search(log, m, re)) {
        std::vector<std::string> groups;
        for (const auto& g : m) groups.push_back(g.str());
        return groups;
      }
      if (!running) {
        return Status(StatusCode::kAborted, name_ + " exited (code " + std::to_string(exit_code_) +
                                                ") before logging /" + pattern + "/; log tail:\n" +
                                                Tail(log));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return Status(StatusCode::kDeadlineExceeded,
                      name_ + " did not log /" + pattern + "/ in time; log tail:\n" + Tail(log));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Waits for the `event=started grpc_port=N metrics_port=M` line and
  // records the ports.
  Status WaitForStarted(Duration timeout = std::chrono::seconds(60)) {
    auto m = WaitForLog(R"re(event="?started"? grpc_port="?(\d+)"? metrics_port="?(\d+))re", timeout);
    if (!m.ok()) return m.status();
    grpc_port_ = std::atoi((*m)[1].c_str());
    metrics_port_ = std::atoi((*m)[2].c_str());
    return OkStatus();
  }

  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  std::string grpc_target() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  // The exit code once reaped (see Wait()); -1 before.
  int exit_code() const { return exit_code_; }

  static std::string Tail(const std::string& log, size_t n = 3000) {
    return log.size() <= n ? log : "..." + log.substr(log.size() - n);
  }

 private:
  ChildProcess() = default;
  void Reaped(int status) {
    exited_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_code_ = -1;
  std::string log_path_;
  std::string name_;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
};

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
  std::string calibration;  // default: <model_dir>/calibration-cpu.json if it exists
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
  std::chrono::milliseconds start_timeout{60000};
};

// A LEDE deployment on loopback. Processes can be killed and restarted one
// by one (fault tests); each start writes a new log file under dir().
class LedeCluster {
 public:
  explicit LedeCluster(ClusterOptions options) : options_(std::move(options)) {
    if (options_.policy_root.empty()) options_.policy_root = options_.model_dir + "/policy";
    if (options_.calibration.empty() &&
        std::filesystem::exists(options_.model_dir + "/calibration-cpu.json")) {
      options_.calibration = options_.model_dir + "/calibration-cpu.json";
    }
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
  // or reaped if it was killed). A restarted verifier or drafter listens on
  // its predecessor's port (the coordinator's targets stay valid) and the
  // verifier recreates the pool under the same name (a new epoch).
  Status StartPolicy() {
    std::vector<std::string> args = {options_.binaries.policy, "--policy-root", options_.policy_root,
                                     "--model-config", options_.model_dir + "/config.json",
                                     "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
                                     "--reload-interval-ms", "200"};
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
    std::vector<std::string> args = CoordinatorArgs(options_.autoregressive_fallback);
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
                                     "--shutdown-grace-s", "1"};
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

  std::vector<std::string> CoordinatorArgs(bool fallback, std::optional<std::string> experience = {}) const {
    const std::string url = experience.has_value() ? *experience : options_.experience_url;
    std::vector<std::string> args = {options_.binaries.coordinator, "--model", options_.model_dir,
                                     "--verifier", verifier_target(), "--drafter", drafter_target(),
                                     "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
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
