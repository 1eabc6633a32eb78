// File: services/coordinator/request_validation.h
//
// Validation of a lede.v1.GenerateRequest (proto/lede/v1/generation.proto),
// shared by the gRPC and HTTP front ends. Every error is INVALID_ARGUMENT
// with a message that starts with the field's name ("max_new_tokens: ...",
// "speculation.exit_layer: ...", "stop[2]: ..."). Pure functions; thread-safe.
#ifndef LEDE_SERVICES_COORDINATOR_REQUEST_VALIDATION_H_
#define LEDE_SERVICES_COORDINATOR_REQUEST_VALIDATION_H_

#include <cstdint>

#include "proto/lede/v1/generation.pb.h"
#include "proto/lede/v1/model.pb.h"
#include "shared/status/status.h"

namespace lede::coordinator {

// What validation derives from a request.
struct CheckedRequest {
  // max_new_tokens == 0 with fill_max_tokens: generate up to the context window.
  bool auto_max_tokens = false;
  double top_p = 1.0;  // a top_p of 0 (unset) means 1
};

// The checks that need no model process: request_id (<= 128 bytes, UTF-8),
// prompt xor prompt_token_ids, max_new_tokens in [1, max_new_tokens_limit]
// (0 allowed with `fill_max_tokens`), temperature >= 0 and finite, top_p in
// (0, 1], a known method and its speculation parameters (threshold in
// (0, 1], epsilon in [0, 1]), every stop string non-empty UTF-8.
StatusOr<CheckedRequest> ValidateRequest(const lede::v1::GenerateRequest& request, int64_t max_new_tokens_limit,
                                         bool fill_max_tokens);

// The checks against the served model: a static method's exit_layer in
// [1, n_layers] and draft_length in [1, max_draft_length]; every
// prompt_token_ids entry in [0, vocab_size).
Status ValidateForModel(const lede::v1::GenerateRequest& request, const lede::v1::ModelInfo& info);

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_REQUEST_VALIDATION_H_
