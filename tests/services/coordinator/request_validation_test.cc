#include "services/coordinator/request_validation.h"

#include <string>

#include <gtest/gtest.h>

namespace lede::coordinator {
namespace {

lede::v1::GenerateRequest Valid() {
  lede::v1::GenerateRequest r;
  r.set_prompt("Once upon a time");
  r.set_max_new_tokens(16);
  r.set_method(lede::v1::SPECULATION_METHOD_LEDE);
  return r;
}

lede::v1::ModelInfo Info() {
  lede::v1::ModelInfo info;
  info.set_n_layers(8);
  info.set_max_draft_length(4);
  info.set_vocab_size(512);
  return info;
}

// The message of `status` when it is INVALID_ARGUMENT, else a marker.
std::string Invalid(const Status& status) {
  if (status.code() != StatusCode::kInvalidArgument) return "<code " + std::to_string(int(status.code())) + ">";
  return std::string(status.message());
}

std::string FieldOf(const std::string& message) { return message.substr(0, message.find(':')); }

TEST(RequestValidationTest, AcceptsAValidRequestAndDerivesDefaults) {
  StatusOr<CheckedRequest> checked = ValidateRequest(Valid(), 1024, false);
  ASSERT_TRUE(checked.ok()) << checked.status().message();
  EXPECT_FALSE(checked->auto_max_tokens);
  EXPECT_EQ(checked->top_p, 1.0);  // unset top_p means 1
  EXPECT_TRUE(ValidateForModel(Valid(), Info()).ok());
}

TEST(RequestValidationTest, EveryErrorNamesItsField) {
  struct Case {
    std::string field;
    void (*mutate)(lede::v1::GenerateRequest*);
  };
  const Case cases[] = {
      {"request_id", [](lede::v1::GenerateRequest* r) { r->set_request_id(std::string(129, 'x')); }},
      {"request_id", [](lede::v1::GenerateRequest* r) { r->set_request_id("\xff"); }},
      {"prompt", [](lede::v1::GenerateRequest* r) { r->clear_prompt(); }},
      {"prompt", [](lede::v1::GenerateRequest* r) { r->add_prompt_token_ids(1); }},
      {"prompt", [](lede::v1::GenerateRequest* r) { r->set_prompt("\xc3"); }},
      {"max_new_tokens", [](lede::v1::GenerateRequest* r) { r->set_max_new_tokens(0); }},
      {"max_new_tokens", [](lede::v1::GenerateRequest* r) { r->set_max_new_tokens(1025); }},
      {"temperature", [](lede::v1::GenerateRequest* r) { r->set_temperature(-0.5f); }},
      {"top_p", [](lede::v1::GenerateRequest* r) { r->set_top_p(1.5f); }},
      {"method", [](lede::v1::GenerateRequest* r) { r->set_method(static_cast<lede::v1::SpeculationMethod>(99)); }},
      {"speculation.threshold",
       [](lede::v1::GenerateRequest* r) { r->set_method(lede::v1::SPECULATION_METHOD_THRESHOLD); }},
      {"speculation.epsilon", [](lede::v1::GenerateRequest* r) { r->mutable_speculation()->set_epsilon(2.0f); }},
      {"stop[1]",
       [](lede::v1::GenerateRequest* r) {
         r->add_stop("ok");
         r->add_stop("");
       }},
  };
  for (const Case& c : cases) {
    lede::v1::GenerateRequest r = Valid();
    c.mutate(&r);
    StatusOr<CheckedRequest> checked = ValidateRequest(r, 1024, false);
    ASSERT_FALSE(checked.ok()) << c.field;
    EXPECT_EQ(FieldOf(Invalid(checked.status())), c.field) << checked.status().message();
  }
}

TEST(RequestValidationTest, ZeroMaxTokensMeansTheContextWindowOnlyWhenAsked) {
  lede::v1::GenerateRequest r = Valid();
  r.set_max_new_tokens(0);
  EXPECT_FALSE(ValidateRequest(r, 1024, /*fill_max_tokens=*/false).ok());
  StatusOr<CheckedRequest> checked = ValidateRequest(r, 1024, /*fill_max_tokens=*/true);
  ASSERT_TRUE(checked.ok());
  EXPECT_TRUE(checked->auto_max_tokens);
}

TEST(RequestValidationTest, ModelChecksNameTheirField) {
  lede::v1::GenerateRequest r = Valid();
  r.set_method(lede::v1::SPECULATION_METHOD_STATIC);
  r.mutable_speculation()->set_exit_layer(9);
  r.mutable_speculation()->set_draft_length(2);
  EXPECT_EQ(Invalid(ValidateForModel(r, Info())), "speculation.exit_layer: 9 outside [1, 8]");
  r.mutable_speculation()->set_exit_layer(3);
  r.mutable_speculation()->set_draft_length(5);
  EXPECT_EQ(Invalid(ValidateForModel(r, Info())), "speculation.draft_length: 5 outside [1, 4]");
  r.mutable_speculation()->set_draft_length(4);
  EXPECT_TRUE(ValidateForModel(r, Info()).ok());

  lede::v1::GenerateRequest ids = Valid();
  ids.clear_prompt();
  ids.add_prompt_token_ids(5);
  ids.add_prompt_token_ids(512);
  EXPECT_EQ(Invalid(ValidateForModel(ids, Info())), "prompt_token_ids[1]: 512 outside [0, 512)");
}

}  // namespace
}  // namespace lede::coordinator
