#include "shared/experience/request_log.h"

#include <utility>

#include "shared/status/status_macros.h"

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
  RequestLogRead result;
  LEDE_RETURN_IF_ERROR(ReadStoreShards(
      store, prefix, kRequestLogSuffix,
      [&result](std::string_view bytes, const std::string& key) { return DecodeRequestShard(bytes, key, &result.records); },
      &result.shards));
  return result;
}

}  // namespace lede::experience
