// File: tests/shared/telemetry/telemetry_test_util.h
//
// Test helpers for the telemetry tests: a plain-socket HTTP client, URL
// encoding, a free loopback port for child processes and a shell runner
// (child processes: tests/testing/child_process.h).
#ifndef LEDE_TESTS_SHARED_TELEMETRY_TELEMETRY_TEST_UTIL_H_
#define LEDE_TESTS_SHARED_TELEMETRY_TELEMETRY_TEST_UTIL_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>


namespace lede::telemetry::test_util {

struct HttpResponse {
  int status = 0;  // 0: no response (connect or read failed)
  std::string headers;
  std::string body;
};

// One HTTP/1.0 request to 127.0.0.1:port over a plain socket; reads to EOF.
// A response cut short (a read timeout or reset before EOF, or a body
// shorter than its Content-Length) is no response (status 0), never a
// truncated body a caller could parse as a smaller number.
inline HttpResponse HttpRequest(int port, const std::string& method, const std::string& target) {
  HttpResponse r;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return r;
  }
  const std::string request = method + " " + target +
                              " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return r;
  }
  std::string raw;
  char buf[4096];
  ssize_t n;
  while (true) {
    n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    raw.append(buf, n);
  }
  ::close(fd);
  if (n < 0) return r;  // timed out or reset before EOF
  const size_t split = raw.find("\r\n\r\n");
  if (split == std::string::npos || raw.compare(0, 5, "HTTP/") != 0) return r;
  std::string headers = raw.substr(0, split);
  std::string body = raw.substr(split + 4);
  std::string lower = headers;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const size_t cl = lower.find("\r\ncontent-length:");
  if (cl != std::string::npos &&
      body.size() != std::strtoull(lower.c_str() + cl + 17, nullptr, 10) && method != "HEAD") {
    return r;
  }
  r.status = std::atoi(headers.c_str() + headers.find(' ') + 1);
  r.headers = std::move(headers);
  r.body = std::move(body);
  return r;
}

inline HttpResponse HttpGet(int port, const std::string& target) {
  return HttpRequest(port, "GET", target);
}

// The value of `series` (a metric name with its labels exactly as exposed,
// e.g. lede_kv_slots_in_use or lede_policy_version{version="v2"}) on the
// /metrics page at `port`: `absent` when the page has no such line, NaN when
// the process does not answer.
inline double MetricValue(int port, const std::string& series, double absent = std::nan("")) {
  HttpResponse r = HttpGet(port, "/metrics");
  if (r.status != 200) return std::nan("");
  std::istringstream in(r.body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::strtod(line.c_str() + series.size() + 1, nullptr);
  }
  return absent;
}

inline std::string UrlEncode(const std::string& s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

// A TCP port on 127.0.0.1 for a *child process* that cannot bind port 0 and
// report back (Prometheus, a gRPC target that must stay dead). Two ways a port
// handed out here was lost before the child bound it (both seen in CI, where
// ctest runs tests in parallel):
//  - the kernel's ephemeral range: any outgoing connection of another test can
//    take such a port as its source port. Ports here come from kFirst..kLast,
//    below the ephemeral range (32768.. on Linux) and above the ports
//    tests/scripts/run_script_test.py gives scripts/run clusters (..23404);
//  - another test process picking the same port: each port is reserved by an
//    exclusive flock on /tmp/lede-test-ports/<port>.lock that this process
//    holds until it exits (the descriptor is kept open on purpose).
// Returns 0 when no port in the range is free. Thread-safe.
inline int FreePort() {
  constexpr int kFirst = 24000, kLast = 32000;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  static int next = kFirst + static_cast<int>(::getpid() * 37 % (kLast - kFirst));
  const std::string dir = "/tmp/lede-test-ports";
  ::mkdir(dir.c_str(), 0777);
  ::chmod(dir.c_str(), 01777);
  for (int tries = 0; tries < kLast - kFirst; ++tries) {
    const int port = next;
    next = next + 1 >= kLast ? kFirst : next + 1;
    const std::string lock_path = dir + "/" + std::to_string(port) + ".lock";
    // No usable lock directory (another user's /tmp/lede-test-ports): the
    // range alone still keeps outgoing connections off the port.
    const int lock_fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
    if (lock_fd >= 0 && ::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {  // another test holds it
      ::close(lock_fd);
      continue;
    }
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool bound = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    if (fd >= 0) ::close(fd);
    if (bound) return port;  // lock_fd stays open: the reservation lasts the process
    if (lock_fd >= 0) ::close(lock_fd);  // in use by something outside the tests
  }
  return 0;
}

inline bool FileExecutable(const char* path) { return ::access(path, X_OK) == 0; }

// Runs `command` through the shell; returns its exit status and output.
inline std::pair<int, std::string> RunShell(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace lede::telemetry::test_util

#endif  // LEDE_TESTS_SHARED_TELEMETRY_TELEMETRY_TEST_UTIL_H_
