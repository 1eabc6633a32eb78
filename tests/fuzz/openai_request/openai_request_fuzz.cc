// libFuzzer target: the OpenAI-compatible HTTP API's request parser
// (services/coordinator/openai_api.h, ParseRequest) and what the server does
// next with its result (ValidateRequest). The first input byte picks the
// endpoint (even: /v1/completions, odd: /v1/chat/completions); the rest is
// the request body. Parsing returns a Request or an INVALID_ARGUMENT status
// and never lets an exception (nlohmann::json) escape or crashes; an error
// renders as OpenAI's error envelope.
#include <cstdint>
#include <string>

#include "services/coordinator/chat_prompt.h"
#include "services/coordinator/openai_api.h"
#include "services/coordinator/request_validation.h"
#include "tests/fuzz/testing/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lede::fuzz::Check;
  namespace openai = lede::coordinator::openai;
  if (size == 0) return 0;
  const openai::Endpoint endpoint =
      (data[0] & 1) != 0 ? openai::Endpoint::kChatCompletions : openai::Endpoint::kCompletions;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  auto request = openai::ParseRequest(endpoint, body, lede::coordinator::RenderPlainChatPrompt, 1234);
  if (!request.ok()) {
    Check(request.status().code() == lede::StatusCode::kInvalidArgument, "a bad body is not INVALID_ARGUMENT");
    const openai::ApiError error = openai::ToApiError(request.status(), nullptr);
    Check(error.http_status == 400, "a bad body is not HTTP 400");
    (void)openai::Dump(error.ToJson());
    return 0;
  }
  Check(request->endpoint == endpoint, "endpoint changed");
  (void)lede::coordinator::ValidateRequest(request->generate, 4096, request->fill_max_tokens);
  return 0;
}
