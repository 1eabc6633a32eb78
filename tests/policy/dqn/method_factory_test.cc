// The one method vocabulary (shared/speculation/method.h) and the one factory
// from a method to its loop mode and controller (policy/dqn/method_factory.h).
#include "policy/dqn/method_factory.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/dqn/q_network.h"
#include "shared/speculation/method.h"
#include "tests/testing/status_matchers.h"

namespace lede::policy::dqn {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;
using speculation::MethodSpec;
using speculation::SpeculationMethod;
using speculation::SpeculationMode;

// Every accepted name (CLI, HTTP, canonical), any case, parses to its method,
// and the canonical name round-trips.
TEST(SpeculationMethodTest, ParsesEveryName) {
  const struct {
    const char* name;
    SpeculationMethod method;
  } cases[] = {
      {"ar", SpeculationMethod::kAutoregressive},     {"autoregressive", SpeculationMethod::kAutoregressive},
      {"AutoRegressive", SpeculationMethod::kAutoregressive}, {"static", SpeculationMethod::kStatic},
      {"STATIC", SpeculationMethod::kStatic},         {"threshold", SpeculationMethod::kThreshold},
      {"lede", SpeculationMethod::kLede},             {"LEDE", SpeculationMethod::kLede},
  };
  for (const auto& c : cases) {
    StatusOr<SpeculationMethod> m = speculation::ParseSpeculationMethod(c.name);
    ASSERT_THAT(m, IsOk()) << c.name;
    EXPECT_EQ(*m, c.method) << c.name;
    EXPECT_EQ(*speculation::ParseSpeculationMethod(speculation::SpeculationMethodName(*m)), *m);
  }
  EXPECT_EQ(speculation::SpeculationMethodName(SpeculationMethod::kAutoregressive), "autoregressive");
  EXPECT_EQ(speculation::SpeculationMethodName(SpeculationMethod::kLede), "lede");
}

// A bad name is kInvalidArgument naming the value and the accepted names.
TEST(SpeculationMethodTest, BadNamesNameTheValue) {
  for (const char* bad : {"", "fast", "unspecified", "static ", "SPECULATION_METHOD_STATIC"}) {
    StatusOr<SpeculationMethod> m = speculation::ParseSpeculationMethod(bad);
    EXPECT_THAT(m, StatusIs(StatusCode::kInvalidArgument)) << bad;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("'" + std::string(bad) + "'"));
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("autoregressive (ar), static, threshold or lede"));
  }
}

// The loop mode of each method.
TEST(SpeculationMethodTest, LoopModes) {
  EXPECT_EQ(speculation::LoopMode(SpeculationMethod::kAutoregressive), SpeculationMode::kAutoregressive);
  EXPECT_EQ(speculation::LoopMode(SpeculationMethod::kStatic), SpeculationMode::kStatic);
  EXPECT_EQ(speculation::LoopMode(SpeculationMethod::kThreshold), SpeculationMode::kAdaptive);
  EXPECT_EQ(speculation::LoopMode(SpeculationMethod::kLede), SpeculationMode::kAdaptive);
}

std::shared_ptr<const Artifact> TestArtifact() {
  PolicyMetadata m;
  m.version = "v7";
  m.decision.candidate_layers = {2, 4};
  m.decision.max_draft_len = 12;
  return std::make_shared<const Artifact>(Artifact{m, QNetwork::Random(8, 3)});
}

MethodContext Context(std::shared_ptr<const Artifact> artifact = nullptr) {
  MethodContext c;
  c.n_layers = 6;
  c.max_draft_len = 10;
  c.artifact = std::move(artifact);
  return c;
}

MethodSpec Spec(SpeculationMethod method) {
  MethodSpec s;
  s.method = method;
  return s;
}

// Autoregressive and static need no controller; static carries (E, D).
TEST(MethodFactoryTest, AutoregressiveAndStatic) {
  auto ar = PlanMethod(Spec(SpeculationMethod::kAutoregressive), Context());
  ASSERT_THAT(ar, IsOk());
  EXPECT_EQ(ar->mode, SpeculationMode::kAutoregressive);
  EXPECT_EQ(ar->MakeController(), nullptr);

  MethodSpec s = Spec(SpeculationMethod::kStatic);
  s.exit_layer = 3;
  s.draft_len = 5;
  auto st = PlanMethod(s, Context());
  ASSERT_THAT(st, IsOk());
  EXPECT_EQ(st->mode, SpeculationMode::kStatic);
  EXPECT_EQ(st->exit_layer, 3);
  EXPECT_EQ(st->draft_len, 5);
  EXPECT_EQ(st->MakeController(), nullptr);

  s.exit_layer = 7;  // > L
  EXPECT_THAT(PlanMethod(s, Context()), StatusIs(StatusCode::kInvalidArgument));
  s.exit_layer = 3;
  s.draft_len = 0;
  EXPECT_THAT(PlanMethod(s, Context()), StatusIs(StatusCode::kInvalidArgument));
}

// Threshold asks at every layer below L, caps D_max at min(8, pool), and
// makes a fresh threshold controller per call.
TEST(MethodFactoryTest, Threshold) {
  MethodSpec s = Spec(SpeculationMethod::kThreshold);
  s.threshold = 0.8f;
  auto plan = PlanMethod(s, Context());
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->mode, SpeculationMode::kAdaptive);
  EXPECT_EQ(plan->decision_spec.candidate_layers, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(plan->decision_spec.max_draft_len, 8);
  std::unique_ptr<speculation::ExitController> a = plan->MakeController(), b = plan->MakeController();
  ASSERT_NE(a, nullptr);
  EXPECT_NE(a.get(), b.get());
  EXPECT_EQ(a->name(), plan->policy_version);
  for (float bad : {0.0f, 1.5f, -1.0f}) {
    s.threshold = bad;
    EXPECT_THAT(PlanMethod(s, Context()), StatusIs(StatusCode::kInvalidArgument)) << bad;
  }
}

// LEDE uses the artifact's decision spec (D_max clamped to the pool) and
// version, and needs an artifact.
TEST(MethodFactoryTest, LedeUsesTheArtifact) {
  auto plan = PlanMethod(Spec(SpeculationMethod::kLede), Context(TestArtifact()));
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->mode, SpeculationMode::kAdaptive);
  EXPECT_EQ(plan->decision_spec.candidate_layers, (std::vector<int32_t>{2, 4}));
  EXPECT_EQ(plan->decision_spec.max_draft_len, 10);
  EXPECT_EQ(plan->policy_version, "v7");
  std::unique_ptr<speculation::ExitController> c = plan->MakeController();
  ASSERT_NE(c, nullptr);
  EXPECT_THAT(c->name(), HasSubstr("v7"));

  EXPECT_THAT(PlanMethod(Spec(SpeculationMethod::kLede), Context()), StatusIs(StatusCode::kFailedPrecondition));
  MethodSpec eps = Spec(SpeculationMethod::kLede);
  eps.epsilon = 1.5f;
  EXPECT_THAT(PlanMethod(eps, Context(TestArtifact())), StatusIs(StatusCode::kInvalidArgument));
}

// A context without a model is refused whatever the method.
TEST(MethodFactoryTest, BadContextIsInvalidArgument) {
  MethodContext c = Context();
  c.n_layers = 1;
  EXPECT_THAT(PlanMethod(Spec(SpeculationMethod::kAutoregressive), c), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lede::policy::dqn
