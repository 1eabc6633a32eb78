// File: tests/testing/s3rver.h
//
// A real S3 server on loopback for tests: npm's s3rver (installed by
// scripts/install_s3rver.sh, called from scripts/bootstrap), started on
// 127.0.0.1 with port 0 (the chosen port is read back from its banner), a
// fresh data directory and one configured bucket, and killed (a
// ChildProcess: SIGKILL, and PR_SET_PDEATHSIG should the test process die
// first) on every path. It
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

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "shared/status/status.h"
#include "tests/testing/child_process.h"
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
    if (dir_.path().empty()) return InternalError("no temporary directory");
    const std::string data = (dir_.path() / "data").string();
    std::filesystem::create_directories(data);
    // s3rver makes ListObjectsV2 continuation tokens with DES, which the
    // OpenSSL 3 of Node >= 17 only offers through its legacy provider.
    std::string node_options = "NODE_OPTIONS=--openssl-legacy-provider";
    if (const char* e = std::getenv("NODE_OPTIONS"); e != nullptr && *e != '\0') {
      node_options += " " + std::string(e);
    }
    auto p = ChildProcess::Start({path_, "--directory", data, "--address", "127.0.0.1", "--port", "0",
                                  "--silent", "--configure-bucket", bucket},
                                 (dir_.path() / "s3rver.log").string(), {node_options});
    if (!p.ok()) return p.status();
    auto m = (*p)->WaitForLog(R"(listening on 127\.0\.0\.1:(\d+)\D)", std::chrono::seconds(30));
    if (!m.ok()) return UnavailableError("s3rver did not start: " + std::string(m.status().message()));
    port_ = std::atoi((*m)[1].c_str());
    process_ = std::move(*p);
    return OkStatus();
  }

  // Kills the server (idempotent).
  void Stop() {
    if (process_ != nullptr) process_->Kill();
    process_.reset();
  }

  int port() const { return port_; }
  // "http://127.0.0.1:<port>".
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  std::string path_;
  TempDir dir_;  // data/ (s3rver's --directory) and s3rver.log
  std::unique_ptr<ChildProcess> process_;
  int port_ = 0;
};

}  // namespace lede::testing

#endif  // LEDE_TESTS_TESTING_S3RVER_H_
