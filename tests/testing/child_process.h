// File: tests/testing/child_process.h
//
// ChildProcess: the one way tests run another process. Start() forks and
// execs a program, Fork() runs test code in a forked child; either way
// stdout and stderr are appended to a log file the test can wait on
// (WaitForLog, WaitForStarted), the child can be signalled, and it is
// SIGTERMed (then SIGKILLed after a grace period) and reaped when the
// object is destroyed, so every test path cleans up.
//
//   auto p = lede::testing::ChildProcess::Start({prometheus_bin, "--config.file=..."}, log);
//   ASSERT_THAT(p, IsOk());
//   ASSERT_THAT((*p)->WaitForLog("Server is ready", std::chrono::seconds(30)), IsOk());
//
// Every child gets PR_SET_PDEATHSIG(SIGKILL), so nothing outlives a crashed
// test. Caveat: the signal fires when the *thread* that forked exits, so
// start children from the test's main thread (gtest runs tests and suite
// fixtures there), never from a short-lived std::thread.
//
// Header-only; needs lede::status only.
#ifndef LEDE_TESTS_TESTING_CHILD_PROCESS_H_
#define LEDE_TESTS_TESTING_CHILD_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "shared/status/status.h"
#include "tests/testing/wait.h"

extern char** environ;

namespace lede::testing {

// A child process whose stdout and stderr go (appended) to a log file.
// Thread-safety: not thread-safe; use from one thread.
class ChildProcess {
 public:
  using Duration = std::chrono::milliseconds;

  // Forks and execs argv[0] (a path) with `argv`, plus `extra_env`
  // ("NAME=value") on top of this process's environment (an entry replaces
  // a variable of the same name). Errors:
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
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('='));
      bool replaced = false;
      for (const std::string& x : extra_env) replaced |= x.substr(0, x.find('=')) == name;
      if (!replaced) env.push_back(entry);
    }
    for (const std::string& e : extra_env) env.push_back(e);
    std::vector<char*> cenv;
    for (std::string& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    const std::string exec_failed = "ChildProcess: exec failed: " + args[0] + "\n";

    return ForkInto(log_path, std::filesystem::path(args[0]).filename().string(), [&] {
      // Unblock every signal: the parent may block SIGTERM in some thread.
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      const int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, 0);
      ::execve(cargv[0], cargv.data(), cenv.data());
      ssize_t ignored = ::write(2, exec_failed.data(), exec_failed.size());
      (void)ignored;
      ::_exit(127);
    });
  }

  // Forks a child that runs `body` (test code, not a new program) and exits
  // with its return value; stdout and stderr go to `log_path` as for
  // Start(). The child is a copy of this process with only the forking
  // thread: `body` must not rely on other threads or locks they held (it may
  // start threads of its own). Errors: kInternal if the log file cannot be
  // opened or fork fails.
  static StatusOr<std::unique_ptr<ChildProcess>> Fork(const std::function<int()>& body,
                                                      const std::string& log_path) {
    return ForkInto(log_path, "forked child", [&] { ::_exit(body()); });
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
    if (!WaitUntil([this] { return !Running(); }, timeout, std::chrono::milliseconds(10))) {
      return std::nullopt;
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
    std::vector<std::string> groups;
    bool running = true;
    std::string log;
    const bool seen = WaitUntil(
        [&] {
          running = Running();  // before reading: a last line is not lost
          log = Log();
          std::smatch m;
          if (!std::regex_search(log, m, re)) return !running;
          for (const auto& g : m) groups.push_back(g.str());
          return true;
        },
        timeout, std::chrono::milliseconds(20));
    if (!groups.empty()) return groups;
    if (seen) {  // exited first
      return Status(StatusCode::kAborted, name_ + " exited (code " + std::to_string(exit_code_) +
                                              ") before logging /" + pattern + "/; log tail:\n" +
                                              Tail(log));
    }
    return Status(StatusCode::kDeadlineExceeded,
                  name_ + " did not log /" + pattern + "/ in time; log tail:\n" + Tail(log));
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
  // Forks; the child dies with the parent (PR_SET_PDEATHSIG), leads its own
  // process group (a terminal's ^C reaches the test only), writes stdout and
  // stderr to `log_path` and runs `in_child`, which must not return.
  static StatusOr<std::unique_ptr<ChildProcess>> ForkInto(const std::string& log_path, const std::string& name,
                                                          const std::function<void()>& in_child) {
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
      ::setpgid(0, 0);
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
      in_child();
      ::_exit(127);
    }
    ::close(log_fd);
    std::unique_ptr<ChildProcess> p(new ChildProcess());
    p->pid_ = pid;
    p->log_path_ = log_path;
    p->name_ = name;
    return p;
  }

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

}  // namespace lede::testing

#endif  // LEDE_TESTS_TESTING_CHILD_PROCESS_H_
