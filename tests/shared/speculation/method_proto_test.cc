#include "shared/speculation/method_proto.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace lede::speculation {
namespace {

using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

TEST(MethodProtoTest, EveryMethodRoundTripsThroughTheWire) {
  for (SpeculationMethod m : {SpeculationMethod::kAutoregressive, SpeculationMethod::kStatic,
                              SpeculationMethod::kThreshold, SpeculationMethod::kLede}) {
    const lede::v1::SpeculationMethod wire = MethodToProto(m);
    EXPECT_NE(wire, lede::v1::SPECULATION_METHOD_UNSPECIFIED);
    ASSERT_TRUE(MethodFromProto(wire).has_value());
    EXPECT_EQ(*MethodFromProto(wire), m);
  }
}

TEST(MethodProtoTest, UnspecifiedIsLedeAndOutOfEnumIsNone) {
  EXPECT_EQ(MethodFromProto(lede::v1::SPECULATION_METHOD_UNSPECIFIED), SpeculationMethod::kLede);
  EXPECT_FALSE(MethodFromProto(static_cast<lede::v1::SpeculationMethod>(99)).has_value());
}

TEST(MethodProtoTest, SpecCarriesTheParams) {
  lede::v1::SpeculationParams params;
  params.set_exit_layer(3);
  params.set_draft_length(5);
  params.set_threshold(0.7f);
  params.set_epsilon(0.25f);
  StatusOr<MethodSpec> spec = MethodSpecFromProto(lede::v1::SPECULATION_METHOD_STATIC, params);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->method, SpeculationMethod::kStatic);
  EXPECT_EQ(spec->exit_layer, 3);
  EXPECT_EQ(spec->draft_len, 5);
  EXPECT_FLOAT_EQ(spec->threshold, 0.7f);
  EXPECT_FLOAT_EQ(spec->epsilon, 0.25f);
  spec = MethodSpecFromProto(lede::v1::SPECULATION_METHOD_UNSPECIFIED, {});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->method, SpeculationMethod::kLede);
}

TEST(MethodProtoTest, OutOfEnumSpecIsInvalidArgumentNamingMethod) {
  EXPECT_THAT(MethodSpecFromProto(static_cast<lede::v1::SpeculationMethod>(42), {}).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("method")));
}

TEST(MethodProtoTest, WireNamesRoundTrip) {
  for (lede::v1::SpeculationMethod m :
       {lede::v1::SPECULATION_METHOD_LEDE, lede::v1::SPECULATION_METHOD_STATIC,
        lede::v1::SPECULATION_METHOD_THRESHOLD, lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE}) {
    lede::v1::SpeculationMethod parsed = lede::v1::SPECULATION_METHOD_UNSPECIFIED;
    ASSERT_TRUE(ParseSpeculationMethodName(SpeculationMethodName(m), &parsed)) << m;
    EXPECT_EQ(parsed, m);
  }
  EXPECT_EQ(SpeculationMethodName(lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE), "autoregressive");
  EXPECT_EQ(SpeculationMethodName(lede::v1::SPECULATION_METHOD_UNSPECIFIED), "lede");
  EXPECT_EQ(SpeculationMethodName(static_cast<lede::v1::SpeculationMethod>(99)), "lede");
  lede::v1::SpeculationMethod parsed = lede::v1::SPECULATION_METHOD_UNSPECIFIED;
  EXPECT_TRUE(ParseSpeculationMethodName("Static", &parsed));
  EXPECT_EQ(parsed, lede::v1::SPECULATION_METHOD_STATIC);
  EXPECT_TRUE(ParseSpeculationMethodName("ar", &parsed));
  EXPECT_EQ(parsed, lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE);
  parsed = lede::v1::SPECULATION_METHOD_THRESHOLD;
  for (const char* bad : {"fast", "unspecified", "", "STATIC "}) {
    EXPECT_FALSE(ParseSpeculationMethodName(bad, &parsed)) << bad;
    EXPECT_EQ(parsed, lede::v1::SPECULATION_METHOD_THRESHOLD) << bad;
  }
}

}  // namespace
}  // namespace lede::speculation
