// File: services/coordinator/openai_api.h
//
// The OpenAI-compatible HTTP API's translation layer, free of HTTP: request
// JSON → lede.v1.GenerateRequest, and GenerateResponse / GenerationSummary →
// response JSON and Server-Sent-Event chunks, plus the error envelope. The
// server (openai_server.h) moves bytes; everything a client parses is built
// here, so it is unit-tested without sockets.
//
// Validation: this layer checks only what the gRPC API has no field for
// (JSON types, `n`, `stream`, `messages`, the speculation method's name)
// and copies values through; ranges (max_new_tokens, temperature, top_p,
// stop, speculation.*) are checked once, by the coordinator's own
// validation, whose "field: reason" errors ToApiError() maps to the HTTP
// request's parameter names (max_new_tokens → max_tokens, ...).
//
// Sources: OpenAI's API reference (completions, chat completions, streaming,
// error envelope); llama.cpp's server for `timings`; vLLM for ignoring
// unknown fields; docs/api.md.
//
// Thread-safety: pure functions.
#ifndef LEDE_SERVICES_COORDINATOR_OPENAI_API_H_
#define LEDE_SERVICES_COORDINATOR_OPENAI_API_H_

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "proto/lede/v1/generation.pb.h"
#include "services/coordinator/chat_prompt.h"
#include "shared/status/status.h"

namespace lede::coordinator::openai {

enum class Endpoint { kCompletions, kChatCompletions };

// A parsed request.
struct Request {
  Endpoint endpoint = Endpoint::kCompletions;
  lede::v1::GenerateRequest generate;  // what the coordinator runs
  std::string model;                   // as asked; "" when absent
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage
  // Chat without max_tokens / max_completion_tokens: generate up to the
  // context window (generate.max_new_tokens is 0; see GenerateInProcess).
  bool fill_max_tokens = false;
  // The name the client used for the token limit, for error messages.
  std::string max_tokens_param = "max_tokens";
  std::vector<std::string> ignored_fields;  // unknown top-level fields (logged)
};

// Default max_tokens of /v1/completions when the client sends none
// (OpenAI's documented default).
inline constexpr int kDefaultCompletionMaxTokens = 16;

// The deepest nesting of arrays and objects a request body may have (an
// OpenAI body needs about 5: messages[i].content[j].image_url.url). Checked
// by a pass that builds nothing before the body is parsed, so no client can
// make the coordinator recurse deeper.
inline constexpr int kMaxJsonDepth = 64;

// Parses a request body for `endpoint`.
//   completions: prompt (string, [string], [int], [[int]]; one prompt only),
//   chat: messages [{role, content: string | [{type: "text", text}] | null}]
//     rendered by `render_chat`;
//   both: model, max_tokens (chat also max_completion_tokens, which wins),
//     temperature (default 1), top_p (default 1), seed (default: random),
//     stop (string or list), stream, stream_options.include_usage, n (1
//     only), user (ignored), speculation {method: lede | static | threshold
//     | autoregressive, exit_layer, draft_length, threshold, epsilon}.
//   Unknown fields are listed in ignored_fields. `random_seed` is used when
//   the client sends no seed.
// Errors: kInvalidArgument "<param>: <reason>" with the HTTP parameter name
// (nested deeper than kMaxJsonDepth: the top-level field named; not JSON,
// not an object, wrong types, n != 1, unsupported echo / logprobs
// / best_of, several prompts, an unknown speculation method); out-of-range
// numbers are saturated into the proto's types and left to the coordinator.
StatusOr<Request> ParseRequest(Endpoint endpoint, const std::string& body,
                               const ChatPromptRenderer& render_chat, uint64_t random_seed);

// An error in OpenAI's envelope:
//   {"error": {"message", "type", "param", "code"}}
struct ApiError {
  int http_status = 500;
  std::string type = "server_error";
  std::string message;
  std::string param;  // "" → null
  std::string code;   // "" → null
  nlohmann::json ToJson() const;
};

// Maps a Status from ParseRequest() or the coordinator to an ApiError:
//   kInvalidArgument → 400 invalid_request_error, param = the field the
//     message names, translated to the HTTP name (max_new_tokens →
//     request.max_tokens_param, prompt / prompt_token_ids → prompt or
//     messages, stop[i] → stop, method → speculation.method);
//   kNotFound → 404 not_found_error; kResourceExhausted → 429
//   rate_limit_error (code rate_limit_exceeded); kUnavailable → 503
//   unavailable_error; anything else → 500 server_error.
// `request` may be null (the body did not parse).
ApiError ToApiError(const Status& status, const Request* request);

// 404 for an unknown model (code model_not_found, param model) and for an
// unknown route.
ApiError ModelNotFound(const std::string& model);
ApiError RouteNotFound(const std::string& method, const std::string& path);

// "stop" (EOS or a stop string) or "length".
std::string FinishReason(const lede::v1::GenerationSummary& summary);

// usage {prompt_tokens, completion_tokens, total_tokens}.
nlohmann::json Usage(const lede::v1::GenerationSummary& summary);
// llama.cpp's timings {prompt_n, prompt_ms, prompt_per_token_ms,
// prompt_per_second, predicted_n, predicted_ms, predicted_per_token_ms,
// predicted_per_second, draft_n, draft_n_accepted}: prompt_ms is the prefill
// including the first token (time to first token), predicted_n every
// completion token, predicted_ms the decode time after the first token and
// predicted_per_second the summary's decode_tokens_per_second (tokens after
// the first / predicted_ms). draft_n and draft_n_accepted appear only when
// something was drafted, as in llama.cpp.
nlohmann::json Timings(const lede::v1::GenerationSummary& summary);
// LEDE's own statistics {request_id, method, rounds, drafted_tokens,
// accepted_tokens, acceptance_rate, mean_exit_layer, mean_draft_length,
// tokens_per_round, policy_version}.
nlohmann::json LedeStats(const lede::v1::GenerationSummary& summary, const Request& request);

// Identity of one response: id ("cmpl-..." / "chatcmpl-..."), created (Unix
// seconds) and the model name echoed back.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
};

// The non-streaming body: text_completion / chat.completion with one choice,
// usage, timings and lede.
nlohmann::json CompleteResponse(const Request& request, const ResponseMeta& meta,
                                const std::string& text, const lede::v1::GenerationSummary& summary);

// Streaming chunks (text_completion / chat.completion.chunk), each to be sent
// as SseEvent(chunk). FirstChunk: chat's {"delta": {"role": "assistant",
// "content": ""}} (null for completions, which have none). TextChunk: one
// delta of text. FinalChunk: empty delta / text with finish_reason, plus
// timings and lede. UsageChunk: choices [] and usage (only with
// include_usage). With include_usage every other chunk carries "usage": null,
// as OpenAI's do.
nlohmann::json FirstChunk(const Request& request, const ResponseMeta& meta);
nlohmann::json TextChunk(const Request& request, const ResponseMeta& meta, const std::string& text);
nlohmann::json FinalChunk(const Request& request, const ResponseMeta& meta,
                          const lede::v1::GenerationSummary& summary);
nlohmann::json UsageChunk(const Request& request, const ResponseMeta& meta,
                          const lede::v1::GenerationSummary& summary);

// "data: <json>\n\n" (compact JSON, UTF-8; invalid bytes replaced by U+FFFD).
std::string SseEvent(const nlohmann::json& data);
// "data: [DONE]\n\n".
inline constexpr char kSseDone[] = "data: [DONE]\n\n";

// Compact JSON text (invalid UTF-8 replaced), for response bodies.
std::string Dump(const nlohmann::json& j);

}  // namespace lede::coordinator::openai

#endif  // LEDE_SERVICES_COORDINATOR_OPENAI_API_H_
