// File: tests/testing/status_matchers.h
//
// gMock matchers for lede::Status and lede::StatusOr<T> (abseil 20220623 does
// not ship them):
//   EXPECT_THAT(LoadCheckpoint(p), IsOk());
//   EXPECT_THAT(LoadCheckpoint(bad), StatusIs(lede::StatusCode::kInvalidArgument));
#ifndef LEDE_TESTS_TESTING_STATUS_MATCHERS_H_
#define LEDE_TESTS_TESTING_STATUS_MATCHERS_H_

#include <ostream>

#include "gmock/gmock.h"
#include "shared/status/status.h"

namespace lede::testing {
namespace internal {

inline const Status& GetStatus(const Status& s) { return s; }
template <typename T>
const Status& GetStatus(const StatusOr<T>& s) { return s.status(); }

}  // namespace internal

MATCHER(IsOk, "is OK") {
  const Status& s = internal::GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s.ToString();
  return s.ok();
}

MATCHER_P(StatusIs, code, "has status code " + ::testing::PrintToString(static_cast<int>(code))) {
  const Status& s = internal::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code;
}

// StatusIs(code, message_matcher): the code, and the message matches, e.g.
// StatusIs(StatusCode::kInvalidArgument, HasSubstr("max_new_tokens")).
MATCHER_P2(StatusIs, code, message_matcher,
           "has status code " + ::testing::PrintToString(static_cast<int>(code)) + " and a matching message") {
  const Status& s = internal::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code &&
         ::testing::Matcher<std::string>(message_matcher).Matches(std::string(s.message()));
}

}  // namespace lede::testing

#endif  // LEDE_TESTS_TESTING_STATUS_MATCHERS_H_
