// File: tests/testing/s3rver.h
//
// A real S3 server on loopback for tests: npm's s3rver (installed by
// scripts/install_s3rver.sh, called from scripts/bootstrap), started on
// 127.0.0.1 with port 0 (the chosen port is read back from its banner), a
// fresh data directory and one configured bucket, and killed (SIGKILL, and
// PR_SET_PDEATHSIG should the test process die first) on every path. It
// runs with NODE_OPTIONS=--openssl-legacy-provider (needs Node >= 17).
//
//   lede::testing::S3rver s3;
//   if (!s3.available()) GTEST_SKIP() << s3.skip_reason();
//   ASSERT_THAT(s3.Start("lede-test"), IsOk());
//   OpenObjectStore("s3://lede-test/p?endpoint=" + s3.endpoint());
//
// s3rver 3.7.1 accepts only its built-in credentials (access key "S3RVER",
// secret "S3RVER"); an unknown access key is refused with 403
// InvalidAccessKeyId, but SigV4 signatures are NOT verified (a wrong secret
// passes).
#ifndef LEDE_TESTS_TESTING_S3RVER_H_
#define LEDE_TESTS_TESTING_S3RVER_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "shared/status/status.h"
#include "tests/testing/temp_dir.h"

namespace lede::testing {

class S3rver {
 public:
  // The s3rver executable: $LEDE_S3RVER, else
  // /opt/lede-tools/node_modules/.bin/s3rver; "" if it is not executable.
  static std::string Path() {
    const char* env = std::getenv("LEDE_S3RVER");
    const std::string p =
        env != nullptr && *env != '\0' ? env : "/opt/lede-tools/node_modules/.bin/s3rver";
    return ::access(p.c_str(), X_OK) == 0 ? p : "";
  }

  S3rver() : path_(Path()) {}
  ~S3rver() { Stop(); }
  S3rver(const S3rver&) = delete;
  S3rver& operator=(const S3rver&) = delete;

  bool available() const { return !path_.empty(); }
  std::string skip_reason() const {
    return "s3rver not installed (run scripts/install_s3rver.sh, or set LEDE_S3RVER)";
  }

  // Starts the server with `bucket` configured and waits (up to 30 s) until
  // it listens. Errors: kFailedPrecondition if s3rver is missing;
  // kUnavailable if it does not come up (it is killed).
  Status Start(const std::string& bucket) {
    if (!available()) return FailedPreconditionError(skip_reason());
    if (data_dir_.path().empty()) return InternalError("no temporary directory");
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return InternalError("pipe failed");
    const std::string dir = data_dir_.path().string();
    std::vector<std::string> args = {path_, "--directory", dir, "--address", "127.0.0.1",
                                     "--port", "0", "--silent", "--configure-bucket", bucket};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // s3rver makes ListObjectsV2 continuation tokens with DES, which the
    // OpenSSL 3 of Node >= 17 only offers through its legacy provider.
    std::vector<std::string> env_strings;
    std::string node_options = "NODE_OPTIONS=--openssl-legacy-provider";
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::string(*e).rfind("NODE_OPTIONS=", 0) == 0) {
        node_options += " " + std::string(*e + 13);
      } else {
        env_strings.push_back(*e);
      }
    }
    env_strings.push_back(node_options);
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) return InternalError("fork failed");
    if (pid_ == 0) {  // child: async-signal-safe calls only
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(fds[1], 1);
      const int devnull = ::open("/dev/null", O_WRONLY);
      if (devnull >= 0) ::dup2(devnull, 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_fd_ = fds[0];
    std::string banner;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    const std::string needle = "listening on 127.0.0.1:";
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_fd_, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(out_fd_, buf, sizeof(buf));
      if (n <= 0) break;  // exited
      banner.append(buf, static_cast<size_t>(n));
      const size_t at = banner.find(needle);
      const size_t eol = at == std::string::npos ? at : banner.find('\n', at);
      if (eol != std::string::npos) {
        port_ = std::atoi(banner.c_str() + at + needle.size());
        if (port_ > 0) return OkStatus();
        break;
      }
    }
    Stop();
    return UnavailableError("s3rver did not start; its output: " + banner);
  }

  // Kills the server (idempotent).
  void Stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      pid_ = -1;
    }
    if (out_fd_ >= 0) {
      ::close(out_fd_);
      out_fd_ = -1;
    }
  }

  int port() const { return port_; }
  // "http://127.0.0.1:<port>".
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  std::string path_;
  TempDir data_dir_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
};

}  // namespace lede::testing

#endif  // LEDE_TESTS_TESTING_S3RVER_H_
