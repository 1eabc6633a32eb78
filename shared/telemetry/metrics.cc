#include "shared/telemetry/metrics.h"

#include <prometheus/text_serializer.h>

namespace lede::telemetry {

std::string SerializeText(const Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

}  // namespace lede::telemetry
