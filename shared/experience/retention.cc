#include "shared/experience/retention.h"

#include <algorithm>
#include <string>
#include <vector>

#include "shared/experience/experience.h"
#include "shared/status/status_macros.h"

namespace lede::experience {
namespace {

bool IsShardKey(const std::string& key, std::string_view suffix) {
  return key.size() > suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

StatusOr<RetentionResult> ApplyRetention(storage::ObjectStore& store, std::string_view prefix,
                                         const RetentionPolicy& policy, absl::Time now,
                                         std::string_view suffix) {
  if (policy.max_total_bytes < 0 || policy.max_age < absl::ZeroDuration()) {
    return InvalidArgumentError("RetentionPolicy: max_total_bytes and max_age must not be negative");
  }
  LEDE_RETURN_IF_ERROR(storage::ValidatePrefix(prefix));
  RetentionResult result;
  if (!policy.enabled()) return result;
  LEDE_ASSIGN_OR_RETURN(std::vector<storage::ObjectInfo> objects, store.List(prefix));
  std::vector<storage::ObjectInfo> shards;
  for (storage::ObjectInfo& o : objects) {
    if (IsShardKey(o.key, suffix)) shards.push_back(std::move(o));
  }
  std::sort(shards.begin(), shards.end(), [](const storage::ObjectInfo& a, const storage::ObjectInfo& b) {
    return a.modified != b.modified ? a.modified < b.modified : a.key < b.key;
  });
  int64_t total = 0;
  for (const storage::ObjectInfo& o : shards) total += o.size_bytes;
  const bool by_age = policy.max_age > absl::ZeroDuration();
  const absl::Time cutoff = now - policy.max_age;
  for (const storage::ObjectInfo& o : shards) {
    const bool too_old = by_age && o.modified != absl::InfinitePast() && o.modified < cutoff;
    const bool too_big = policy.max_total_bytes > 0 && total > policy.max_total_bytes;
    if (!too_old && !too_big) {
      ++result.shards_kept;
      result.bytes_kept += o.size_bytes;
      continue;
    }
    LEDE_RETURN_IF_ERROR(store.Delete(o.key));
    ++result.shards_deleted;
    result.bytes_deleted += o.size_bytes;
    total -= o.size_bytes;
  }
  return result;
}

}  // namespace lede::experience
