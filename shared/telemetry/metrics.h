// File: shared/telemetry/metrics.h
//
// A small in-process metrics library with prometheus-cpp's shape (Registry →
// Family<T> → Counter / Gauge / Histogram) that renders the Prometheus text
// exposition format 0.0.4. prometheus-cpp is not packaged on Debian 12, and
// what we need of it is a few hundred lines, so we keep our own (torch-free,
// no protobuf). MetricsServer (metrics_server.h) serves it over HTTP and
// lede_metrics.h defines the project's metric names (DESIGN.md §6) once.
//
// Ownership: the Registry owns every family and every metric in it. Nothing is
// ever removed, so a reference returned by AddCounter()/Add() stays valid, at
// the same address, for the Registry's lifetime.
//
// Thread-safety: everything here is thread-safe. The hot path (Increment,
// Set, Observe) is lock-free: values are std::atomic<double> updated with a
// compare-exchange loop (C++17 has no atomic<double>::fetch_add), histogram
// buckets are std::atomic<uint64_t>. Registering a family or adding a labelled
// child takes a mutex; do it at setup and keep the reference.
//
// Errors: metric and label *names* are compile-time constants in our code, so
// an invalid name, a label set that does not match the family's label names,
// or one name registered twice with a different type, help, label names or
// buckets is a programmer error: it aborts with a message naming the
// offending name (as CHECK would), instead of making every definition site
// handle a Status that cannot occur at run time. Code with run-time names can
// call IsValidMetricName()/IsValidLabelName() first. Label *values* are data:
// any UTF-8 string is accepted and escaped on output.
//
// Example:
//   lede::telemetry::Registry registry;
//   auto& requests = registry.AddCounter("lede_requests_total",
//                                        "Finished requests.", {"status"});
//   lede::telemetry::Counter& ok = requests.Add({{"status", "OK"}});
//   ok.Increment();
//   auto& latency = registry.AddHistogram(
//       "lede_round_latency_seconds", "Round latency.", {},
//       lede::telemetry::ExponentialBuckets(0.001, 2, 12));
//   latency.Add({}).Observe(0.004);
//   std::string text = registry.Serialize();  // text format 0.0.4
#ifndef LEDE_SHARED_TELEMETRY_METRICS_H_
#define LEDE_SHARED_TELEMETRY_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace lede::telemetry {

// Label name → label value. Keys must equal the family's label names exactly.
using Labels = std::map<std::string, std::string>;

// A value that only goes up (requests, tokens). Resets only with the process.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `delta` (>= 0, in the metric's unit). A negative or NaN delta is
  // ignored (as prometheus-cpp does): a counter never goes down, and a metric
  // must not crash the server. Lock-free.
  void Increment(double delta = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (slots in use, a version number).
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double delta = 1.0);  // lock-free
  void Decrement(double delta = 1.0) { Increment(-delta); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Counts observations into buckets with explicit upper bounds (inclusive,
// Prometheus `le`), plus an implicit +Inf bucket, their sum and count.
class Histogram {
 public:
  // Cumulative view for tests and serialization.
  struct Snapshot {
    std::vector<double> bounds;         // upper bounds, without +Inf
    std::vector<uint64_t> cumulative;   // [bounds.size() + 1]; last = +Inf = count
    double sum = 0;                     // sum of observed values
    uint64_t count = 0;                 // == cumulative.back()
  };

  // `bounds` must be finite and strictly increasing (checked by the Registry).
  explicit Histogram(std::vector<double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Adds one observation to the first bucket whose bound is >= value (or
  // +Inf) and to the sum. A NaN observation is dropped. Lock-free: one bucket
  // counter and the sum are updated separately, so a concurrent scrape can see
  // the bucket before the sum; _count is derived from the buckets, so
  // _count always equals the +Inf bucket.
  void Observe(double value);

  Snapshot Collect() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // [bounds_.size() + 1], not cumulative
  std::atomic<double> sum_{0.0};
};

// `count` bounds start, start + width, ..., start + (count-1) * width (each
// computed as start + i * width, so no rounding drift).
// Example: LinearBuckets(0, 1, 17) = {0, 1, ..., 16}.
std::vector<double> LinearBuckets(double start, double width, int count);

// `count` bounds start, start * factor, ..., start * factor^(count-1).
// start > 0, factor > 1. Example: ExponentialBuckets(0.001, 2, 4) =
// {0.001, 0.002, 0.004, 0.008}.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// Prometheus names: metric [a-zA-Z_:][a-zA-Z0-9_:]*, label
// [a-zA-Z_][a-zA-Z0-9_]* and not starting with "__" (reserved).
bool IsValidMetricName(std::string_view name);
bool IsValidLabelName(std::string_view name);

enum class MetricType { kCounter, kGauge, kHistogram };

class Registry;

// One metric name with a fixed list of label names; one child metric T per
// distinct set of label values. Owned by its Registry.
template <typename T>
class Family {
 public:
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  // The child for `labels` (created, at zero, on first use; the same object
  // afterwards). The keys of `labels` must be exactly label_names(); anything
  // else aborts (programmer error). Takes the family's mutex: call it at setup
  // or on rare paths and keep the reference for the hot path.
  // Histogram children all use the bounds given to Registry::AddHistogram.
  T& Add(const Labels& labels);

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

 private:
  friend class Registry;
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> bounds);
  // Appends the samples (not HELP/TYPE) in label-value order.
  void SerializeSamples(std::string* out) const;
  bool empty() const;

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only
  mutable absl::Mutex mu_;
  // Key: label values in label_names_ order.
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

// Owns metric families and renders them. Not copyable or movable (families
// hand out references into it).
class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registers a family, or returns the existing one when `name` was already
  // registered with the same type, help, label names (and bounds). Aborts on
  // an invalid name, an invalid or duplicated label name ("le" is reserved
  // for histograms), a conflicting re-registration, or histogram bounds that
  // are not finite and strictly increasing (an empty list is allowed: only
  // the +Inf bucket).
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              const std::vector<std::string>& label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          const std::vector<std::string>& label_names = {});
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  const std::vector<std::string>& label_names,
                                  const std::vector<double>& bounds);

  // The Prometheus text exposition format 0.0.4 of every family that has at
  // least one child: families in name order, each with "# HELP" (\ and
  // newline escaped) and "# TYPE", then samples in label-value order, labels
  // in declaration order with values escaped (\\, \", \n). Histograms emit
  // cumulative name_bucket{...,le="<bound>"} lines ending in le="+Inf", then
  // name_sum and name_count. Numbers use the shortest round-trip form
  // ("1", "0.25", "1e-05", "+Inf", "-Inf", "NaN"). No timestamps.
  // Safe to call concurrently with every other method.
  std::string Serialize() const;

 private:
  using AnyFamily = std::variant<std::unique_ptr<Family<Counter>>, std::unique_ptr<Family<Gauge>>,
                                 std::unique_ptr<Family<Histogram>>>;
  template <typename T>
  Family<T>& AddFamily(MetricType type, const std::string& name, const std::string& help,
                       const std::vector<std::string>& label_names, const std::vector<double>& bounds);

  mutable absl::Mutex mu_;
  std::map<std::string, AnyFamily> families_ ABSL_GUARDED_BY(mu_);
};

namespace internal {
// Exposed for tests. Shortest round-trip decimal form of `v`; "+Inf", "-Inf", "NaN".
std::string FormatValue(double v);
// Label value escaping: \ → \\, " → \", newline → \n.
std::string EscapeLabelValue(std::string_view v);
// HELP escaping: \ → \\, newline → \n.
std::string EscapeHelp(std::string_view v);
}  // namespace internal

}  // namespace lede::telemetry

#endif  // LEDE_SHARED_TELEMETRY_METRICS_H_
