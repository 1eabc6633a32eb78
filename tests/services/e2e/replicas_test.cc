// A multi-replica deployment on loopback: 3 co-located model replicas, 2
// coordinators over all of them (--replicas), 1 policy service following an
// S3 store (s3rver), and client threads sending requests to both
// coordinators throughout. While the load runs:
//  1. every replica takes sessions (placement by the lease load reports);
//  2. one replica is SIGKILLed: its in-flight sessions end UNAVAILABLE, the
//     rest go on, and new sessions go to the other two;
//  3. it is restarted on its port and takes sessions again;
//  4. the trainer retrains on the coordinators' experience and publishes
//     a new version through S3; every replica's drafter follows it, with no
//     failed request meanwhile.
// Every completed request's tokens equal those of the single-replica
// deployment (LEDE is lossless, whichever replica and policy version), every
// failure is UNAVAILABLE, and afterwards no KV slot is held anywhere.
// No timing assertions: every wait is a bounded wait for an eventual event.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/artifact_store.h"
#include "proto/lede/v1/generation.grpc.pb.h"
#include "shared/storage/object_store.h"
#include "tests/shared/telemetry/telemetry_test_util.h"
#include "tests/testing/process.h"
#include "tests/testing/s3rver.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"
#include "tests/testing/retrain_once.h"
#include "trainer/retrain.h"

namespace lede {
namespace {

using ::lede::testing::ChildProcess;
using ::lede::testing::ClusterOptions;
using ::lede::testing::IsOk;
using ::lede::testing::LedeCluster;
using ::lede::testing::WaitUntil;
using ::lede::v1::GenerateRequest;
using ::lede::v1::GenerateResponse;
using namespace std::chrono_literals;

const std::string kModel = std::string(LEDE_SOURCE_DIR) + "/models/lede-tiny";

// A series' value at `port`, 0 when not exposed yet (NaN when down).
double MetricOrZero(int port, const std::string& series) {
  return telemetry::test_util::MetricValue(port, series, /*absent=*/0);
}


std::vector<std::string> Prompts(size_t n) {
  std::vector<std::string> out;
  std::ifstream f(kModel + "/prompts/story.jsonl");
  std::string line;
  while (out.size() < n && std::getline(f, line)) {
    const size_t a = line.find("\"prompt\": \"") + 11;
    out.push_back(line.substr(a, line.find('"', a) - a));
  }
  return out;
}

GenerateRequest Request(const std::string& prompt) {
  GenerateRequest r;
  r.set_prompt(prompt);
  r.set_max_new_tokens(24);
  r.set_method(lede::v1::SPECULATION_METHOD_LEDE);
  return r;
}

struct Result {
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;
  std::vector<int32_t> ids;
};

Result Generate(lede::v1::Generation::Stub& stub, const GenerateRequest& request) {
  Result r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto stream = stub.Generate(&ctx, request);
  GenerateResponse resp;
  while (stream->Read(&resp)) {
    if (resp.has_delta()) r.ids.insert(r.ids.end(), resp.delta().token_ids().begin(), resp.delta().token_ids().end());
  }
  grpc::Status s = stream->Finish();
  r.code = s.error_code();
  r.message = s.error_message();
  return r;
}

// Client threads, each sending requests back to back to one of the
// coordinators; results are kept per prompt index.
class Load {
 public:
  Load(const std::vector<std::string>& targets, const std::vector<std::string>& prompts, int n_threads)
      : prompts_(prompts) {
    for (int t = 0; t < n_threads; ++t) {
      threads_.emplace_back([this, target = targets[t % targets.size()], t] {
        auto stub = LedeCluster::NewStub(target);
        for (size_t i = t; !stop_; ++i) {
          const size_t p = i % prompts_.size();
          Result r = Generate(*stub, Request(prompts_[p]));
          std::lock_guard<std::mutex> lock(mu_);
          results_.emplace_back(p, std::move(r));
        }
      });
    }
  }
  ~Load() { Stop(); }
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  size_t n_ok() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto& [p, r] : results_) n += r.code == grpc::StatusCode::OK;
    return n;
  }
  size_t n_failed() {
    std::lock_guard<std::mutex> lock(mu_);
    return results_.size() - CountOk();
  }
  std::vector<std::pair<size_t, Result>> results() {
    std::lock_guard<std::mutex> lock(mu_);
    return results_;
  }

 private:
  size_t CountOk() const {
    size_t n = 0;
    for (const auto& [p, r] : results_) n += r.code == grpc::StatusCode::OK;
    return n;
  }
  const std::vector<std::string> prompts_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::pair<size_t, Result>> results_;
  std::vector<std::thread> threads_;
};

TEST(ReplicasTest, TwoCoordinatorsThreeReplicasSurviveAKilledReplicaAndFollowAPolicyThroughS3) {
  lede::testing::S3rver s3;
  ASSERT_TRUE(s3.available()) << s3.skip_reason();
  ASSERT_THAT(s3.Start("lede-policies"), IsOk());
  ::setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);  // s3rver's built-in credentials, inherited by lede-policy
  ::setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
  ::unsetenv("AWS_SESSION_TOKEN");
  const std::string store_url = "s3://lede-policies/lede-tiny?endpoint=" + s3.endpoint() + "&region=us-east-1";
  auto store = storage::OpenObjectStore(store_url);
  ASSERT_THAT(store.status(), IsOk());
  auto serving0 = policy::dqn::ResolveServingVersion(kModel + "/policy");
  ASSERT_THAT(serving0.status(), IsOk());
  ASSERT_THAT(policy::dqn::UploadVersion(**store, kModel + "/policy", *serving0, /*set_serving=*/true), IsOk());
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());

  // Replica A with the policy service (following the store) and the
  // single-replica coordinator that gives the reference tokens.
  ClusterOptions base;
  base.binaries = lede::testing::LedeBinaries{LEDE_MODEL_BIN, LEDE_COORDINATOR_BIN, LEDE_POLICY_BIN};
  base.model_dir = kModel;
  base.colocated = true;
  base.slots = 2;
  base.experience_url = "none";
  base.calibration = testing::ServingCalibration(kModel, kModel + "/policy");  // the store serves serving0
  ClusterOptions oa = base;
  oa.policy_service = true;
  oa.policy_root = (tmp.path() / "policy-mirror").string();
  oa.policy_args = {"--policy-store", store_url};
  LedeCluster a(oa);
  ASSERT_THAT(a.Start(), IsOk());
  // Replicas B and C: model processes only, drafting with A's policy service.
  ClusterOptions ob = base;
  ob.model_args = {"--policy", a.policy()->grpc_target()};
  LedeCluster b(ob), c(ob);
  ASSERT_THAT(b.StartVerifier(), IsOk());
  ASSERT_THAT(c.StartVerifier(), IsOk());
  std::vector<LedeCluster*> replicas = {&a, &b, &c};
  const std::string list = a.verifier_target() + "," + b.verifier_target() + "," + c.verifier_target();
  // Both coordinators log experience to one store, which the trainer reads.
  const std::string experience = (tmp.path() / "experience").string();
  auto x = a.StartExtraCoordinator(false, experience, {"--replicas", list});
  ASSERT_THAT(x.status(), IsOk());
  auto y = a.StartExtraCoordinator(false, experience, {"--replicas", list});
  ASSERT_THAT(y.status(), IsOk());
  auto logs = [&] {
    return "\ncoordinator x:\n" + ChildProcess::Tail((*x)->Log(), 1500) + "\nreplica b:\n" +
           ChildProcess::Tail(b.verifier()->Log(), 1500);
  };
  // Sessions each replica has admitted (its queue-time histogram counts every admission).
  auto sessions = [&](LedeCluster* r) {
    return MetricOrZero(r->verifier()->metrics_port(), "lede_request_queue_time_seconds_count");
  };

  const std::vector<std::string> prompts = Prompts(6);
  ASSERT_EQ(prompts.size(), 6u);
  std::vector<std::vector<int32_t>> reference;
  {
    auto stub = a.NewStub();
    for (const std::string& p : prompts) {
      Result r = Generate(*stub, Request(p));
      ASSERT_EQ(r.code, grpc::StatusCode::OK) << r.message;
      reference.push_back(r.ids);
    }
  }
  const std::vector<double> before = {sessions(&a), sessions(&b), sessions(&c)};

  Load load({(*x)->grpc_target(), (*y)->grpc_target()}, prompts, 6);
  // 1. Every replica takes sessions.
  EXPECT_TRUE(WaitUntil(
      [&] { return sessions(&a) > before[0] && sessions(&b) > before[1] && sessions(&c) > before[2]; }, 60s, 100ms))
      << "sessions per replica: " << sessions(&a) << " " << sessions(&b) << " " << sessions(&c) << logs();

  // 2. Kill replica B; requests go on on A and C.
  b.verifier()->Kill();
  const size_t ok_at_kill = load.n_ok();
  EXPECT_TRUE(WaitUntil([&] { return load.n_ok() >= ok_at_kill + 12; }, 60s, 100ms)) << logs();

  // 3. Restart B on its port: it takes sessions again.
  ASSERT_THAT(b.StartVerifier(), IsOk());
  EXPECT_TRUE(WaitUntil([&] { return sessions(&b) > 0; }, 60s, 100ms)) << "replica b never rejoined" << logs();

  // 4. The trainer retrains on the coordinators' experience (in scratch
  //    space, no shared volume) and publishes through S3 (forced); every
  //    replica's drafter follows, with no request failing meanwhile.
  const size_t failed_before_publish = load.n_failed();
  trainer::RetrainOptions ro;
  ro.experience_url = experience;
  ro.policy_root = (tmp.path() / "trainer-scratch").string();
  ro.policy_store_url = store_url;
  ro.version_prefix = "sim";
  ro.dqn.epochs = 1;
  auto outcome = lede::testing::RetrainAndPublish(ro);
  ASSERT_THAT(outcome.status(), IsOk());
  const std::string published = outcome->candidate_version;
  for (LedeCluster* r : replicas) {
    EXPECT_TRUE(WaitUntil(
        [&] {
          return MetricOrZero(r->verifier()->metrics_port(), "lede_policy_version{version=\"" + published + "\"}") == 1;
        },
        60s, 100ms))
        << "a replica's drafter did not follow " << published << logs();
  }
  const size_t ok_at_publish = load.n_ok();
  EXPECT_TRUE(WaitUntil([&] { return load.n_ok() >= ok_at_publish + 6; }, 60s, 100ms));
  EXPECT_EQ(load.n_failed(), failed_before_publish) << "requests failed while the policy rolled out" << logs();
  load.Stop();

  size_t n_ok = 0, n_unavailable = 0;
  for (const auto& [p, r] : load.results()) {
    if (r.code == grpc::StatusCode::OK) {
      ++n_ok;
      EXPECT_EQ(r.ids, reference[p]) << "prompt " << p << " differs from the single-replica deployment";
    } else {
      ++n_unavailable;
      EXPECT_EQ(r.code, grpc::StatusCode::UNAVAILABLE) << r.message;
    }
  }
  EXPECT_GT(n_ok, 0u);
  std::cout << "[ replicas ] " << n_ok << " requests completed, " << n_unavailable
            << " ended UNAVAILABLE (in flight on the killed replica)\n";
  for (LedeCluster* r : replicas) {
    EXPECT_TRUE(WaitUntil([&] { return telemetry::test_util::MetricValue(r->verifier()->metrics_port(), "lede_kv_slots_in_use") == 0; }, 20s,
                          50ms))
        << "a KV slot is still held on " << r->verifier_target();
  }
}

}  // namespace
}  // namespace lede
