// Throw-away certificates for TLS tests, made with the openssl command at
// test time in a fresh temporary directory (nothing is checked in): a CA,
// a server certificate it signs for 127.0.0.1 / localhost, a client
// certificate it signs (clientAuth), and a second, unrelated CA whose
// trust must not be enough. EC P-256 keys: a few tens of milliseconds.
#ifndef LEDE_TESTS_SERVICES_COORDINATOR_TEST_CERTIFICATES_H_
#define LEDE_TESTS_SERVICES_COORDINATOR_TEST_CERTIFICATES_H_

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

namespace lede::coordinator::test_util {

struct TestCertificates {
  std::string dir;
  std::string ca, other_ca;                // CA certificates (PEM)
  std::string server_cert, server_key;     // for 127.0.0.1 and localhost
  std::string client_cert, client_key;     // signed by `ca`, clientAuth
  std::string error;                       // why Make() failed; "" on success

  // Generates everything under a new mkdtemp directory. On failure
  // `error` says which openssl command failed (tests then skip).
  static std::unique_ptr<TestCertificates> Make() {
    auto owned = std::make_unique<TestCertificates>();
    TestCertificates& c = *owned;
    char tmpl[] = "/tmp/lede-tls-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      c.error = "mkdtemp failed";
      return owned;
    }
    c.dir = tmpl;
    auto path = [&](const char* name) { return c.dir + "/" + name; };
    c.ca = path("ca.pem");
    c.other_ca = path("other-ca.pem");
    c.server_cert = path("server.pem");
    c.server_key = path("server.key");
    c.client_cert = path("client.pem");
    c.client_key = path("client.key");
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string d = c.dir;
    const std::string commands[] = {
        "openssl req -x509 " + key + " -keyout " + d + "/ca.key -out " + c.ca +
            " -days 1 -subj /CN=lede-test-ca",
        "openssl req -x509 " + key + " -keyout " + d + "/other-ca.key -out " + c.other_ca +
            " -days 1 -subj /CN=lede-other-ca",
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth\\n' > " + d + "/server.ext",
        "printf 'extendedKeyUsage=clientAuth\\n' > " + d + "/client.ext",
        "openssl req " + key + " -keyout " + c.server_key + " -out " + d + "/server.csr -subj /CN=localhost",
        "openssl x509 -req -in " + d + "/server.csr -CA " + c.ca + " -CAkey " + d + "/ca.key -CAcreateserial -out " +
            c.server_cert + " -days 1 -extfile " + d + "/server.ext",
        "openssl req " + key + " -keyout " + c.client_key + " -out " + d + "/client.csr -subj /CN=lede-coordinator",
        "openssl x509 -req -in " + d + "/client.csr -CA " + c.ca + " -CAkey " + d + "/ca.key -CAcreateserial -out " +
            c.client_cert + " -days 1 -extfile " + d + "/client.ext",
    };
    for (const std::string& command : commands) {
      if (std::system((command + " >/dev/null 2>&1").c_str()) != 0) {
        c.error = "failed: " + command;
        return owned;
      }
    }
    return owned;
  }
  ~TestCertificates() {
    if (!dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
  TestCertificates() = default;
  TestCertificates(const TestCertificates&) = delete;
  TestCertificates& operator=(const TestCertificates&) = delete;
};

}  // namespace lede::coordinator::test_util

#endif  // LEDE_TESTS_SERVICES_COORDINATOR_TEST_CERTIFICATES_H_
