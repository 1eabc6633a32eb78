// Unit tests of services/coordinator/openai_api.h and chat_prompt.h: request
// JSON → GenerateRequest, the error envelope and its parameter names, and
// the response / SSE chunk shapes OpenAI clients parse.
#include "services/coordinator/openai_api.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/chat_prompt.h"
#include "services/coordinator/coordinator.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::coordinator::openai {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;
using nlohmann::json;

StatusOr<Request> Parse(Endpoint e, const json& body, uint64_t seed = 99) {
  return ParseRequest(e, body.dump(), RenderPlainChatPrompt, seed);
}

// The param an HTTP-side error names.
std::string ParamOf(Endpoint e, const std::string& body) {
  StatusOr<Request> r = ParseRequest(e, body, RenderPlainChatPrompt, 1);
  if (r.ok()) return "<ok>";
  return ToApiError(r.status(), nullptr).param;
}

// Every supported completion field lands in the GenerateRequest.
TEST(OpenAiParseTest, CompletionFieldsMapToGenerateRequest) {
  auto r = Parse(Endpoint::kCompletions,
                 {{"model", "lede-tiny"}, {"prompt", "Once"}, {"max_tokens", 7}, {"temperature", 0.5},
                  {"top_p", 0.9}, {"seed", 42}, {"stop", {"\n", "The"}}, {"stream", true},
                  {"stream_options", {{"include_usage", true}}}, {"n", 1}, {"user", "u"},
                  {"speculation", {{"method", "static"}, {"exit_layer", 3}, {"draft_length", 4}}},
                  {"frequency_penalty", 0}});
  ASSERT_THAT(r, IsOk());
  const lede::v1::GenerateRequest& g = r->generate;
  EXPECT_EQ(r->model, "lede-tiny");
  EXPECT_EQ(g.prompt(), "Once");
  EXPECT_EQ(g.max_new_tokens(), 7);
  EXPECT_FLOAT_EQ(g.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.top_p(), 0.9f);
  EXPECT_EQ(g.seed(), 42u);
  ASSERT_EQ(g.stop_size(), 2);
  EXPECT_EQ(g.stop(1), "The");
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(g.method(), lede::v1::SPECULATION_METHOD_STATIC);
  EXPECT_EQ(g.speculation().exit_layer(), 3);
  EXPECT_EQ(g.speculation().draft_length(), 4);
  EXPECT_THAT(r->ignored_fields, ::testing::ElementsAre("frequency_penalty"));
}

// OpenAI's defaults: temperature 1, top_p 1, 16 tokens for completions, the
// random seed, LEDE speculation; token-id prompts pass through.
TEST(OpenAiParseTest, DefaultsAndTokenPrompts) {
  auto r = Parse(Endpoint::kCompletions, {{"prompt", {1, 306, 4999999999LL}}}, /*seed=*/123);
  ASSERT_THAT(r, IsOk());
  EXPECT_FLOAT_EQ(r->generate.temperature(), 1.0f);
  EXPECT_FLOAT_EQ(r->generate.top_p(), 1.0f);
  EXPECT_EQ(r->generate.max_new_tokens(), kDefaultCompletionMaxTokens);
  EXPECT_EQ(r->generate.seed(), 123u);
  EXPECT_EQ(r->generate.method(), lede::v1::SPECULATION_METHOD_LEDE);
  ASSERT_EQ(r->generate.prompt_token_ids_size(), 3);
  EXPECT_EQ(r->generate.prompt_token_ids(2), 2147483647);  // saturated; the coordinator rejects it
  EXPECT_FALSE(r->fill_max_tokens);
}

// Chat messages are rendered by the renderer; max_completion_tokens wins over
// max_tokens; no limit means "up to the context window".
TEST(OpenAiParseTest, ChatMessagesAndTokenLimits) {
  json messages = {{{"role", "system"}, {"content", "Be brief."}},
                   {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi "}}, {{"type", "text"}, {"text", "there"}}}}}};
  auto r = Parse(Endpoint::kChatCompletions, {{"messages", messages}, {"max_tokens", 5}, {"max_completion_tokens", 9}});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->generate.prompt(), "System: Be brief.\nUser: Hi there\nAssistant:");
  EXPECT_EQ(r->generate.max_new_tokens(), 9);
  EXPECT_EQ(r->max_tokens_param, "max_completion_tokens");
  auto open = Parse(Endpoint::kChatCompletions, {{"messages", messages}});
  ASSERT_THAT(open, IsOk());
  EXPECT_TRUE(open->fill_max_tokens);
  EXPECT_EQ(open->generate.max_new_tokens(), 0);
}

// The plain chat format, golden.
TEST(ChatPromptTest, PlainFormat) {
  auto p = RenderPlainChatPrompt({{"developer", "Rules."}, {"user", "Hi"}, {"assistant", "Hello"}, {"tool", "42"}});
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(*p, "System: Rules.\nUser: Hi\nAssistant: Hello\nTool: 42\nAssistant:");
  auto cont = RenderPlainChatPrompt({{"user", "Hi"}, {"assistant", "Once"}});
  ASSERT_THAT(cont, IsOk());
  EXPECT_EQ(*cont, "User: Hi\nAssistant: Once");
  EXPECT_THAT(RenderPlainChatPrompt({}), StatusIs(StatusCode::kInvalidArgument));
}

// A checkpoint with a chat template is rendered with it (bos_token cut,
// since the tokenizer adds BOS; the assistant header unless the last turn is
// the assistant's); without one, or with a template that does not parse,
// the plain format is used and the reason given.
TEST(ChatPromptTest, CheckpointTemplateRendersTheChat) {
  lede::testing::TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string d = dir.path().string();
  std::string which;
  auto plain = ChatRendererFor(d, &which);
  EXPECT_THAT(which, HasSubstr("plain"));
  auto p = plain({{"user", "Hi"}});
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(*p, "User: Hi\nAssistant:");

  std::ofstream(dir.path() / "tokenizer_config.json") << R"({"bos_token": "<s>", "eos_token": "</s>",
    "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"})";
  auto render = ChatRendererFor(d, &which);
  EXPECT_THAT(which, HasSubstr("chat_template"));
  auto chat = render({{"system", "Be brief."}, {"user", "Hi"}});
  ASSERT_THAT(chat, IsOk());
  EXPECT_EQ(*chat, "[system]Be brief.</s>[user]Hi</s>[assistant]");
  auto cont = render({{"user", "Hi"}, {"assistant", "Once"}});
  ASSERT_THAT(cont, IsOk());
  EXPECT_EQ(*cont, "[user]Hi</s>[assistant]Once</s>");
  EXPECT_THAT(render({}), StatusIs(StatusCode::kInvalidArgument));

  // A template that raises is INVALID_ARGUMENT naming messages.
  std::ofstream(dir.path() / "chat_template.jinja") << "{{ raise_exception('roles must alternate') }}";
  auto raising = ChatRendererFor(d, &which);
  EXPECT_THAT(raising({{"user", "Hi"}}), StatusIs(StatusCode::kInvalidArgument));
  // One outside the subset falls back to the plain format, with the reason.
  std::ofstream(dir.path() / "chat_template.jinja") << "{% macro m() %}x{% endmacro %}{{ m() }}";
  auto fallback = ChatRendererFor(d, &which);
  EXPECT_THAT(which, HasSubstr("does not load"));
  auto f = fallback({{"user", "Hi"}});
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(*f, "User: Hi\nAssistant:");
}

// A checkpoint's chat template is found in tokenizer_config.json or
// chat_template.jinja; a config without one, or no directory, has none.
TEST(ChatPromptTest, FindsCheckpointChatTemplates) {
  lede::testing::TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string d = dir.path().string();
  EXPECT_FALSE(HasChatTemplate(d));
  std::ofstream(dir.path() / "tokenizer_config.json") << R"({"bos_token": "<s>"})";
  EXPECT_FALSE(HasChatTemplate(d));
  std::ofstream(dir.path() / "tokenizer_config.json") << R"({"chat_template": "{{ messages }}"})";
  EXPECT_TRUE(HasChatTemplate(d));
  std::filesystem::remove(dir.path() / "tokenizer_config.json");
  std::ofstream(dir.path() / "chat_template.jinja") << "{{ messages }}";
  EXPECT_TRUE(HasChatTemplate(d));
  EXPECT_FALSE(HasChatTemplate(d + "/missing"));
  EXPECT_FALSE(HasChatTemplate(std::string(LEDE_SOURCE_DIR) + "/models/lede-tiny"));
}

// Errors found by the HTTP layer name the request's parameter.
TEST(OpenAiParseTest, HttpErrorsNameTheParam) {
  using E = Endpoint;
  EXPECT_EQ(ParamOf(E::kCompletions, "{not json"), "");
  EXPECT_EQ(ParamOf(E::kCompletions, "[1]"), "");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({})"), "prompt");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": ["a", "b"]})"), "prompt");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": 5})"), "prompt");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "n": 2})"), "n");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "best_of": 3})"), "best_of");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "echo": true})"), "echo");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "logprobs": 2})"), "logprobs");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "max_tokens": "8"})"), "max_tokens");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "max_tokens": 1.5})"), "max_tokens");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "temperature": "hot"})"), "temperature");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "top_p": 0})"), "top_p");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "seed": 1.5})"), "seed");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "stop": 3})"), "stop");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "stop": ["a","b","c","d","e"]})"), "stop");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "stream": "yes"})"), "stream");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "stream_options": 1})"), "stream_options");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "model": 7})"), "model");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "speculation": {"method": "magic"}})"),
            "speculation.method");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "speculation": {"exit_layer": "x"}})"),
            "speculation.exit_layer");
  EXPECT_EQ(ParamOf(E::kCompletions, R"({"prompt": "a", "speculation": {"threshold": "x"}})"),
            "speculation.threshold");
  EXPECT_EQ(ParamOf(E::kChatCompletions, R"({})"), "messages");
  EXPECT_EQ(ParamOf(E::kChatCompletions, R"({"messages": []})"), "messages");
  EXPECT_EQ(ParamOf(E::kChatCompletions, R"({"messages": [{"role": "user", "content": "a"}, {"content": "b"}]})"),
            "messages[1].role");
  EXPECT_EQ(ParamOf(E::kChatCompletions, R"({"messages": [{"role": "user", "content": 3}]})"),
            "messages[0].content");
  EXPECT_EQ(ParamOf(E::kChatCompletions,
                    R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
            "messages[0].content[0]");
  EXPECT_EQ(ParamOf(E::kChatCompletions, R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})"),
            "top_logprobs");
}

// Issue 39, fault 1: a value nested far deeper than any request needs, in
// any field of either endpoint (known, ignored, or the body itself), is a
// 400 naming that field, never a crash (37,000 levels used to overflow the
// coordinator's stack). Just under the limit, the field's own check speaks.
TEST(OpenAiParseTest, DeepNestingInEveryFieldIsRefusedNamingIt) {
  auto nested = [](int depth, const std::string& leaf) {
    return std::string(depth, '[') + leaf + std::string(depth, ']');
  };
  for (const Endpoint e : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    const bool chat = e == Endpoint::kChatCompletions;
    const std::string input = chat ? R"("messages": [{"role": "user", "content": "hi"}])" : R"("prompt": "Once")";
    std::vector<std::string> fields = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream",
                                       "stream_options", "n", "user", "speculation", "logprobs", "best_of",
                                       "echo", "top_logprobs", "an_ignored_field"};
    fields.push_back(chat ? "messages" : "prompt");
    if (chat) fields.push_back("max_completion_tokens");
    for (const std::string& field : fields) {
      for (const int depth : {kMaxJsonDepth + 1, 200000}) {
        const std::string deep = "\"" + field + "\": " + nested(depth, "1");
        const std::string body = "{" + (field == "prompt" || field == "messages" ? deep : input + ", " + deep) + "}";
        StatusOr<Request> r = ParseRequest(e, body, RenderPlainChatPrompt, 1);
        ASSERT_FALSE(r.ok()) << field << " at depth " << depth;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
        EXPECT_THAT(std::string(r.status().message()), HasSubstr("nested deeper than"));
        const ApiError err = ToApiError(r.status(), nullptr);
        EXPECT_EQ(err.http_status, 400);
        EXPECT_EQ(err.param, field == "prompt" && chat ? "messages" : field) << "depth " << depth;
      }
    }
    // The body itself, and nesting inside an object.
    EXPECT_THAT(ParseRequest(e, nested(100000, ""), RenderPlainChatPrompt, 1),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("body: nested deeper")));
    std::string objects = "{" + input + R"(, "speculation": )";
    for (int i = 0; i < 5000; ++i) objects += R"({"a": )";
    objects += "1" + std::string(5000, '}') + "}";
    EXPECT_THAT(ParseRequest(e, objects, RenderPlainChatPrompt, 1),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("speculation: nested deeper")));
  }
  // Within the limit a deep prompt is still no prompt: a list of token-id
  // lists is the deepest OpenAI accepts.
  EXPECT_EQ(ParamOf(Endpoint::kCompletions, R"({"prompt": )" + nested(kMaxJsonDepth - 1, "1") + "}"), "prompt");
  auto ok = ParseRequest(Endpoint::kCompletions, R"({"prompt": [[5, 6, 7]]})", RenderPlainChatPrompt, 1);
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ(ok->generate.prompt_token_ids_size(), 3);
}

// The coordinator's validation messages map to HTTP parameter names and
// status codes.
TEST(OpenAiErrorTest, CoordinatorErrorsMapToParamsAndStatuses) {
  auto completion = Parse(Endpoint::kCompletions, {{"prompt", "a"}});
  auto chat = Parse(Endpoint::kChatCompletions,
                    {{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"max_completion_tokens", 0}});
  ASSERT_THAT(completion, IsOk());
  ASSERT_THAT(chat, IsOk());
  auto param = [](const std::string& msg, const Request& r) {
    return ToApiError(InvalidArgumentError(msg), &r).param;
  };
  EXPECT_EQ(param("max_new_tokens: must be in [1, 256], got 0", *completion), "max_tokens");
  EXPECT_EQ(param("max_new_tokens: must be in [1, 256], got 0", *chat), "max_completion_tokens");
  EXPECT_EQ(param("prompt: empty", *completion), "prompt");
  EXPECT_EQ(param("prompt: 9 tokens + max_new_tokens 300 exceed the context window", *chat), "messages");
  EXPECT_EQ(param("prompt_token_ids[2]: 70000 outside [0, 4096)", *completion), "prompt");
  EXPECT_EQ(param("stop[1]: empty or invalid UTF-8", *completion), "stop");
  EXPECT_EQ(param("method: unknown speculation method 9", *completion), "speculation.method");
  EXPECT_EQ(param("temperature: must be a finite number >= 0", *completion), "temperature");
  EXPECT_EQ(param("top_p: must be in (0, 1]", *completion), "top_p");
  EXPECT_EQ(param("speculation.exit_layer: 0 outside [1, 12]", *completion), "speculation.exit_layer");
  EXPECT_EQ(param("speculation.epsilon: must be in [0, 1]", *completion), "speculation.epsilon");

  // Messages spell the field as the request did.
  EXPECT_EQ(ToApiError(InvalidArgumentError("max_new_tokens: must be in [1, 256], got 0"), &*chat).message,
            "max_completion_tokens: must be in [1, 256], got 0");
  EXPECT_EQ(ToApiError(InvalidArgumentError("prompt_token_ids[2]: 70000 outside [0, 4096)"), &*completion).message,
            "prompt[2]: 70000 outside [0, 4096)");
  EXPECT_EQ(ToApiError(InvalidArgumentError("method: unknown speculation method 9"), &*completion).message,
            "speculation.method: unknown speculation method 9");
  EXPECT_EQ(ToApiError(InvalidArgumentError("stop[1]: empty or invalid UTF-8"), &*completion).message,
            "stop[1]: empty or invalid UTF-8");

  ApiError bad = ToApiError(InvalidArgumentError("top_p: must be in (0, 1]"), &*completion);
  EXPECT_EQ(bad.http_status, 400);
  EXPECT_EQ(bad.ToJson(), json::parse(R"({"error": {"message": "top_p: must be in (0, 1]",
      "type": "invalid_request_error", "param": "top_p", "code": null}})"));
  EXPECT_EQ(ToApiError(Status(StatusCode::kResourceExhausted, "slots"), nullptr).http_status, 429);
  EXPECT_EQ(ToApiError(Status(StatusCode::kResourceExhausted, "slots"), nullptr).code, "rate_limit_exceeded");
  EXPECT_EQ(ToApiError(UnavailableError("verifier down"), nullptr).http_status, 503);
  EXPECT_EQ(ToApiError(NotFoundError("x"), nullptr).http_status, 404);
  EXPECT_EQ(ToApiError(InternalError("bug"), nullptr).http_status, 500);
  EXPECT_EQ(ToApiError(Status(StatusCode::kDeadlineExceeded, "slow"), nullptr).type, "server_error");
  EXPECT_EQ(ModelNotFound("gpt-4").ToJson()["error"]["code"], "model_not_found");
  EXPECT_EQ(ModelNotFound("gpt-4").http_status, 404);
}

lede::v1::GenerationSummary Summary() {
  lede::v1::GenerationSummary s;
  s.set_request_id("req-1");
  s.set_finish_reason(lede::v1::FINISH_REASON_LENGTH);
  s.set_prompt_tokens(5);
  s.set_generated_tokens(8);
  s.set_rounds(3);
  s.set_drafted_tokens(9);
  s.set_accepted_tokens(6);
  s.set_acceptance_rate(6.0 / 9);
  s.set_mean_exit_layer(4);
  s.set_mean_draft_length(3);
  s.set_tokens_per_round(7.0 / 3);
  s.set_time_to_first_token_us(2500);
  s.set_decode_time_us(20000);
  s.set_decode_tokens_per_second(350);
  s.set_policy_version("v1");
  return s;
}

// Non-streaming bodies carry one choice, usage, llama.cpp timings and lede.
TEST(OpenAiResponseTest, CompleteResponsesHaveUsageTimingsAndLede) {
  auto chat = Parse(Endpoint::kChatCompletions, {{"messages", {{{"role", "user"}, {"content", "a"}}}}});
  ASSERT_THAT(chat, IsOk());
  ResponseMeta meta{"chatcmpl-1", 1700000000, "lede-tiny"};
  json j = CompleteResponse(*chat, meta, "Hello", Summary());
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "lede-tiny");
  EXPECT_EQ(j["choices"][0]["message"], json({{"role", "assistant"}, {"content", "Hello"}}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", 5}, {"completion_tokens", 8}, {"total_tokens", 13}}));
  EXPECT_EQ(j["timings"]["prompt_n"], 5);
  EXPECT_DOUBLE_EQ(j["timings"]["prompt_ms"].get<double>(), 2.5);
  EXPECT_EQ(j["timings"]["predicted_n"], 8);
  EXPECT_DOUBLE_EQ(j["timings"]["predicted_ms"].get<double>(), 20.0);
  EXPECT_DOUBLE_EQ(j["timings"]["predicted_per_second"].get<double>(), 350.0);
  EXPECT_EQ(j["timings"]["draft_n"], 9);
  EXPECT_EQ(j["timings"]["draft_n_accepted"], 6);
  EXPECT_EQ(j["lede"]["rounds"], 3);
  EXPECT_EQ(j["lede"]["policy_version"], "v1");
  EXPECT_EQ(j["lede"]["method"], "lede");

  auto completion = Parse(Endpoint::kCompletions, {{"prompt", "a"}});
  ASSERT_THAT(completion, IsOk());
  lede::v1::GenerationSummary ar = Summary();
  ar.set_drafted_tokens(0);
  ar.set_finish_reason(lede::v1::FINISH_REASON_EOS);
  json c = CompleteResponse(*completion, {"cmpl-1", 1, "m"}, "x", ar);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "x");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(c["timings"].contains("draft_n"));  // only when something was drafted
}

// Streaming chunks: role first (chat), text deltas with finish_reason null,
// an empty final delta with the reason, then choices [] with usage.
TEST(OpenAiResponseTest, StreamChunksFollowOpenAi) {
  auto chat = Parse(Endpoint::kChatCompletions,
                    {{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"stream", true},
                     {"stream_options", {{"include_usage", true}}}});
  ASSERT_THAT(chat, IsOk());
  ResponseMeta meta{"chatcmpl-1", 1, "m"};
  json first = FirstChunk(*chat, meta);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(first["usage"].is_null());
  json text = TextChunk(*chat, meta, "Hi");
  EXPECT_EQ(text["choices"][0]["delta"], json({{"content", "Hi"}}));
  EXPECT_TRUE(text["choices"][0]["finish_reason"].is_null());
  json last = FinalChunk(*chat, meta, Summary());
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["timings"]["draft_n"], 9);
  json usage = UsageChunk(*chat, meta, Summary());
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 13);
  EXPECT_EQ(SseEvent(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");

  auto completion = Parse(Endpoint::kCompletions, {{"prompt", "a"}, {"stream", true}});
  ASSERT_THAT(completion, IsOk());
  EXPECT_TRUE(FirstChunk(*completion, meta).is_null());
  json ct = TextChunk(*completion, meta, "Hi");
  EXPECT_EQ(ct["object"], "text_completion");
  EXPECT_EQ(ct["choices"][0]["text"], "Hi");
  EXPECT_FALSE(ct.contains("usage"));  // only with include_usage
}

}  // namespace
}  // namespace lede::coordinator::openai
