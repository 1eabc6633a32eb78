// File: tests/testing/retrain_once.h
//
// One forced pass of the batch retrainer for system tests: the candidate is
// published whatever its evaluation says (publish margin -inf), so a test
// can make the trainer publish a new version now. Include only from tests
// that link lede::retrain.
#ifndef LEDE_TESTS_TESTING_RETRAIN_ONCE_H_
#define LEDE_TESTS_TESTING_RETRAIN_ONCE_H_

#include <limits>
#include <string>
#include <utility>

#include "shared/status/status.h"
#include "shared/status/status_macros.h"
#include "trainer/retrain.h"

namespace lede::testing {

// Retrainer::Create(options) then RunOnce with publish_margin = -inf.
// Errors: those of Create and RunOnce; kFailedPrecondition (with the
// retrainer's reason) when the pass published nothing.
inline StatusOr<trainer::RetrainOutcome> RetrainAndPublish(trainer::RetrainOptions options) {
  options.publish_margin = -std::numeric_limits<double>::infinity();
  LEDE_ASSIGN_OR_RETURN(auto retrainer, trainer::Retrainer::Create(std::move(options)));
  LEDE_ASSIGN_OR_RETURN(trainer::RetrainOutcome outcome, retrainer->RunOnce());
  if (outcome.decision != trainer::RetrainDecision::kPublished) {
    return FailedPreconditionError("retrain published nothing: " + outcome.reason);
  }
  return outcome;
}

}  // namespace lede::testing

#endif  // LEDE_TESTS_TESTING_RETRAIN_ONCE_H_
