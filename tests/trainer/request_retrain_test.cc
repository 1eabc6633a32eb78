// Retraining on the request log (trainer/request_retrain.h) on
// models/lede-tiny: greedy requests logged through the request log, a
// cold-start serving policy, a candidate trained by the counterfactual
// trainer and judged by exact replay on held-out requests; nothing without
// new requests; shards of another model skipped; corrupt shards skipped.
#include "trainer/request_retrain.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/dqn/artifact.h"
#include "shared/experience/request_log.h"
#include "shared/experience/served_costs.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/cost/cost_profiles.h"
#include "shared/model/decoding.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/trainer/cost_profiles.h"
#include "trainer/cold_start.h"
#include "trainer/corpus.h"
#include "trainer/heldout_split.h"
#include "trainer/retrain.h"
#include "trainer/retrain_metrics.h"
#include "shared/telemetry/metrics.h"

namespace lede::trainer {
namespace {

using testing::CostlyVerificationProfile;

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kModelDir[] = "models/lede-tiny";

class RequestRetrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto loaded = model::LlamaModel::Load(kModelDir, model::ModelOptions{});
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    model_ = std::shared_ptr<const model::LlamaModel>(std::move(*loaded));
    model::KvCacheOptions ko;
    ko.max_draft_len = 8;
    auto engine = model::Engine::Create(model_, ko);
    ASSERT_TRUE(engine.ok());
    auto path = tokenizer::FindTokenizerFile(kModelDir);
    ASSERT_TRUE(path.ok());
    auto tok = tokenizer::LoadTokenizer(*path);
    ASSERT_TRUE(tok.ok());
    std::vector<std::vector<int32_t>> prompts;
    for (const char* set : {"models/lede-tiny/prompts/story.jsonl", "models/lede-tiny/prompts/code.jsonl"}) {
      auto s = LoadPromptSet(set, **tok, 12, 32, 128);
      ASSERT_TRUE(s.ok()) << s.status().message();
      for (const auto& p : s->tuning) prompts.push_back(p);
    }
    // What the coordinator logs for a greedy request.
    for (size_t i = 0; i < prompts.size(); ++i) {
      model::GenerateOptions o;
      o.max_new_tokens = 32;
      auto r = (*engine)->Generate(prompts[i], o);
      ASSERT_TRUE(r.ok());
      lede::v1::RequestRecord rec;
      rec.set_request_id("req-" + std::to_string(i));
      rec.mutable_prompt_token_ids()->Add(prompts[i].begin(), prompts[i].end());
      rec.mutable_output_token_ids()->Add(r->tokens.begin(), r->tokens.end());
      rec.set_ended_on_eos(r->finish == model::FinishReason::kEos);
      rec.set_max_new_tokens(32);
      rec.set_method("lede");
      rec.set_policy_version("cold-start-v1");
      rec.set_model_fingerprint(model_->config().ArchitectureFingerprint());
      rec.set_load(1);
      records_.push_back(rec);
    }
    // What the coordinator logs for a sampled request (temperature 0.8,
    // top_p 0.95, its seed), with ids chosen so that some are held out.
    const double heldout = RequestRetrainOptions().heldout_fraction;
    std::vector<std::string> held, kept;
    for (int k = 0; held.size() < 4 || kept.size() < 8; ++k) {
      const std::string id = "sampled-" + std::to_string(k);
      auto& into = IsHeldOut(id, heldout) ? held : kept;
      if (into.size() < (&into == &held ? 4u : 8u)) into.push_back(id);
    }
    held.insert(held.end(), kept.begin(), kept.end());
    for (size_t i = 0; i < held.size(); ++i) {
      model::GenerateOptions o;
      o.max_new_tokens = 32;
      o.sampling.temperature = 0.8;
      o.sampling.top_p = 0.95;
      o.sampling.seed = 100 + i;
      const std::vector<int32_t>& prompt = prompts[i % prompts.size()];
      auto r = (*engine)->Generate(prompt, o);
      ASSERT_TRUE(r.ok());
      lede::v1::RequestRecord rec;
      rec.set_request_id(held[i]);
      rec.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
      rec.mutable_output_token_ids()->Add(r->tokens.begin(), r->tokens.end());
      rec.set_ended_on_eos(r->finish == model::FinishReason::kEos);
      rec.set_max_new_tokens(32);
      rec.set_method("lede");
      rec.set_temperature(0.8f);
      rec.set_top_p(0.95f);
      rec.set_seed(o.sampling.seed);
      rec.set_model_fingerprint(model_->config().ArchitectureFingerprint());
      rec.set_load(1);
      sampled_records_.push_back(rec);
    }
  }
  static void TearDownTestSuite() { model_.reset(); }

  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    auto opened = storage::OpenObjectStore("file://" + (tmp_.path() / "store").string());
    ASSERT_TRUE(opened.ok());
    store_ = std::shared_ptr<storage::ObjectStore>(std::move(*opened));
    root_ = (tmp_.path() / "policy").string();
    const int32_t L = static_cast<int32_t>(model_->n_layers());
    auto a = ColdStartArtifact(DefaultColdStart(L), L, model_->config().ArchitectureFingerprint(), "cold-start-v1",
                               "accelerator");
    ASSERT_TRUE(a.ok());
    ASSERT_THAT(WriteColdStartPolicy(root_, *a), IsOk());
    cost_ = model::cost::MakeAcceleratorCostModel(model_->config());
  }

  void LogRecords(const std::vector<lede::v1::RequestRecord>& records) {
    experience::ExperienceLoggerOptions o;
    o.writer_id = "c" + std::to_string(++writers_);
    auto log = experience::CreateRequestLog(store_, o);
    ASSERT_TRUE(log.ok());
    for (lede::v1::RequestRecord r : records) ASSERT_TRUE((*log)->Log(std::move(r)));
    ASSERT_THAT((*log)->Close(), IsOk());
  }

  RequestRetrainOptions Quick(const std::string& version, double margin) {
    RequestRetrainOptions o;
    o.policy_root = root_;
    o.version = version;
    o.publish_margin = margin;
    o.dinkelbach.max_iterations = 1;
    o.dinkelbach.dqn.epochs = 2;
    o.dinkelbach.dqn.num_threads = 1;
    return o;
  }

  std::string Serving() {
    auto v = policy::dqn::ResolveServingVersion(root_);
    return v.ok() ? *v : "";
  }

  static std::shared_ptr<const model::LlamaModel> model_;
  static std::vector<lede::v1::RequestRecord> records_, sampled_records_;
  ::lede::testing::TempDir tmp_;
  std::shared_ptr<storage::ObjectStore> store_;
  std::string root_;
  std::unique_ptr<model::cost::CostModel> cost_;
  int writers_ = 0;
};

std::shared_ptr<const model::LlamaModel> RequestRetrainTest::model_;
std::vector<lede::v1::RequestRecord> RequestRetrainTest::records_;
std::vector<lede::v1::RequestRecord> RequestRetrainTest::sampled_records_;

// A sampled record traces as a sampled trace under its recorded settings; a
// record without them (an old shard's) traces as greedy.
TEST_F(RequestRetrainTest, SampledRecordsTraceUnderTheirSamplingSettings) {
  auto sampled = TraceLoggedRequest(*model_, sampled_records_.front(), 4);
  ASSERT_THAT(sampled, IsOk());
  EXPECT_TRUE(sampled->sampled());
  EXPECT_NEAR(sampled->sampling.temperature, 0.8, 1e-6);
  EXPECT_NEAR(sampled->sampling.top_p, 0.95, 1e-6);
  EXPECT_EQ(sampled->sampling.seed, sampled_records_.front().seed());
  auto greedy = TraceLoggedRequest(*model_, records_.front(), 4);
  ASSERT_THAT(greedy, IsOk());
  EXPECT_FALSE(greedy->sampled());
}

// Greedy and sampled requests train one candidate; the held-out replay
// reports the acceptance of each kind on its own.
TEST_F(RequestRetrainTest, HeldOutAcceptanceIsReportedPerKind) {
  std::vector<lede::v1::RequestRecord> mixed = records_;
  mixed.insert(mixed.end(), sampled_records_.begin(), sampled_records_.end());
  LogRecords(mixed);
  auto out = RetrainOnRequests(*store_, *model_, *cost_, {}, Quick("r-mixed", 0.01));
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->n_requests, static_cast<int64_t>(mixed.size()));
  const ReplayAcceptanceByKind& a = out->heldout_acceptance;
  EXPECT_EQ(a.greedy.n_requests + a.sampled.n_requests, out->n_heldout);
  EXPECT_EQ(a.sampled.n_requests, 4);
  EXPECT_GT(a.greedy.n_requests, 0);
  for (const ReplayAcceptance* k : {&a.greedy, &a.sampled}) {
    EXPECT_GE(k->rate(), 0.0);
    EXPECT_LE(k->rate(), 1.0);
  }
  std::printf("held-out acceptance: greedy %.3f (%lld requests), sampled %.3f (%lld requests)\n", a.greedy.rate(),
              static_cast<long long>(a.greedy.n_requests), a.sampled.rate(),
              static_cast<long long>(a.sampled.n_requests));
}

TEST_F(RequestRetrainTest, PublishesOnlyByTheMarginAndNothingWithoutNewRequests) {
  LogRecords(records_);
  std::set<std::string> processed;
  // The first run decides by the held-out replay: published iff better by the margin.
  auto first = RetrainOnRequests(*store_, *model_, *cost_, processed, Quick("r-1", 0.01));
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ(first->n_requests, static_cast<int64_t>(records_.size()));
  EXPECT_GT(first->n_heldout, 0);
  EXPECT_GT(first->n_train, first->n_heldout);
  EXPECT_GT(first->serving_speedup, 1.0);  // the cold-start static policy replays above autoregressive
  EXPECT_GT(first->candidate_speedup, 0.0);
  const bool better = first->candidate_speedup - first->serving_speedup > 0.01;
  EXPECT_EQ(first->decision, better ? RequestRetrainDecision::kPublished : RequestRetrainDecision::kRejected)
      << first->reason;
  EXPECT_EQ(Serving(), better ? "r-1" : "cold-start-v1");
  ASSERT_FALSE(first->new_shards.empty());
  for (const std::string& s : first->new_shards) processed.insert(s);
  std::printf("held-out replay: serving %.4fx, candidate %.4fx (%s)\n", first->serving_speedup,
              first->candidate_speedup, first->reason.c_str());

  // No new requests: nothing trained, nothing written.
  const std::string before = Serving();
  auto second = RetrainOnRequests(*store_, *model_, *cost_, processed, Quick("r-2", -1.0));
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->decision, RequestRetrainDecision::kNoNewData);
  EXPECT_EQ(Serving(), before);
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(root_) / "r-2"));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(root_) / "candidates" / "r-2"));
}

TEST_F(RequestRetrainTest, ACandidateNotBetterByTheMarginIsNotPublished) {
  // Trained on a handful of requests, and a margin no candidate can clear.
  LogRecords(std::vector<lede::v1::RequestRecord>(records_.begin(), records_.begin() + 6));
  auto out = RetrainOnRequests(*store_, *model_, *cost_, {}, Quick("r-bad", 10.0));
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->decision, RequestRetrainDecision::kRejected) << out->reason;
  EXPECT_THAT(out->reason, HasSubstr("rejected"));
  EXPECT_EQ(Serving(), "cold-start-v1");
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(root_) / "r-bad"));
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(root_) / "candidates" / "r-bad" / "policy.json"));
}

TEST_F(RequestRetrainTest, ADegradedCandidateIsNotPublishedAtTheNormalMargin) {
  // The serving policy is the one the model ships as serving (its SERVING
  // pointer), trained offline on hundreds of requests; the candidate is
  // trained on a handful of requests with one Dinkelbach iteration of two
  // epochs. At the default margin it must lose on the held-out replay and
  // stay a rejected candidate.
  namespace fs = std::filesystem;
  const std::string shipped_root = std::string(kModelDir) + "/policy";
  auto shipped = policy::dqn::ResolveServingVersion(shipped_root);
  ASSERT_THAT(shipped.status(), IsOk());
  fs::copy(fs::path(shipped_root) / *shipped, fs::path(root_) / *shipped, fs::copy_options::recursive);
  ASSERT_THAT(policy::dqn::PublishServingVersion(root_, *shipped), IsOk());
  LogRecords(std::vector<lede::v1::RequestRecord>(records_.begin(), records_.begin() + 6));
  const RequestRetrainOptions defaults;
  ASSERT_EQ(defaults.publish_margin, 0.01);
  auto out = RetrainOnRequests(*store_, *model_, *cost_, {}, Quick("r-few", defaults.publish_margin));
  ASSERT_THAT(out, IsOk());
  std::printf("degraded candidate against %s: %s\n", shipped->c_str(), out->reason.c_str());
  EXPECT_LE(out->n_train, 5);
  EXPECT_EQ(out->serving_version, *shipped);
  EXPECT_LE(out->candidate_speedup, out->serving_speedup + defaults.publish_margin);
  EXPECT_EQ(out->decision, RequestRetrainDecision::kRejected) << out->reason;
  EXPECT_EQ(Serving(), *shipped);
  EXPECT_FALSE(fs::exists(fs::path(root_) / "r-few"));
}

// A request-log shard of another model among good ones does not
// stop retraining. It is skipped whole (even the records of this model a
// tampered shard may hold), counted and logged once naming the shard and
// both fingerprints; the run decides on the good shards' merit.
TEST_F(RequestRetrainTest, AShardOfAnotherModelIsSkippedCountedAndLoggedOnce) {
  LogRecords(std::vector<lede::v1::RequestRecord>(records_.begin(), records_.begin() + 8));
  std::vector<lede::v1::RequestRecord> other(records_.begin() + 8, records_.begin() + 12);
  other[2].set_model_fingerprint("0123456789abcdef");
  LogRecords(other);
  std::vector<std::string> lines;
  RequestRetrainOptions o = Quick("r-x", std::numeric_limits<double>::infinity());
  o.log = [&lines](const std::string& line) { lines.push_back(line); };
  auto out = RetrainOnRequests(*store_, *model_, *cost_, {}, o);
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->decision, RequestRetrainDecision::kRejected) << out->reason;  // margin +inf: on merit, never better
  EXPECT_EQ(out->n_requests, 8);
  EXPECT_EQ(out->n_new_records, 8);
  EXPECT_EQ(out->n_other_model_shards, 1);
  EXPECT_EQ(out->n_new_other_model_shards, 1);
  EXPECT_EQ(out->n_bad_shards, 0);
  EXPECT_EQ(out->new_shards.size(), 2u);  // both recorded as read
  std::vector<std::string> skipped;
  for (const std::string& l : lines) {
    if (l.find("another model") != std::string::npos) skipped.push_back(l);
  }
  ASSERT_EQ(skipped.size(), 1u) << "one line per skipped shard";
  EXPECT_THAT(skipped[0], HasSubstr("0123456789abcdef"));
  EXPECT_THAT(skipped[0], HasSubstr(model_->config().ArchitectureFingerprint()));
  EXPECT_THAT(skipped[0], HasSubstr("/c2-00000000.lreq"));
  EXPECT_EQ(Serving(), "cold-start-v1");

  // Once read, the shard is old: neither counted as new nor logged again.
  lines.clear();
  std::set<std::string> processed(out->new_shards.begin(), out->new_shards.end());
  auto again = RetrainOnRequests(*store_, *model_, *cost_, processed, Quick("r-y", 0.01));
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->decision, RequestRetrainDecision::kNoNewData);
  EXPECT_EQ(again->n_new_other_model_shards, 0);
  EXPECT_TRUE(lines.empty());
}

// Only another model's shards are new: nothing to train, but they are
// returned as read so that the next run neither reads nor logs them again.
// One that is also truncated is counted once, as another model's.
TEST_F(RequestRetrainTest, OnlyShardsOfAnotherModelTrainNothing) {
  std::vector<lede::v1::RequestRecord> other(records_.begin(), records_.begin() + 4);
  for (lede::v1::RequestRecord& r : other) r.set_model_fingerprint("0123456789abcdef");
  LogRecords(other);
  auto listed = store_->List("requests/");
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), 1u);
  auto bytes = store_->Get((*listed)[0].key);
  ASSERT_THAT(bytes, IsOk());
  bytes->resize(bytes->size() - 5);  // the last record cut short
  ASSERT_THAT(store_->Put((*listed)[0].key, *bytes), IsOk());
  auto out = RetrainOnRequests(*store_, *model_, *cost_, {}, Quick("r-z", -1.0));
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->decision, RequestRetrainDecision::kNoNewData);
  EXPECT_EQ(out->n_new_other_model_shards, 1);
  EXPECT_EQ(out->n_new_bad_shards, 0);
  EXPECT_EQ(out->new_shards.size(), 1u);
  EXPECT_THAT(out->reason, HasSubstr("another model"));
  EXPECT_EQ(Serving(), "cold-start-v1");
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(root_) / "r-z"));
}

// `lede-train --once` as a whole (Retrainer, counterfactual trainer): a
// shard of another model among good ones; the run decides, the shard is
// counted in the outcome and in
// lede_retrain_shards_skipped_total{reason="other_model"}, and the state
// records it so the next run is quiet.
TEST_F(RequestRetrainTest, TheRetrainerGoesOnPastAShardOfAnotherModel) {
  LogRecords(std::vector<lede::v1::RequestRecord>(records_.begin(), records_.begin() + 8));
  std::vector<lede::v1::RequestRecord> other(records_.begin() + 8, records_.begin() + 12);
  for (lede::v1::RequestRecord& r : other) r.set_model_fingerprint("0123456789abcdef");
  LogRecords(other);
  RetrainOptions o;
  o.experience_url = "file://" + (tmp_.path() / "store").string();
  o.policy_root = root_;
  o.model_dir = kModelDir;
  o.trainer = "counterfactual";
  o.counterfactual_iterations = 1;
  o.counterfactual_epochs = 2;
  o.eval_threads = 1;
  o.publish_margin = std::numeric_limits<double>::infinity();
  o.version_prefix = "m";
  auto retrainer = Retrainer::Create(o);
  ASSERT_THAT(retrainer, IsOk());
  auto out = (*retrainer)->RunOnce();
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->decision, RetrainDecision::kRejected) << out->reason;
  EXPECT_EQ(out->n_other_model_shards, 1);
  EXPECT_EQ(out->n_new_requests, 8);
  EXPECT_EQ(out->report.value("other_model_shards", -1), 1);
  telemetry::Registry registry;
  RetrainMetrics metrics(registry);
  metrics.RecordRun(*out, 1.0);
  const std::string text = telemetry::SerializeText(registry);
  EXPECT_THAT(text, HasSubstr("lede_retrain_shards_skipped_total{reason=\"other_model\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_retrain_shards_skipped_total{reason=\"corrupt\"} 0\n"));
  EXPECT_THAT(metrics.Logfmt(), HasSubstr(" shards_skipped=1 shards_skipped_other_model=1 "));
  auto state = ReadRetrainState((std::filesystem::path(root_) / kRetrainStateFile).string());
  ASSERT_THAT(state, IsOk());
  EXPECT_EQ(state->processed_shards.size(), 2u);
  EXPECT_EQ(state->runs, 1);
  auto second = (*retrainer)->RunOnce();
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->decision, RetrainDecision::kNoNewData);
  EXPECT_EQ(second->n_other_model_shards, 0);
}

TEST_F(RequestRetrainTest, CorruptShardsAreSkippedAndCounted) {
  LogRecords(std::vector<lede::v1::RequestRecord>(records_.begin(), records_.begin() + 8));
  ASSERT_THAT(store_->Put("requests/2026-12-04/broken.lreq", std::string("LEDREQ1\n\x40\x00\x00\x00garbage", 19)),
              IsOk());
  ASSERT_THAT(store_->Put("requests/2026-12-04/zero.lreq", std::string()), IsOk());
  auto out = RetrainOnRequests(*store_, *model_, *cost_, {}, Quick("r-c", std::numeric_limits<double>::infinity()));
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->n_bad_shards, 2);
  EXPECT_EQ(out->n_new_bad_shards, 2);
  EXPECT_EQ(out->n_requests, 8);
  EXPECT_EQ(out->decision, RequestRetrainDecision::kRejected);
}

TEST_F(RequestRetrainTest, ATruncatedOrCorruptShardKeepsItsGoodRecordsAndIsCounted) {
  // Two real shards of 6 requests each: one cut short mid-record, one with a
  // byte flipped in its last record (the CRC catches it). The records before
  // the damage are used, the shards are counted, the trainer does not fail.
  ASSERT_GE(records_.size(), 12u);
  LogRecords(std::vector<lede::v1::RequestRecord>(records_.begin(), records_.begin() + 6));
  LogRecords(std::vector<lede::v1::RequestRecord>(records_.begin() + 6, records_.begin() + 12));
  auto listed = store_->List("requests/");
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), 2u);
  auto cut = store_->Get((*listed)[0].key);
  auto flipped = store_->Get((*listed)[1].key);
  ASSERT_THAT(cut, IsOk());
  ASSERT_THAT(flipped, IsOk());
  cut->resize(cut->size() - 5);
  (*flipped)[flipped->size() - 3] ^= 0x5a;
  ASSERT_THAT(store_->Put((*listed)[0].key, *cut), IsOk());
  ASSERT_THAT(store_->Put((*listed)[1].key, *flipped), IsOk());
  auto out = RetrainOnRequests(*store_, *model_, *cost_, {}, Quick("r-t", std::numeric_limits<double>::infinity()));
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->n_bad_shards, 2);
  EXPECT_EQ(out->n_new_bad_shards, 2);
  EXPECT_EQ(out->n_new_records, 10);  // 5 good records before each damaged one
  EXPECT_EQ(out->n_requests, 10);
  EXPECT_EQ(out->new_shards.size(), 2u);
  // Once processed, they are old: not counted as new again.
  std::set<std::string> processed(out->new_shards.begin(), out->new_shards.end());
  auto again = RetrainOnRequests(*store_, *model_, *cost_, processed, Quick("r-t2", 0.01));
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->decision, RequestRetrainDecision::kNoNewData);
  EXPECT_EQ(again->n_new_bad_shards, 0);
}

TEST_F(RequestRetrainTest, OnlyTheMostRecentRequestsAreUsed) {
  LogRecords(records_);
  RequestRetrainOptions o = Quick("r-w", std::numeric_limits<double>::infinity());
  o.max_requests = 10;
  auto out = RetrainOnRequests(*store_, *model_, *cost_, {}, o);
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->n_requests, 10);
  EXPECT_EQ(out->n_train + out->n_heldout, 10);
  o.max_requests = 0;
  EXPECT_THAT(RetrainOnRequests(*store_, *model_, *cost_, {}, o).status(), StatusIs(StatusCode::kInvalidArgument));
}

// A serving policy priced by the measured cost model on a model with no
// calibration: the retrainer calibrates the model once, keeps it in the
// policy root and reuses it; a calibration of another model is refused,
// naming both fingerprints.
TEST_F(RequestRetrainTest, AMeasuredServingPolicyGetsTheModelCalibratedOnce) {
  namespace fs = std::filesystem;
  const fs::path model_dir = tmp_.path() / "model";
  fs::create_directories(model_dir);
  for (const auto& entry : fs::directory_iterator(kModelDir)) {
    if (entry.is_regular_file() && entry.path().filename() != "calibration-cpu.json") {
      fs::copy_file(entry.path(), model_dir / entry.path().filename());
    }
  }
  // A cold start priced by the measured model, drafting at most 2 tokens
  // (the calibration times rounds up to the decision spec's draft length).
  const int32_t L = static_cast<int32_t>(model_->n_layers());
  ColdStartChoice choice = DefaultColdStart(L);
  choice.draft_len = 2;
  auto a = ColdStartArtifact(choice, L, model_->config().ArchitectureFingerprint(), "measured-cold-v1", "measured");
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_THAT(policy::dqn::SaveArtifact((fs::path(root_) / "measured-cold-v1").string(), *a), IsOk());
  ASSERT_THAT(policy::dqn::PublishServingVersion(root_, "measured-cold-v1"), IsOk());
  ASSERT_EQ(Serving(), "measured-cold-v1");
  LogRecords(std::vector<lede::v1::RequestRecord>(records_.begin(), records_.begin() + 12));

  std::vector<std::string> lines;
  RetrainOptions o;
  o.experience_url = "file://" + (tmp_.path() / "store").string();
  o.policy_root = root_;
  o.model_dir = model_dir.string();
  o.trainer = "counterfactual";
  o.counterfactual_iterations = 1;
  o.counterfactual_epochs = 2;
  o.eval_threads = 1;
  o.version_prefix = "m";
  o.log = [&lines](const std::string& line) { lines.push_back(line); };
  auto count = [&lines](const std::string& what) {
    int64_t n = 0;
    for (const std::string& l : lines) n += l.find(what) != std::string::npos;
    return n;
  };
  const fs::path own = fs::path(root_) / kOwnCalibrationFile;
  // One retraining run, as `lede-train --once` makes it: priced by the measured model.
  auto run_once = [&o] {
    auto retrainer = Retrainer::Create(o);
    ASSERT_THAT(retrainer, IsOk());
    auto out = (*retrainer)->RunOnce();
    ASSERT_THAT(out, IsOk());
    EXPECT_EQ(out->report.value("cost_model", ""), "measured");
  };
  run_once();
  EXPECT_EQ(count("calibrating it once"), 1);
  ASSERT_TRUE(fs::exists(own));
  auto cal = model::cost::ReadCalibrationFile(own.string());
  ASSERT_THAT(cal, IsOk());
  EXPECT_EQ(cal->model_fingerprint, model_->config().ArchitectureFingerprint());
  ASSERT_EQ(cal->round_us.size(), static_cast<size_t>(L - 1));
  EXPECT_EQ(cal->round_us[0].size(), 2u);
  EXPECT_GT(cal->decision_us, 0.0);

  // New requests, a new run: the kept calibration, not a second one.
  LogRecords(std::vector<lede::v1::RequestRecord>(records_.begin() + 12, records_.end()));
  const auto written = fs::last_write_time(own);
  run_once();
  EXPECT_EQ(count("calibrating it once"), 1);
  EXPECT_EQ(fs::last_write_time(own), written);

  // A calibration of another model beside it is refused, naming both.
  cal->model_fingerprint = "0123456789abcdef";
  o.calibration = (tmp_.path() / "other.json").string();
  {
    std::ofstream f(o.calibration);
    f << model::cost::CalibrationToJson(*cal);
  }
  LogRecords(std::vector<lede::v1::RequestRecord>(records_.begin(), records_.begin() + 6));
  auto retrainer = Retrainer::Create(o);
  ASSERT_THAT(retrainer, IsOk());
  EXPECT_THAT((*retrainer)->RunOnce().status(),
              StatusIs(StatusCode::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr("0123456789abcdef"),
                                        HasSubstr(model_->config().ArchitectureFingerprint()))));
}

// Per entry the newest record that measured it, among records of the newest profile's weight format; records
// without a profile are skipped; none usable is NOT_FOUND.
TEST(ServedCostsOfLogTest, NewestMeasurementPerEntryOfTheNewestFormat) {
  std::vector<lede::v1::RequestRecord> records(4);
  EXPECT_THAT(ServedCostsOfLog(records, 4).status(), StatusIs(StatusCode::kNotFound));
  *records[0].mutable_measured_costs() = CostlyVerificationProfile(4, "f32");  // another deployment
  records[0].mutable_measured_costs()->set_draft_step_s(3, 9.0);
  *records[1].mutable_measured_costs() = CostlyVerificationProfile(4);
  records[1].mutable_measured_costs()->set_draft_step_s(2, 5e-3);
  *records[2].mutable_measured_costs() = CostlyVerificationProfile(4);
  records[2].mutable_measured_costs()->set_draft_step_samples(2, 0);  // not measured in the newest window
  records[2].mutable_measured_costs()->set_draft_step_samples(3, 0);
  records[2].mutable_measured_costs()->set_draft_step_samples(4, 0);
  // records[3]: an older coordinator's record, no profile.
  auto c = ServedCostsOfLog(records, 4);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->weight_format, "q8_0");
  ASSERT_EQ(c->draft_step_s.size(), 5u);
  EXPECT_DOUBLE_EQ(c->draft_step_s[1], 2e-4);  // newest
  EXPECT_DOUBLE_EQ(c->draft_step_s[2], 5e-3);  // the older q8_0 record
  EXPECT_DOUBLE_EQ(c->draft_step_s[3], 4e-4);  // not the f32 record's 9.0
  EXPECT_DOUBLE_EQ(c->verify_s[0], 1.2e-3);
  EXPECT_DOUBLE_EQ(c->verify_slope_s, 0.6e-3);
  EXPECT_THAT(ServedCostsOfLog(records, 6).status(), StatusIs(StatusCode::kInvalidArgument));
}

// A profile from before the verification line spanned exit layers (head_layers 0) fitted it on K alone, at
// whatever exit layers were served: its line is not taken, the per-K medians price.
TEST(ServedCostsOfLogTest, LinesOnKAloneAreLeftOut) {
  std::vector<lede::v1::RequestRecord> records(1);
  *records[0].mutable_measured_costs() = CostlyVerificationProfile(4);
  records[0].mutable_measured_costs()->set_head_layers(0);
  auto c = ServedCostsOfLog(records, 4);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->verify_intercept_s, 0.0);
  EXPECT_EQ(c->verify_slope_s, 0.0);
  EXPECT_DOUBLE_EQ(c->verify_s[2], 1.2e-3 * 2);
}

// The two sources of a served policy's features agree: what the coordinator shows the policy from the live
// profile (experience::ServedCostFeatures) and what the retrainer shows its candidates from the same profile
// logged (CostFeaturesOf the served cost model). A meter fed verifications at shallow exit layers that follow
// the step model (rows through blocks [E, L) and the head) gives both the price of a draft verified at L / 2,
// the depth at which the policy's training features price it (not that of the exit layers served).
TEST_F(RequestRetrainTest, ServedFeaturesAgreeWithTheServedCostModel) {
  const int32_t L = static_cast<int32_t>(model_->n_layers());
  const double h = model::cost::HeadLayerEquivalents(model_->config());
  experience::ServedCostMeterOptions mo;
  mo.n_layers = L;
  mo.max_draft_len = 6;
  mo.head_layers = h;
  mo.weight_format = "q8_0";
  experience::ServedCostMeter meter(mo);
  const double row = 1e-4, step = (L + h) * row;  // one row through one block: 0.1 ms
  for (int32_t e = 1; e < L; ++e) meter.RecordDraft(e, 2, 2 * (e + h) * row);
  for (int32_t e = 1; e <= 3; ++e) {  // shallow exit layers, as a policy priced for costly verification picks
    for (int32_t k = 1; k <= 6; k += 2) meter.RecordVerify(e, k, step + k * (L - e + h) * row);
  }
  meter.RecordVerify(0, 0, step);
  std::vector<lede::v1::RequestRecord> records(1);
  *records[0].mutable_measured_costs() = meter.Snapshot();
  const speculation::CostFeatures prior{0.1f, 1.0f, 0.0f};
  const speculation::CostFeatures served = experience::ServedCostFeatures(records[0].measured_costs(), prior);
  auto cost = ServedCostModelOfLog(records, *model_);
  ASSERT_THAT(cost, IsOk());
  const speculation::CostFeatures logged = model::cost::CostFeaturesOf(**cost, L, 6);
  const double middle = (L - L / 2 + h) * row / step;  // a draft verified at L / 2, in steps
  EXPECT_NEAR(served.verify, middle, 1e-4);
  EXPECT_NEAR(logged.verify, middle, 1e-4);
  EXPECT_NEAR(served.layer, logged.layer, 1e-4);
}

// Requests logged with the deployment's measured costs are priced with them: the run says "served", the
// candidate's reward cost model is "served", and the held-out replay speed-ups are those of the costly
// verification (lower than the accelerator model's for the same policy). Without the option it prices as
// before. Sampled requests in the log are replayed too (by acceptance probability).
TEST_F(RequestRetrainTest, LoggedMeasuredCostsPriceTheRun) {
  const int32_t L = static_cast<int32_t>(model_->n_layers());
  std::vector<lede::v1::RequestRecord> logged(records_.begin(), records_.begin() + 8);
  // Drafts and probes as the accelerator model prices them, verifications dearer: only verifying differs.
  lede::v1::CostProfile profile = CostlyVerificationProfile(L);
  const double h = model::cost::HeadLayerEquivalents(model_->config());
  for (int32_t e = 1; e <= L; ++e) profile.set_draft_step_s(e, 1.2e-3 * (e + h) / L);
  for (lede::v1::RequestRecord& r : logged) *r.mutable_measured_costs() = profile;
  // Two sampled requests (logged like greedy ones, here with greedy tokens): replayed too.
  for (int i : {0, 1}) {
    lede::v1::RequestRecord r = logged[i];
    r.set_request_id("sampled-" + std::to_string(i));
    r.set_temperature(0.8f);
    r.set_seed(7);
    logged.push_back(r);
  }
  LogRecords(logged);
  const double never = std::numeric_limits<double>::infinity();
  auto served = RetrainOnRequests(*store_, *model_, *cost_, {}, Quick("r-served", never));
  ASSERT_THAT(served, IsOk());
  EXPECT_EQ(served->cost_model, "served");
  EXPECT_EQ(served->n_requests, 10);
  auto artifact = policy::dqn::LoadArtifact(served->artifact_dir, model_->config().ArchitectureFingerprint());
  ASSERT_THAT(artifact, IsOk());
  EXPECT_EQ(artifact->metadata.reward_cost_model, "served");
  RequestRetrainOptions off = Quick("r-acc", never);
  off.price_with_logged_costs = false;
  auto accelerator = RetrainOnRequests(*store_, *model_, *cost_, {}, off);
  ASSERT_THAT(accelerator, IsOk());
  EXPECT_EQ(accelerator->cost_model, "accelerator");
  EXPECT_LT(served->serving_speedup, accelerator->serving_speedup);
  // The replays show the policy the features of the model that priced them:
  // the accelerator model's (a verification costs one step whatever its
  // length: verify 0), and the log's costly verification.
  const int64_t D = off.dinkelbach.spec.max_draft_len;
  const speculation::CostFeatures of_accelerator = model::cost::CostFeaturesOf(*cost_, L, D);
  EXPECT_EQ(accelerator->cost_features, of_accelerator);
  EXPECT_NEAR(accelerator->cost_features.verify, 0.0f, 1e-6);
  EXPECT_GT(served->cost_features.verify, 0.1f);
  EXPECT_FALSE(served->cost_features == of_accelerator);
}

}  // namespace
}  // namespace lede::trainer
