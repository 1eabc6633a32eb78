#include "shared/telemetry/metrics.h"

#include <prometheus/text_serializer.h>

namespace lede::telemetry {

std::string SerializeText(const Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

Family<Counter>& CounterFamily(Registry& r, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}
Family<Gauge>& GaugeFamily(Registry& r, const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}
Counter& UnlabelledCounter(Registry& r, const char* name, const char* help) {
  return CounterFamily(r, name, help).Add({});
}
Gauge& UnlabelledGauge(Registry& r, const char* name, const char* help) { return GaugeFamily(r, name, help).Add({}); }
Histogram& UnlabelledHistogram(Registry& r, const char* name, const char* help, const std::vector<double>& bounds) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, bounds);
}

}  // namespace lede::telemetry
