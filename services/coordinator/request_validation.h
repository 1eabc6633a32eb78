// File: services/coordinator/request_validation.h
//
// Validation of a lede.v1.GenerateRequest (proto/lede/v1/generation.proto),
// shared by the gRPC and HTTP front ends. Every error is INVALID_ARGUMENT
// with a message that starts with the field's name ("max_new_tokens: ...",
// "speculation.exit_layer: ...", "stop[2]: ..."). Pure functions; thread-safe.
#ifndef LEDE_SERVICES_COORDINATOR_REQUEST_VALIDATION_H_
#define LEDE_SERVICES_COORDINATOR_REQUEST_VALIDATION_H_

#include <cstdint>
#include <string>

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

// What bounds the work and memory of one request (issue 17, failure 1):
// nothing the coordinator buffers, parses or tokenizes for a request is
// larger than a few multiples of capacity_tokens x max_token_bytes.
struct RequestBounds {
  // KV capacity per session, tokens (ModelInfo.capacity: the context window
  // a prompt and its generation share).
  int64_t capacity_tokens = 0;
  // The most text bytes one token covers (Tokenizer::MaxTokenBytes()).
  int64_t max_token_bytes = 0;
  // The longest prompt text that can fit, bytes: a longer one cannot encode
  // to capacity_tokens tokens or fewer.
  int64_t max_prompt_bytes() const { return capacity_tokens * max_token_bytes; }
  // The model's context window, tokens (ModelInfo.context_window; 0 = the
  // capacity): what does not fit capacity_tokens but would fit this is
  // refused with kResourceExhausted (the KV budget), not kInvalidArgument.
  int64_t context_window_tokens = 0;
};

// At most this many stop strings per request (OpenAI allows 4).
inline constexpr int kMaxStopStrings = 16;

// The size checks, before any tokenization: prompt.size() <=
// bounds.max_prompt_bytes(); prompt_token_ids_size() <= capacity_tokens;
// stop_size() <= kMaxStopStrings and the stop strings' bytes together <=
// max_prompt_bytes() (a longer one could never match the generated text).
// Errors: kInvalidArgument naming the field ("prompt: 20971520 bytes cannot
// fit the context window of 256 tokens (at most 8192 bytes)",
// "prompt_token_ids: ...", "stop: ..."); kResourceExhausted for a prompt
// that exceeds capacity_tokens (or its bytes) but fits context_window_tokens
// (the KV budget's slot is smaller than the window). Pure; thread-safe;
// O(stop_size()).
Status ValidateRequestSize(const lede::v1::GenerateRequest& request, const RequestBounds& bounds);

// The largest serialized GenerateRequest a valid request can need, bytes:
// the prompt (or prompt_token_ids at 10 bytes per varint, whichever is
// larger), the stop strings, and 64 KiB for the other fields. The public
// gRPC server's receive-message limit (services/coordinator/main.cc): a
// larger message is RESOURCE_EXHAUSTED from gRPC before it is buffered.
int64_t MaxRequestMessageBytes(const RequestBounds& bounds);

// The largest OpenAI HTTP request body a valid request can need, bytes: the
// text of MaxRequestMessageBytes() with JSON's worst-case escaping (6 bytes
// per byte, "\u0000"), token-id arrays at 12 bytes per id, and 64 KiB. The
// HTTP API's body limit (413 above, before JSON parsing).
int64_t MaxHttpBodyBytes(const RequestBounds& bounds);

// The context window of the model at `model_path`, tokens: config.json's
// max_position_embeddings for a Hugging Face directory, the header's seq_len
// for a llama2.c .bin (or a directory holding one model .bin), the
// llama.context_length key of a .gguf file. Reads at most the config file,
// 28 header bytes, or a .gguf's metadata (mapped). Used to size the limits at startup,
// before the verifier can be asked (it may start later).
// Errors: kNotFound when neither file exists; kInvalidArgument naming the
// file when it is malformed or the value is not a positive integer.
StatusOr<int64_t> ReadContextWindow(const std::string& model_path);

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_REQUEST_VALIDATION_H_
