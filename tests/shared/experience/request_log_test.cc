// The request log (shared/experience/request_log.h): request records go
// through the experience logger's machinery into ".lreq" shards of their own
// magic beside the experience shards; a truncated or corrupt shard is
// skipped and reported; the two kinds never read as each other; retention
// of one kind leaves the other.
#include "shared/experience/request_log.h"

#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/lede/v1/experience.pb.h"
#include "shared/experience/experience.h"
#include "shared/experience/experience_logger.h"
#include "shared/experience/retention.h"
#include "shared/storage/object_store.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::experience {
namespace {

using ::lede::testing::IsOk;
using ::testing::HasSubstr;

lede::v1::RequestRecord MakeRequest(int i) {
  lede::v1::RequestRecord r;
  r.set_request_id("req-" + std::to_string(i));
  for (int t = 0; t < 5 + i % 7; ++t) r.add_prompt_token_ids(1 + (i * 31 + t) % 500);
  for (int t = 0; t < 20; ++t) r.add_output_token_ids((i + t * 17) % 500);
  r.set_ended_on_eos(i % 3 == 0);
  r.set_max_new_tokens(64);
  r.set_method("lede");
  r.set_policy_version("cold-start-v1");
  r.set_model_fingerprint("07e04f79d11d13b5");
  r.set_load(1 + i % 4);
  r.set_prefill_us(1000 + i);
  r.set_decode_us(20000 + i);
  r.set_rounds(6);
  r.set_drafted_tokens(15);
  r.set_accepted_tokens(12);
  r.set_time_us(1764800000000000 + i);
  return r;
}

lede::v1::Transition MakeTransition(int i) {
  lede::v1::Transition t;
  for (int k = 0; k < 14; ++k) t.add_state(0.01f * static_cast<float>(k + i));
  t.set_action(lede::v1::EXIT_ACTION_EXIT);
  t.set_phase(lede::v1::PHASE_DRAFT_LENGTH);
  t.set_done(true);
  t.set_layer(2);
  t.set_n_layers(8);
  t.set_request_id("req-" + std::to_string(i));
  return t;
}

struct Fixture {
  Fixture() {
    auto opened = storage::OpenObjectStore("file://" + tmp.path().string());
    EXPECT_TRUE(opened.ok());
    store = std::shared_ptr<storage::ObjectStore>(std::move(*opened));
  }
  lede::testing::TempDir tmp;
  std::shared_ptr<storage::ObjectStore> store;
};

ExperienceLoggerOptions Small() {
  ExperienceLoggerOptions o;
  o.writer_id = "w1";
  o.initial_backoff = absl::Milliseconds(1);
  return o;
}

TEST(RequestLogTest, RecordsRoundTripBesideTheExperienceShards) {
  Fixture f;
  auto requests = CreateRequestLog(f.store, Small());
  ASSERT_THAT(requests, IsOk());
  auto experience = ExperienceLogger::Create(f.store, Small());
  ASSERT_THAT(experience, IsOk());
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE((*requests)->Log(MakeRequest(i)));
    ASSERT_TRUE((*experience)->Log(MakeTransition(i)));
  }
  ASSERT_THAT((*requests)->Flush(), IsOk());
  for (int i = 40; i < 50; ++i) ASSERT_TRUE((*requests)->Log(MakeRequest(i)));
  ASSERT_THAT((*requests)->Close(), IsOk());
  ASSERT_THAT((*experience)->Close(), IsOk());

  auto objects = f.store->List("requests/");
  ASSERT_THAT(objects, IsOk());
  ASSERT_EQ(objects->size(), 2u);
  const std::regex key_re(R"(requests/\d{4}-\d{2}-\d{2}/w1-0000000[01]\.lreq)");
  for (const auto& o : *objects) {
    EXPECT_TRUE(std::regex_match(o.key, key_re)) << o.key;
    auto bytes = f.store->Get(o.key);
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(bytes->substr(0, 8), "LEDREQ1\n");
  }
  auto read = ReadRequestLog(*f.store);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->bad_shards(), 0);
  ASSERT_EQ(read->records.size(), 50u);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(read->records[i].SerializeAsString(), MakeRequest(i).SerializeAsString()) << i;
  }
  const ExperienceLoggerCounters c = (*requests)->counters();
  EXPECT_EQ(c.records_logged, 50);
  EXPECT_EQ(c.records_written, 50);
  EXPECT_EQ(c.shards_written, 2);
  EXPECT_EQ(c.records_dropped, 0);

  // The experience reader sees only transitions, the request reader only requests.
  auto transitions = ReadShardsFromStore(*f.store, "");
  ASSERT_THAT(transitions, IsOk());
  EXPECT_EQ(transitions->transitions.size(), 40u);
  for (const ShardReport& s : transitions->shards) EXPECT_EQ(s.error, "") << s.path;
  auto from_root = ReadRequestLog(*f.store, "");
  ASSERT_THAT(from_root, IsOk());
  EXPECT_EQ(from_root->records.size(), 50u);
}

TEST(RequestLogTest, TruncatedAndCorruptShardsAreSkippedAndCounted) {
  Fixture f;
  std::vector<std::string> shards;
  for (int s = 0; s < 3; ++s) {
    ShardEncoder enc(std::string_view(kRequestLogMagic, kShardMagicSize));
    for (int i = 0; i < 4; ++i) ASSERT_THAT(enc.Append(MakeRequest(s * 4 + i)), IsOk());
    shards.push_back(enc.TakeBytes());
  }
  // Shard 1 loses its last 5 bytes; shard 2 has a byte of its second record flipped.
  shards[1].resize(shards[1].size() - 5);
  const size_t second = 8 + 8 + MakeRequest(8).ByteSizeLong();
  shards[2][second + 8 + 3] ^= 0x40;
  for (int s = 0; s < 3; ++s) {
    ASSERT_THAT(f.store->Put("requests/2026-12-04/w-" + std::to_string(s) + ".lreq", shards[s]), IsOk());
  }
  // An experience shard under the request prefix is not a request-log shard.
  ASSERT_THAT(f.store->Put("requests/2026-12-04/x.lreq", std::string("LEDEXP1\n")), IsOk());
  auto read = ReadRequestLog(*f.store);
  ASSERT_THAT(read, IsOk());
  ASSERT_EQ(read->shards.size(), 4u);
  EXPECT_EQ(read->bad_shards(), 3);
  EXPECT_EQ(read->shards[0].error, "");
  EXPECT_EQ(read->shards[0].records, 4);
  EXPECT_THAT(read->shards[1].error, HasSubstr("truncated payload"));
  EXPECT_EQ(read->shards[1].records, 3);
  EXPECT_THAT(read->shards[2].error, HasSubstr("record 1"));
  EXPECT_THAT(read->shards[2].error, HasSubstr("checksum mismatch"));
  EXPECT_EQ(read->shards[2].records, 1);
  EXPECT_THAT(read->shards[3].error, HasSubstr("bad file magic (not a request-log shard)"));
  EXPECT_EQ(read->records.size(), 8u);
}

TEST(RequestLogTest, RecordsWithoutIdOrPromptAreInvalid) {
  ShardEncoder enc(std::string_view(kRequestLogMagic, kShardMagicSize));
  ASSERT_THAT(enc.Append(MakeRequest(0)), IsOk());
  lede::v1::RequestRecord empty = MakeRequest(1);
  empty.clear_prompt_token_ids();
  ASSERT_THAT(enc.Append(empty), IsOk());
  std::vector<lede::v1::RequestRecord> out;
  const ShardReport r = DecodeRequestShard(enc.TakeBytes(), "s", &out);
  EXPECT_EQ(r.records, 1);
  EXPECT_THAT(r.error, HasSubstr("empty prompt"));
}

TEST(RequestLogTest, RetentionOfOneKindLeavesTheOther) {
  Fixture f;
  for (int s = 0; s < 3; ++s) {
    ShardEncoder req(std::string_view(kRequestLogMagic, kShardMagicSize));
    ASSERT_THAT(req.Append(MakeRequest(s)), IsOk());
    ASSERT_THAT(f.store->Put("requests/d/r" + std::to_string(s) + ".lreq", req.TakeBytes()), IsOk());
    ShardEncoder exp;
    ASSERT_THAT(exp.Append(MakeTransition(s)), IsOk());
    ASSERT_THAT(f.store->Put("requests/d/e" + std::to_string(s) + ".lexp", exp.TakeBytes()), IsOk());
  }
  RetentionPolicy p;
  p.max_total_bytes = 1;  // keep nothing
  auto r = ApplyRetention(*f.store, "requests/", p, absl::Now(), kRequestLogSuffix);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->shards_deleted, 3);
  auto left = f.store->List("requests/");
  ASSERT_THAT(left, IsOk());
  ASSERT_EQ(left->size(), 3u);
  for (const auto& o : *left) EXPECT_THAT(o.key, HasSubstr(".lexp"));
}

TEST(RequestLogTest, OptionsTakeTheRequestLogKindAndPrefix) {
  ExperienceLoggerOptions o = RequestLogOptions(ExperienceLoggerOptions());
  EXPECT_EQ(o.prefix, "requests");
  EXPECT_EQ(o.shard_suffix, ".lreq");
  EXPECT_EQ(o.shard_magic, std::string("LEDREQ1\n"));
  ExperienceLoggerOptions custom;
  custom.prefix = "tenant-a/requests";
  EXPECT_EQ(RequestLogOptions(custom).prefix, "tenant-a/requests");
  ExperienceLoggerOptions bad;
  bad.shard_magic = "short";
  Fixture f;
  EXPECT_FALSE(ExperienceLogger::Create(f.store, bad).ok());
  EXPECT_TRUE(IsLoggedRequest(0.0f));
  EXPECT_TRUE(IsLoggedRequest(0.7f));  // sampled traffic is logged too
  lede::v1::RequestRecord greedy, sampled;
  sampled.set_temperature(0.8f);
  EXPECT_TRUE(IsGreedyRecord(greedy));
  EXPECT_FALSE(IsGreedyRecord(sampled));
}

}  // namespace
}  // namespace lede::experience
