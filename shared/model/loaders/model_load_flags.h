// File: shared/model/loaders/model_load_flags.h
//
// The model-loading flag group (shared/flags/model_flags.h) turned into
// ModelOptions: one conversion for every binary, so each flag means the same
// everywhere and every error names the flag.
#ifndef LEDE_SHARED_MODEL_LOADERS_MODEL_LOAD_FLAGS_H_
#define LEDE_SHARED_MODEL_LOADERS_MODEL_LOAD_FLAGS_H_

#include "shared/flags/model_flags.h"
#include "shared/model/llama.h"
#include "shared/status/status.h"

namespace lede::model::loaders {

// Parses --device, --dtype, --kernels, --graphs and --weights into
// ModelOptions (other fields at their defaults). Does not read --model or
// --threads (ApplyThreadsFlag does that).
// Errors: kInvalidArgument naming the flag ("--dtype: ...").
StatusOr<ModelOptions> ModelOptionsFromFlags(const flags::ModelLoadFlags& values);

// Resolves --threads (0 = every CPU the process may use) and sets it for
// every kernel of calls from the calling thread (SetDecodeThreads: libtorch's
// intra-op threads and the fused kernels'; both are per thread). Returns the
// count set. Errors: kInvalidArgument naming --threads.
StatusOr<int> ApplyThreadsFlag(int64_t threads);

}  // namespace lede::model::loaders

#endif  // LEDE_SHARED_MODEL_LOADERS_MODEL_LOAD_FLAGS_H_
