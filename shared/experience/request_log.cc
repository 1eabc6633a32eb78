#include "shared/experience/request_log.h"

#include <algorithm>
#include <utility>

namespace lede::experience {

ExperienceLoggerOptions RequestLogOptions(ExperienceLoggerOptions options) {
  options.shard_magic = std::string(kRequestLogMagic, kShardMagicSize);
  options.shard_suffix = kRequestLogSuffix;
  if (options.prefix == ExperienceLoggerOptions().prefix) options.prefix = kRequestLogPrefix;
  return options;
}

StatusOr<std::unique_ptr<ExperienceLogger>> CreateRequestLog(std::shared_ptr<storage::ObjectStore> store,
                                                             ExperienceLoggerOptions options) {
  return ExperienceLogger::Create(std::move(store), RequestLogOptions(std::move(options)));
}

ShardReport DecodeRequestShard(std::string_view bytes, const std::string& name,
                               std::vector<lede::v1::RequestRecord>* out) {
  return DecodeFrames(bytes, name, std::string_view(kRequestLogMagic, kShardMagicSize), "a request-log shard",
                      [&](int64_t, std::string_view payload) -> std::string {
                        lede::v1::RequestRecord r;
                        if (!r.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
                          return "unparsable lede.v1.RequestRecord";
                        }
                        if (r.request_id().empty() || r.prompt_token_ids_size() == 0) {
                          return "invalid lede.v1.RequestRecord: no request id or an empty prompt";
                        }
                        out->push_back(std::move(r));
                        return "";
                      });
}

StatusOr<RequestLogRead> ReadRequestLog(storage::ObjectStore& store, std::string_view prefix) {
  std::string folder(prefix);
  if (!folder.empty() && folder.back() != '/') folder += '/';
  StatusOr<std::vector<storage::ObjectInfo>> listed = store.List(folder);
  if (!listed.ok()) return listed.status();
  std::vector<storage::ObjectInfo> objects = *std::move(listed);
  std::sort(objects.begin(), objects.end(),
            [](const storage::ObjectInfo& a, const storage::ObjectInfo& b) { return a.key < b.key; });
  const std::string_view suffix = kRequestLogSuffix;
  RequestLogRead result;
  for (const storage::ObjectInfo& o : objects) {
    if (o.key.size() <= suffix.size() || o.key.compare(o.key.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    StatusOr<std::string> bytes = store.Get(o.key);
    if (!bytes.ok()) {
      ShardReport report;
      report.path = o.key;
      report.error = "cannot read: " + bytes.status().ToString();
      result.shards.push_back(std::move(report));
      continue;
    }
    result.shards.push_back(DecodeRequestShard(*bytes, o.key, &result.records));
  }
  return result;
}

}  // namespace lede::experience
