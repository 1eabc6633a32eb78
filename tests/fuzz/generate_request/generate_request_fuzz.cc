// libFuzzer target: GenerateRequest validation (services/coordinator/
// request_validation.h, ValidateRequest and ValidateForModel). The input
// drives every field of a lede.v1.GenerateRequest and of the served
// ModelInfo through FuzzedDataProvider, so strings carry any bytes (invalid
// UTF-8 included, as the coordinator's GenerateRequestText pre-parse lets
// through) and numbers any value (NaN, infinities, extremes). Validation
// returns OK or an error status, never crashes; what it accepts keeps the
// documented ranges.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "proto/lede/v1/generation.pb.h"
#include "proto/lede/v1/model.pb.h"
#include "services/coordinator/request_validation.h"
#include "tests/fuzz/testing/fuzz_util.h"

namespace {

float AnyFloat(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return std::numeric_limits<float>::quiet_NaN();
    case 1: return std::numeric_limits<float>::infinity();
    case 2: return -std::numeric_limits<float>::infinity();
    case 3: return in.ConsumeFloatingPointInRange<float>(0.0f, 1.0f);
    case 4: return in.ConsumeFloatingPoint<float>();
    default: return 0.0f;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lede::fuzz::Check;
  FuzzedDataProvider in(data, size);
  lede::v1::GenerateRequest r;
  r.set_request_id(in.ConsumeRandomLengthString(200));
  if (in.ConsumeBool()) r.set_prompt(in.ConsumeRandomLengthString(400));
  const int n_ids = in.ConsumeIntegralInRange<int>(0, 64);
  for (int i = 0; i < n_ids; ++i) r.add_prompt_token_ids(in.ConsumeIntegral<int32_t>());
  r.set_max_new_tokens(in.ConsumeIntegral<int32_t>());
  r.set_temperature(AnyFloat(in));
  r.set_top_p(AnyFloat(in));
  r.set_seed(in.ConsumeIntegral<uint64_t>());
  const int n_stop = in.ConsumeIntegralInRange<int>(0, 8);
  for (int i = 0; i < n_stop; ++i) r.add_stop(in.ConsumeRandomLengthString(40));
  r.set_method(static_cast<lede::v1::SpeculationMethod>(in.ConsumeIntegralInRange<int>(-2, 8)));
  if (in.ConsumeBool()) {
    lede::v1::SpeculationParams* s = r.mutable_speculation();
    s->set_exit_layer(in.ConsumeIntegral<int32_t>());
    s->set_draft_length(in.ConsumeIntegral<int32_t>());
    s->set_threshold(AnyFloat(in));
    s->set_epsilon(AnyFloat(in));
  }
  const int64_t limit = in.ConsumeIntegralInRange<int64_t>(1, 1 << 20);
  const bool fill = in.ConsumeBool();
  auto checked = lede::coordinator::ValidateRequest(r, limit, fill);
  if (checked.ok()) {
    Check(r.max_new_tokens() <= limit, "accepted max_new_tokens above the limit");
    Check(std::isfinite(r.temperature()) && r.temperature() >= 0, "accepted a bad temperature");
    Check(checked->top_p > 0 && checked->top_p <= 1, "accepted a top_p outside (0, 1]");
  } else {
    Check(checked.status().code() == lede::StatusCode::kInvalidArgument, "a bad request is not INVALID_ARGUMENT");
  }
  lede::v1::ModelInfo info;
  info.set_n_layers(in.ConsumeIntegralInRange<int32_t>(-1, 64));
  info.set_vocab_size(in.ConsumeIntegralInRange<int32_t>(-1, 1 << 17));
  info.set_capacity(in.ConsumeIntegralInRange<int64_t>(-1, 1 << 20));
  info.set_max_draft_length(in.ConsumeIntegralInRange<int32_t>(-1, 32));
  const lede::Status for_model = lede::coordinator::ValidateForModel(r, info);
  if (for_model.ok()) {
    for (int32_t id : r.prompt_token_ids()) Check(id >= 0 && id < info.vocab_size(), "accepted an id outside the vocabulary");
  }
  return 0;
}
