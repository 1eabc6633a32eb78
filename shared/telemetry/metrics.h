// File: shared/telemetry/metrics.h
//
// LEDE's metrics are prometheus-cpp's (Debian's prometheus-cpp-dev 1.0.1,
// core library only): this header brings its Registry, Family, Counter,
// Gauge and Histogram into lede::telemetry and adds the text exposition of a
// registry. lede_metrics.h defines the project's metric names once, and
// MetricsServer (metrics_server.h) serves them over HTTP.
//
// Ownership: a Registry owns its families and a Family its children; a
// reference returned by Family::Add() stays valid for the Registry's
// lifetime (LEDE never calls Remove()).
//
// Thread-safety (prometheus-cpp's contract): every operation is
// thread-safe. Increment/Set/Observe are atomic updates; Family::Add() and
// Registry::Collect() take a mutex, so look children up once at setup and
// keep the reference.
//
// Errors: prometheus-cpp throws std::invalid_argument for an invalid metric
// or label name, a label set that does not match, or one name registered
// twice with another type. Our names are compile-time constants, so that is
// a programmer error caught by the tests, never input from the wire; label
// *values* may be any UTF-8 string and are escaped on output.
//
// Example:
//   lede::telemetry::Registry registry;
//   auto& requests = prometheus::BuildCounter()
//                        .Name("lede_requests_total").Help("Finished requests.")
//                        .Register(registry);
//   requests.Add({{"status", "OK"}}).Increment();
//   std::string text = lede::telemetry::SerializeText(registry);  // format 0.0.4
#ifndef LEDE_SHARED_TELEMETRY_METRICS_H_
#define LEDE_SHARED_TELEMETRY_METRICS_H_

#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/labels.h>
#include <prometheus/registry.h>

namespace lede::telemetry {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;
using prometheus::Registry;

// The Prometheus text exposition format 0.0.4 of everything in `registry`
// (prometheus::TextSerializer over Registry::Collect()): families in
// registration order, "# HELP" / "# TYPE", cumulative histogram buckets
// ending in le="+Inf", with _count and _sum. A family without children (a
// labelled metric no label set was used for yet) is omitted. Safe to call
// concurrently with updates.
std::string SerializeText(const Registry& registry);

// Registering a metric by name and help text (the project's names are
// compile-time constants; prometheus-cpp's errors above apply). Registering
// a name twice with the same type returns the same family.
Family<Counter>& CounterFamily(Registry& r, const char* name, const char* help);
Family<Gauge>& GaugeFamily(Registry& r, const char* name, const char* help);
// The one child with no labels of a new family.
Counter& UnlabelledCounter(Registry& r, const char* name, const char* help);
Gauge& UnlabelledGauge(Registry& r, const char* name, const char* help);
Histogram& UnlabelledHistogram(Registry& r, const char* name, const char* help, const std::vector<double>& bounds);

// The Content-Type of SerializeText()'s output.
inline constexpr char kTextContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace lede::telemetry

#endif  // LEDE_SHARED_TELEMETRY_METRICS_H_
