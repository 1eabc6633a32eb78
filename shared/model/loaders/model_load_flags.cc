#include "shared/model/loaders/model_load_flags.h"

#include <string>

#include "shared/model/loaders/weight_format.h"

namespace lede::model::loaders {
namespace {

// The engine's parsers name the value ("dtype: unknown 'x'"); the flag gets
// its dashes.
Status AsFlagError(const Status& s) { return InvalidArgumentError("--" + std::string(s.message())); }

}  // namespace

StatusOr<ModelOptions> ModelOptionsFromFlags(const flags::ModelLoadFlags& v) {
  ModelOptions o;
  auto device = ParseDevice(v.device);
  if (!device.ok()) return AsFlagError(device.status());
  o.device = *device;
  auto dtype = ParseDtype(v.dtype);
  if (!dtype.ok()) return AsFlagError(dtype.status());
  o.dtype = *dtype;
  auto kernels = ParseKernels(v.kernels);
  if (!kernels.ok()) return AsFlagError(kernels.status());
  o.kernels = *kernels;
  auto graphs = ParseGraphMode(v.graphs);
  if (!graphs.ok()) return AsFlagError(graphs.status());
  o.graphs = *graphs;
  auto weights = ParseWeightFormat(v.weights);
  if (!weights.ok()) return AsFlagError(weights.status());
  o.weights = *weights;
  return o;
}

StatusOr<int> ApplyThreadsFlag(int64_t threads) {
  StatusOr<int> n = flags::ResolveThreads(threads, "threads");
  if (!n.ok()) return n.status();
  SetDecodeThreads(*n);
  return *n;
}

}  // namespace lede::model::loaders
