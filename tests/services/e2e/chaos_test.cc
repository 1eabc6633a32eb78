// The chaos test: under concurrent load, every process of a split
// deployment (drafter, verifier, policy service, coordinator; as scripts/run
// launches them) is SIGKILLed in turn and restarted with the same flags and
// ports. Afterwards:
//   (a) every request either completed with exactly the tokens of a solo run
//       of its prompt (computed before the chaos) or failed with UNAVAILABLE;
//   (b) after each restart the service serves again within 5 s (the one
//       functional time bound, a behaviour the service promises);
//   (c) no KV slot is lost: once the load stops every slot is free and
//       `slots` concurrent sessions open;
//   (d) no experience shard is torn: every shard in the store reads back
//       whole and no temporary shard file is left behind.
// Integration label: one cluster of four processes, each killed twice
// (eight restarts), 15-25 s on a loaded 2-core machine.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "gtest/gtest.h"
#include "proto/lede/v1/generation.grpc.pb.h"
#include "shared/experience/experience.h"
#include "shared/storage/object_store.h"
#include "tests/shared/telemetry/telemetry_test_util.h"
#include "tests/testing/process.h"
#include "tests/testing/slot_holders.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace lede {
namespace {

using ::lede::testing::ChildProcess;
using ::lede::testing::ClusterOptions;
using ::lede::testing::IsOk;
using ::lede::testing::LedeCluster;
using ::lede::testing::SlotHolders;
using ::lede::v1::GenerateRequest;
using ::lede::v1::GenerateResponse;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

constexpr int kSlots = 6;
constexpr int kClientThreads = 4;
// Each process is killed this many times (in turn: drafter, verifier,
// policy service, coordinator, then again).
constexpr int kRounds = 2;
// The issue's bound: the service serves again within 5 s of a restart.
constexpr double kServesAgainBoundS = 5.0;

std::string ModelDir() { return std::string(LEDE_SOURCE_DIR) + "/models/lede-tiny"; }

const std::vector<std::string>& Prompts() {
  static const auto* prompts = new std::vector<std::string>{
      "Once upon a time, there was a little dog named",
      "One day, a little girl named Lily went to the park",
      "Tom and his mom went to the store to buy",
      "The sun was shining and the birds were singing. A boy",
  };
  return *prompts;
}

// Greedy requests: LEDE with the serving policy (the drafter follows the
// policy service) and static self-speculation.
GenerateRequest ChaosRequest(size_t prompt_index) {
  GenerateRequest r;
  r.set_prompt(Prompts()[prompt_index % Prompts().size()]);
  r.set_max_new_tokens(24);
  r.set_temperature(0.0f);
  if (prompt_index % 2 == 1) {
    r.set_method(lede::v1::SPECULATION_METHOD_STATIC);
    r.mutable_speculation()->set_exit_layer(3);
    r.mutable_speculation()->set_draft_length(3);
  } else {
    r.set_method(lede::v1::SPECULATION_METHOD_LEDE);
  }
  return r;
}

struct Outcome {
  size_t prompt_index = 0;
  std::string phase;  // which process was being killed
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;
  std::vector<int32_t> ids;
  bool has_summary = false;
};

// A channel that reconnects within about a second of the coordinator coming
// back (gRPC's default backoff grows to 120 s).
std::unique_ptr<lede::v1::Generation::Stub> FastReconnectStub(const std::string& target, int unique) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  args.SetInt("lede.chaos.unique", unique);  // a connection each
  return lede::v1::Generation::NewStub(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
}

Outcome Generate(lede::v1::Generation::Stub& stub, size_t prompt_index, std::chrono::seconds deadline = 30s) {
  Outcome o;
  o.prompt_index = prompt_index;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  auto reader = stub.Generate(&ctx, ChaosRequest(prompt_index));
  GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_delta()) o.ids.insert(o.ids.end(), resp.delta().token_ids().begin(), resp.delta().token_ids().end());
    if (resp.has_summary()) o.has_summary = true;
  }
  const grpc::Status s = reader->Finish();
  o.code = s.error_code();
  o.message = s.error_message();
  return o;
}

double SlotsInUse(int metrics_port) {
  return telemetry::test_util::MetricValue(metrics_port, "lede_kv_slots_in_use");
}


// Client threads that send greedy requests back to back until Stop(), each
// recording its outcomes under the current phase.
class Load {
 public:
  explicit Load(const std::string& target) {
    for (int t = 0; t < kClientThreads; ++t) {
      threads_.emplace_back([this, target, t] {
        auto stub = FastReconnectStub(target, t);
        for (size_t i = static_cast<size_t>(t); !stop_.load(); ++i) {
          Outcome o = Generate(*stub, i);
          const bool failed = o.code != grpc::StatusCode::OK;
          {
            std::lock_guard<std::mutex> lock(mu_);
            o.phase = phase_;
            outcomes_.push_back(std::move(o));
          }
          // A failed request retries after a pause, as a client would (and
          // the coordinator's log stays readable).
          if (failed) std::this_thread::sleep_for(50ms);
        }
      });
    }
  }
  ~Load() { Stop(); }

  void SetPhase(const std::string& phase) {
    std::lock_guard<std::mutex> lock(mu_);
    phase_ = phase;
  }
  size_t Count() {
    std::lock_guard<std::mutex> lock(mu_);
    return outcomes_.size();
  }
  // Requests that completed OK so far.
  size_t OkCount() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<size_t>(std::count_if(outcomes_.begin(), outcomes_.end(),
                                             [](const Outcome& o) { return o.code == grpc::StatusCode::OK; }));
  }
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  // After Stop().
  const std::vector<Outcome>& outcomes() const { return outcomes_; }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::string phase_ = "warm-up";
  std::vector<Outcome> outcomes_;
  std::vector<std::thread> threads_;
};

class ChaosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterOptions o;
    o.binaries = {LEDE_MODEL_BIN, LEDE_COORDINATOR_BIN, LEDE_POLICY_BIN};
    o.model_dir = ModelDir();
    o.slots = kSlots;
    o.policy_service = true;
    o.experience_shard_age_s = 0.3;
    o.coordinator_keeps_port = true;  // the clients' target survives the coordinator's restart
    // A stable name: a restarted coordinator frees its predecessor's
    // sessions at once (scripts/run's coordinator has one too: host + port).
    o.coordinator_args = {"--instance-name", "chaos-test-coordinator", "--max-new-tokens-limit", "256"};
    cluster_ = std::make_unique<LedeCluster>(o);
    ASSERT_THAT(cluster_->Start(), IsOk());
  }

  std::string Logs() const {
    std::string out;
    for (auto [name, p] : {std::pair<const char*, ChildProcess*>{"coordinator", cluster_->coordinator()},
                           {"verifier", cluster_->verifier()},
                           {"drafter", cluster_->drafter()},
                           {"policy", cluster_->policy()}}) {
      if (p != nullptr) out += std::string("\n--- ") + name + " log:\n" + ChildProcess::Tail(p->Log(), 1500);
    }
    return out;
  }

  // Seconds from now until a request succeeds (polling every 20 ms on a
  // fresh channel); +inf if none does within the 30-s safety bound.
  double SecondsUntilServing(Outcome* last) {
    const auto t0 = SteadyClock::now();
    auto stub = FastReconnectStub(cluster_->coordinator_target(), 1000 + probes_++);
    const bool ok = lede::testing::WaitUntil(
        [&] {
          *last = Generate(*stub, 0, 10s);
          return last->code == grpc::StatusCode::OK;
        },
        30s, 20ms);
    if (!ok) return INFINITY;
    return std::chrono::duration<double>(SteadyClock::now() - t0).count();
  }

  std::unique_ptr<LedeCluster> cluster_;
  int probes_ = 0;
};

// Kills each process in turn under load and restarts it (same flags and
// ports); checks (a)-(d) of the file comment.
TEST_F(ChaosTest, KillEachProcessInTurnUnderLoad) {
  // Solo references, before any load.
  std::map<size_t, std::vector<int32_t>> reference;
  {
    auto stub = FastReconnectStub(cluster_->coordinator_target(), 999);
    for (size_t i = 0; i < 2 * Prompts().size(); ++i) {
      Outcome o = Generate(*stub, i);
      ASSERT_EQ(o.code, grpc::StatusCode::OK) << o.message << Logs();
      ASSERT_FALSE(o.ids.empty());
      reference[i % (2 * Prompts().size())] = o.ids;
    }
  }
  const size_t n_requests = 2 * Prompts().size();

  struct Fault {
    const char* name;
    ChildProcess* (LedeCluster::*process)();
    Status (LedeCluster::*restart)();
  };
  const std::vector<Fault> faults = {
      {"drafter", &LedeCluster::drafter, &LedeCluster::StartDrafter},
      {"verifier", &LedeCluster::verifier, &LedeCluster::StartVerifier},
      {"policy", &LedeCluster::policy, &LedeCluster::StartPolicy},
      {"coordinator", &LedeCluster::coordinator, &LedeCluster::StartCoordinator},
  };
  std::map<std::string, double> serves_again_s, restart_s;  // seconds, by fault
  {
    Load load(cluster_->coordinator_target());
    // Under load before the first fault.
    ASSERT_TRUE(lede::testing::WaitUntil([&] { return load.OkCount() >= 6; }, 60s, 20ms)) << Logs();
    for (int round = 1; round <= kRounds; ++round) {
      for (const Fault& f : faults) {
        const std::string name = std::string(f.name) + "#" + std::to_string(round);
        load.SetPhase(name);
        const size_t before = load.Count();
        ChildProcess* victim = (cluster_.get()->*f.process)();
        ASSERT_NE(victim, nullptr) << name;
        victim->Kill();  // SIGKILL and reap
        // Let the load run into the dead process for a moment.
        lede::testing::WaitUntil([&] { return load.Count() >= before + 3; }, 1500ms, 20ms);
        const auto launched = SteadyClock::now();
        ASSERT_THAT((cluster_.get()->*f.restart)(), IsOk()) << name << Logs();
        restart_s[name] = std::chrono::duration<double>(SteadyClock::now() - launched).count();
        load.SetPhase(name + "-restarted");
        // (b) From the restarted process's `event=started` line.
        Outcome last;
        const double s = SecondsUntilServing(&last);
        serves_again_s[name] = s;
        EXPECT_LE(s, kServesAgainBoundS) << "after restarting the " << f.name << ", the last probe: code "
                                         << last.code << " " << last.message << Logs();
        // Some requests served by the restarted deployment before the next fault.
        const size_t served = load.OkCount();
        ASSERT_TRUE(lede::testing::WaitUntil([&] { return load.OkCount() >= served + 4; }, 60s, 20ms))
            << name << Logs();
      }
    }
    load.SetPhase("after");
    const size_t served = load.OkCount();
    ASSERT_TRUE(lede::testing::WaitUntil([&] { return load.OkCount() >= served + 2 * kClientThreads; }, 60s, 20ms))
        << Logs();
    load.Stop();

    // (a) OK with the solo tokens, or UNAVAILABLE.
    std::map<std::string, std::map<std::string, int>> tally;  // phase -> outcome -> count
    std::map<std::string, std::set<std::string>> messages;   // phase -> a few error messages
    for (const Outcome& o : load.outcomes()) {
      const size_t key = o.prompt_index % n_requests;
      if (o.code == grpc::StatusCode::OK) {
        ++tally[o.phase]["ok"];
        EXPECT_TRUE(o.has_summary) << "request " << key << " in phase " << o.phase;
        EXPECT_EQ(o.ids, reference[key]) << "request " << key << " (" << ChaosRequest(key).prompt()
                                         << ") in phase " << o.phase << " differs from its solo run";
      } else {
        ++tally[o.phase]["unavailable"];
        if (messages[o.phase].size() < 3) messages[o.phase].insert(o.message.substr(0, 200));
        EXPECT_EQ(o.code, grpc::StatusCode::UNAVAILABLE)
            << "request " << key << " in phase " << o.phase << ": code " << o.code << " " << o.message;
      }
    }
    std::ostringstream summary;
    for (const auto& [phase, counts] : tally) {
      summary << " " << phase << ":";
      for (const auto& [what, n] : counts) summary << " " << what << "=" << n;
      summary << ";";
    }
    for (const auto& [name, s] : serves_again_s) {
      summary << " " << name << ": restart " << restart_s[name] << " s, then serving after " << s << " s;";
    }
    for (const auto& [phase, texts] : messages) {
      for (const std::string& m : texts) summary << "\n  " << phase << ": " << m;
    }
    std::cout << "[chaos]" << summary.str() << "\n";
    EXPECT_GT(tally["after"]["ok"], 0) << summary.str();
  }

  // (c) No slot lost: every slot comes free, and `kSlots` sessions open at once.
  const int verifier_metrics = cluster_->verifier()->metrics_port();
  EXPECT_TRUE(lede::testing::WaitUntil([&] { return SlotsInUse(verifier_metrics) == 0; }, 20s, 20ms))
      << "lede_kv_slots_in_use = " << SlotsInUse(verifier_metrics) << Logs();
  {
    SlotHolders held;
    EXPECT_TRUE(held.Open(cluster_->coordinator_target(), kSlots)) << Logs();
    EXPECT_EQ(SlotsInUse(verifier_metrics), kSlots) << Logs();
  }

  // (d) No torn shard: the coordinator flushes on SIGTERM; every shard it
  // and its SIGKILLed predecessor published reads back whole, and the
  // restart removed the predecessor's temporary file.
  cluster_->coordinator()->Signal(SIGTERM);
  const std::optional<int> code = cluster_->coordinator()->Wait(30s);
  ASSERT_TRUE(code.has_value()) << "the coordinator did not exit after SIGTERM";
  EXPECT_EQ(*code, 0) << Logs();
  auto store = storage::OpenObjectStore(cluster_->experience_dir());
  ASSERT_THAT(store, IsOk());
  auto read = experience::ReadShardsFromStore(**store, "experience");
  ASSERT_THAT(read, IsOk());
  EXPECT_FALSE(read->shards.empty());
  EXPECT_GT(read->transitions.size(), 0u);
  for (const experience::ShardReport& s : read->shards) EXPECT_EQ(s.error, "") << s.path;
  for (const auto& e : std::filesystem::recursive_directory_iterator(cluster_->experience_dir())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos)
        << "temporary shard left behind: " << e.path();
  }
}

}  // namespace
}  // namespace lede
