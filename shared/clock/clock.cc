#include "shared/clock/clock.h"

#include "absl/time/clock.h"

namespace lede::clock {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  void SleepFor(absl::Duration d) override {
    if (d > absl::ZeroDuration()) absl::SleepFor(d);
  }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu->AwaitWithDeadline(cond, deadline);
  }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* const clock = new RealClock();
  return clock;
}

}  // namespace lede::clock