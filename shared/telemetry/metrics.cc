#include "shared/telemetry/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <utility>

namespace lede::telemetry {
namespace {

// Programmer errors (bad names, conflicting registrations) abort, see the
// header's "Errors" paragraph.
[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "lede::telemetry: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

// C++17 has no atomic<double>::fetch_add; a relaxed CAS loop is lock-free on
// every platform we build for.
void AtomicAdd(std::atomic<double>& a, double delta) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + delta, std::memory_order_relaxed,
                                  std::memory_order_relaxed)) {
  }
}

const char* TypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

template <typename T> constexpr MetricType TypeOf();
template <> constexpr MetricType TypeOf<Counter>() { return MetricType::kCounter; }
template <> constexpr MetricType TypeOf<Gauge>() { return MetricType::kGauge; }
template <> constexpr MetricType TypeOf<Histogram>() { return MetricType::kHistogram; }

template <typename T>
constexpr MetricType FamilyType(const Family<T>&) { return TypeOf<T>(); }

template <typename T>
std::unique_ptr<T> MakeChild(const std::vector<double>& bounds) {
  if constexpr (std::is_same_v<T, Histogram>) {
    return std::make_unique<Histogram>(bounds);
  } else {
    return std::make_unique<T>();
  }
}

// Appends `{a="x",b="y"}` (or nothing when there are no labels), with an
// optional extra trailing label (histogram `le`).
void AppendLabels(const std::vector<std::string>& names, const std::vector<std::string>& values,
                  const char* extra_name, const std::string& extra_value, std::string* out) {
  if (names.empty() && extra_name == nullptr) return;
  out->push_back('{');
  bool first = true;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!first) out->push_back(',');
    first = false;
    *out += names[i];
    *out += "=\"";
    *out += internal::EscapeLabelValue(values[i]);
    out->push_back('"');
  }
  if (extra_name != nullptr) {
    if (!first) out->push_back(',');
    *out += extra_name;
    *out += "=\"";
    *out += extra_value;  // a formatted number: nothing to escape
    out->push_back('"');
  }
  out->push_back('}');
}

void AppendSample(const std::string& name, const std::vector<std::string>& label_names,
                  const std::vector<std::string>& label_values, double value, std::string* out) {
  *out += name;
  AppendLabels(label_names, label_values, nullptr, "", out);
  out->push_back(' ');
  *out += internal::FormatValue(value);
  out->push_back('\n');
}

}  // namespace

// --- values ------------------------------------------------------------------

void Counter::Increment(double delta) {
  if (!(delta >= 0)) return;  // negative or NaN: ignored (see header)
  AtomicAdd(value_, delta);
}

void Gauge::Increment(double delta) { AtomicAdd(value_, delta); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  // First bound >= value: `le` is inclusive. end() is the +Inf bucket.
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> b;
  b.reserve(std::max(count, 0));
  for (int i = 0; i < count; ++i) b.push_back(start + i * width);
  return b;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  b.reserve(std::max(count, 0));
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

// --- names -------------------------------------------------------------------

bool IsValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  auto head = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
  };
  if (!head(name[0])) return false;
  for (char c : name.substr(1)) {
    if (!head(c) && !(c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool IsValidLabelName(std::string_view name) {
  if (name.empty()) return false;
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_') return false;  // reserved
  auto head = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!head(name[0])) return false;
  for (char c : name.substr(1)) {
    if (!head(c) && !(c >= '0' && c <= '9')) return false;
  }
  return true;
}

namespace internal {

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip
  if (ec != std::errc()) return "NaN";  // cannot happen with 64 bytes
  return std::string(buf, end);
}

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace internal

// --- Family --------------------------------------------------------------------

template <typename T>
Family<T>::Family(std::string name, std::string help, std::vector<std::string> label_names,
                  std::vector<double> bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)) {}

template <typename T>
T& Family<T>::Add(const Labels& labels) {
  std::vector<std::string> values;
  values.reserve(label_names_.size());
  for (const std::string& n : label_names_) {
    auto it = labels.find(n);
    if (it == labels.end()) Die("metric " + name_ + ": missing label \"" + n + "\"");
    values.push_back(it->second);
  }
  if (labels.size() != label_names_.size()) {
    for (const auto& [k, v] : labels) {
      if (std::find(label_names_.begin(), label_names_.end(), k) == label_names_.end()) {
        Die("metric " + name_ + ": unknown label \"" + k + "\"");
      }
    }
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<T>& child = children_[std::move(values)];
  if (child == nullptr) child = MakeChild<T>(bounds_);
  return *child;
}

template <typename T>
bool Family<T>::empty() const {
  absl::MutexLock lock(&mu_);
  return children_.empty();
}

template <typename T>
void Family<T>::SerializeSamples(std::string* out) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      const Histogram::Snapshot s = child->Collect();
      const std::string bucket = name_ + "_bucket";
      for (size_t i = 0; i <= s.bounds.size(); ++i) {
        *out += bucket;
        AppendLabels(label_names_, values, "le",
                     i < s.bounds.size() ? internal::FormatValue(s.bounds[i]) : "+Inf", out);
        out->push_back(' ');
        *out += std::to_string(s.cumulative[i]);
        out->push_back('\n');
      }
      AppendSample(name_ + "_sum", label_names_, values, s.sum, out);
      AppendSample(name_ + "_count", label_names_, values, static_cast<double>(s.count), out);
    } else {
      AppendSample(name_, label_names_, values, child->Value(), out);
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// --- Registry ------------------------------------------------------------------

template <typename T>
Family<T>& Registry::AddFamily(MetricType type, const std::string& name, const std::string& help,
                               const std::vector<std::string>& label_names,
                               const std::vector<double>& bounds) {
  if (!IsValidMetricName(name)) Die("invalid metric name \"" + name + "\"");
  std::set<std::string> seen;
  for (const std::string& l : label_names) {
    if (!IsValidLabelName(l)) Die("metric " + name + ": invalid label name \"" + l + "\"");
    if (type == MetricType::kHistogram && l == "le") {
      Die("metric " + name + ": label name \"le\" is reserved for histogram buckets");
    }
    if (!seen.insert(l).second) Die("metric " + name + ": duplicate label name \"" + l + "\"");
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1]))) {
      Die("metric " + name + ": histogram bounds must be finite and strictly increasing");
    }
  }
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    auto* existing = std::get_if<std::unique_ptr<Family<T>>>(&it->second);
    if (existing == nullptr || (*existing)->help() != help ||
        (*existing)->label_names() != label_names || (*existing)->bounds_ != bounds) {
      Die("metric " + name + " registered twice with a different type, help, labels or buckets");
    }
    return **existing;
  }
  auto family = std::unique_ptr<Family<T>>(new Family<T>(name, help, label_names, bounds));
  Family<T>& ref = *family;
  families_.emplace(name, std::move(family));
  return ref;
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      const std::vector<std::string>& label_names) {
  return AddFamily<Counter>(MetricType::kCounter, name, help, label_names, {});
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  const std::vector<std::string>& label_names) {
  return AddFamily<Gauge>(MetricType::kGauge, name, help, label_names, {});
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          const std::vector<std::string>& label_names,
                                          const std::vector<double>& bounds) {
  return AddFamily<Histogram>(MetricType::kHistogram, name, help, label_names, bounds);
}

std::string Registry::Serialize() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, any] : families_) {
    std::visit(
        [&](const auto& family) {
          if (family->empty()) return;
          out += "# HELP " + name + " " + internal::EscapeHelp(family->help()) + "\n";
          out += "# TYPE " + name + " ";
          out += TypeName(FamilyType(*family));
          out += "\n";
          family->SerializeSamples(&out);
        },
        any);
  }
  return out;
}

}  // namespace lede::telemetry
