// File: tests/shared/model/golden_values.h
//
// Golden token ids of the two real test models, from
// testdata/models/README.md. Torch-free, so that tokenizer tests can use
// them without compiling llama.h.
#ifndef LEDE_TESTS_SHARED_MODEL_GOLDEN_VALUES_H_
#define LEDE_TESTS_SHARED_MODEL_GOLDEN_VALUES_H_

#include <cstdint>
#include <vector>

namespace lede::model::testing {

// stories260K: "Once upon a time" with BOS, and its 36-token greedy continuation.
inline const std::vector<int32_t> kStoriesPrompt = {1, 403, 407, 261, 378};
inline const std::vector<int32_t> kStoriesGreedy = {
    432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408,
    419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352};

// babyllama-tok105: "Once upon a time" with BOS, and its 23-token greedy continuation.
inline const std::vector<int32_t> kBabyPrompt = {1, 3, 34, 9, 22, 4, 3, 18, 20, 7, 9, 3, 5, 3, 6, 10, 16, 4};
inline const std::vector<int32_t> kBabyGreedy = {25, 3, 6, 8, 4, 13, 4, 3, 17, 5, 12, 3,
                                                 5, 3, 14, 10, 6, 6, 14, 4, 3, 21, 10};

}  // namespace lede::model::testing

#endif  // LEDE_TESTS_SHARED_MODEL_GOLDEN_VALUES_H_
