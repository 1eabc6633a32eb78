#include "shared/log/log.h"

#include <cstdio>
#include <ctime>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace lede::log {
namespace {

// Guards the process name and keeps each line one write.
absl::Mutex log_mu(absl::kConstInit);
std::string* process_name ABSL_GUARDED_BY(log_mu) = nullptr;  // null = "lede"

std::string Quote(std::string_view v) {
  bool plain = !v.empty();
  for (char c : v) {
    if (c == ' ' || c == '"' || c == '=' || c == '\n' || c == '\t') plain = false;
  }
  if (plain) return std::string(v);
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

void SetLogProcessName(std::string name) {
  absl::MutexLock lock(&log_mu);
  if (process_name == nullptr) {
    process_name = new std::string(std::move(name));  // never freed: logging lasts until exit
  } else {
    *process_name = std::move(name);
  }
}

void LogEvent(std::string_view level, std::string_view event,
              std::initializer_list<std::pair<std::string_view, std::string>> fields) {
  char ts[40];
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  tm utc;
  gmtime_r(&now.tv_sec, &utc);
  size_t n = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &utc);
  snprintf(ts + n, sizeof(ts) - n, ".%03ldZ", now.tv_nsec / 1000000);
  absl::MutexLock lock(&log_mu);
  std::string line = "ts=" + std::string(ts) + " level=" + std::string(level) +
                     " proc=" + (process_name == nullptr ? std::string("lede") : *process_name) +
                     " event=" + Quote(event);
  for (const auto& [key, value] : fields) line += " " + std::string(key) + "=" + Quote(value);
  line += "\n";
  fwrite(line.data(), 1, line.size(), stderr);
  fflush(stderr);
}

}  // namespace lede::log
