#include "trainer/heldout_split.h"

namespace lede::trainer {

uint64_t SplitHash(std::string_view bytes) {
  uint64_t h = kSplitHashBasis;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= kSplitHashPrime;
  }
  return h;
}

bool IsHeldOut(std::string_view unit, double fraction) {
  constexpr uint64_t kBuckets = 1000000;
  return static_cast<double>(SplitHash(unit) % kBuckets) < fraction * static_cast<double>(kBuckets);
}

}  // namespace lede::trainer
