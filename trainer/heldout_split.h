// File: trainer/heldout_split.h
//
// The one held-out split of the trainers: whether a unit of data (a request
// id, an episode key) is held out for evaluation, decided by a stable hash
// so that the same unit lands on the same side on every machine, in every
// run and in every retraining round (a request trained on once is never
// evaluated on later). Used by the transition retrainer (trainer/retrain.h,
// split by request) and the request-log retrainer (trainer/request_retrain.h).
//
// The hash is FNV-1a over the unit's bytes with the 64-bit FNV prime and the
// offset basis kSplitHashBasis, which is the standard 64-bit basis
// (14695981039346656037) without its last digit: the split was first
// written that way, and keeping the constant keeps every logged request on
// the side it was already on (a retrained policy is never evaluated on
// requests an earlier one trained on). The mixing is unchanged, so the
// spread is as even. A unit is held out when hash mod 10^6 < fraction *
// 10^6, so about `fraction` of distinct units are held out (resolution
// 1e-6).
//
// Example:
//   if (IsHeldOut(record.request_id(), 0.2)) heldout.push_back(record);
//
// Thread-safety: pure functions. Torch-free.
#ifndef LEDE_TRAINER_HELDOUT_SPLIT_H_
#define LEDE_TRAINER_HELDOUT_SPLIT_H_

#include <cstdint>
#include <string_view>

namespace lede::trainer {

inline constexpr uint64_t kSplitHashBasis = 1469598103934665603ull;
inline constexpr uint64_t kSplitHashPrime = 1099511628211ull;  // the 64-bit FNV prime

// The split's hash of `bytes`: for each byte, h = (h ^ byte) * prime, from
// h = kSplitHashBasis (so SplitHash("") == kSplitHashBasis).
uint64_t SplitHash(std::string_view bytes);

// Whether `unit` is held out at `fraction` (the share of units held out; <= 0
// holds out none, >= 1 holds out all). Stable across runs and machines.
bool IsHeldOut(std::string_view unit, double fraction);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_HELDOUT_SPLIT_H_
