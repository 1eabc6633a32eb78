// File: shared/experience/request_log.h
//
// The request log (docs/serving.md "Request log"): one lede.v1.RequestRecord
// per finished request (prompt token ids, emitted token ids, sampling
// settings, method, policy version, load, timings, the deployment's measured
// step costs; no text), written by the coordinator to the object store
// beside the experience shards, so that the retrainer can replay whole requests
// exactly (trainer/counterfactual.h). The records hold users' token ids,
// which are equivalent to their text (docs/serving.md "Request log").
//
// It is an ExperienceLogger (experience_logger.h) of another shard kind, so
// it has every guarantee of the experience log: shards framed and CRC-32
// checksummed record by record, complete-or-invisible (atomic Put), a
// bounded queue that drops rather than blocks, counters of records written
// and dropped, retention by bytes and age, stale temporaries removed. Its
// shards are
//   <prefix>/<UTC date>/<writer id>-<seq>.lreq   (default prefix "requests")
// with the magic "LEDREQ1\n" instead of "LEDEXP1\n"; the framing is that of
// experience.h. Sampled requests are logged with their settings; the
// retrainer replays the greedy ones exactly and the sampled ones by
// speculative-sampling acceptance probability (trainer/counterfactual.h).
#ifndef LEDE_SHARED_EXPERIENCE_REQUEST_LOG_H_
#define LEDE_SHARED_EXPERIENCE_REQUEST_LOG_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "proto/lede/v1/experience.pb.h"
#include "shared/experience/experience.h"
#include "shared/experience/experience_logger.h"
#include "shared/status/status.h"
#include "shared/storage/object_store.h"

namespace lede::experience {

inline constexpr char kRequestLogMagic[] = "LEDREQ1\n";
inline constexpr char kRequestLogSuffix[] = ".lreq";
inline constexpr char kRequestLogPrefix[] = "requests";

// `options` with the request log's shard kind (magic, suffix) and, when its
// prefix is the experience default, the prefix "requests".
ExperienceLoggerOptions RequestLogOptions(ExperienceLoggerOptions options);

// Opens a request log on `store` (ExperienceLogger::Create with
// RequestLogOptions(options)). Log(lede::v1::RequestRecord&&) enqueues.
StatusOr<std::unique_ptr<ExperienceLogger>> CreateRequestLog(std::shared_ptr<storage::ObjectStore> store,
                                                             ExperienceLoggerOptions options);

// Whether a request is logged: every request, greedy or sampled (a sampled
// one with its temperature, top_p and seed; RequestRecord), so that the chat
// traffic of a deployment (the OpenAI API defaults to temperature 1) reaches
// the trainer too. The argument is kept for call sites that may filter.
inline bool IsLoggedRequest(float /*temperature*/) { return true; }

// Whether a logged request was greedy, so that replaying it reproduces its
// tokens exactly (temperature 0; records from before sampled requests were
// logged have none).
inline bool IsGreedyRecord(const lede::v1::RequestRecord& r) { return r.temperature() == 0.0f; }

struct RequestLogRead {
  std::vector<lede::v1::RequestRecord> records;
  std::vector<ShardReport> shards;  // one per shard, in key order
  int64_t bad_shards() const {
    int64_t n = 0;
    for (const ShardReport& s : shards) n += s.error.empty() ? 0 : 1;
    return n;
  }
};

// Decodes one request-log shard (its good records appended to `out`). A
// record must parse and hold a request id and a non-empty prompt. The
// checks and texts are those of DecodeShard.
ShardReport DecodeRequestShard(std::string_view bytes, const std::string& name,
                               std::vector<lede::v1::RequestRecord>* out);

// Every request-log shard (keys ending in ".lreq") under `prefix` (a folder,
// recursive), in key order. A truncated or corrupt shard is reported and
// skipped from its first bad record on, an object that cannot be fetched is
// reported; neither is fatal. Errors: those of ObjectStore::List().
StatusOr<RequestLogRead> ReadRequestLog(storage::ObjectStore& store, std::string_view prefix = kRequestLogPrefix);

}  // namespace lede::experience

#endif  // LEDE_SHARED_EXPERIENCE_REQUEST_LOG_H_
