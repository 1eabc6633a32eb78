#include "services/coordinator/openai_api.h"

#include "shared/speculation/method_proto.h"
#include "shared/status/status_macros.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <set>

namespace lede::coordinator::openai {
namespace {

using nlohmann::json;

Status Bad(const std::string& param, const std::string& reason) {
  return InvalidArgumentError(param + ": " + reason);
}

// A SAX pass over the body that builds nothing: it stops at the first value
// nested deeper than kMaxJsonDepth and remembers the top-level field it lies
// in. nlohmann's SAX parser keeps its own state on the heap (no recursion),
// so this pass bounds the recursion of everything after it (the DOM's copies,
// dump(), the field parsers) whatever the client sends.
class NestingLimit final : public nlohmann::json_sax<json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return Open(); }
  bool key(string_t& k) override {
    if (depth_ == 1) field_ = k;
    return true;
  }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

  bool exceeded() const { return exceeded_; }
  const std::string& field() const { return field_; }

 private:
  bool Open() {
    if (++depth_ > kMaxJsonDepth) exceeded_ = true;
    return !exceeded_;
  }
  bool Close() {
    --depth_;
    return true;
  }
  int depth_ = 0;
  bool exceeded_ = false;
  std::string field_;  // the top-level key being parsed
};

// Errors: kInvalidArgument "<field>: nested deeper than N levels" (the
// top-level field the deep value lies in; "body" when the body itself is).
Status CheckNesting(const std::string& body) {
  NestingLimit limit;
  (void)json::sax_parse(body, &limit, json::input_format_t::json, /*strict=*/true);
  if (!limit.exceeded()) return OkStatus();  // (a syntax error is reported by the DOM parse)
  const std::string field = limit.field().empty() ? "body" : limit.field();
  return Bad(field, "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
}

// An integer field saturated into int32 (the proto's type); the coordinator
// then rejects what is out of its range with the right message.
StatusOr<int32_t> Int32Field(const json& v, const std::string& param) {
  if (!v.is_number_integer()) return Bad(param, "must be an integer");
  if (v.is_number_unsigned()) {
    return static_cast<int32_t>(std::min<uint64_t>(v.get<uint64_t>(), std::numeric_limits<int32_t>::max()));
  }
  const int64_t x = v.get<int64_t>();
  return static_cast<int32_t>(std::clamp<int64_t>(x, std::numeric_limits<int32_t>::min(),
                                                  std::numeric_limits<int32_t>::max()));
}

StatusOr<float> FloatField(const json& v, const std::string& param) {
  if (!v.is_number()) return Bad(param, "must be a number");
  return static_cast<float>(v.get<double>());  // huge values become inf: "must be finite"
}

StatusOr<bool> BoolField(const json& v, const std::string& param) {
  if (v.is_null()) return false;
  if (!v.is_boolean()) return Bad(param, "must be a boolean");
  return v.get<bool>();
}

Status ParsePrompt(const json& p, lede::v1::GenerateRequest* g) {
  if (p.is_string()) {
    g->set_prompt(p.get<std::string>());
    return OkStatus();
  }
  if (!p.is_array()) return Bad("prompt", "must be a string, a list of strings or a list of token ids");
  if (p.empty()) return Bad("prompt", "empty");
  const json* ids = &p;  // a list of token ids, or [[ids]]: one prompt of ids
  if (p[0].is_string() || p[0].is_array()) {
    if (p.size() > 1) return Bad("prompt", "one prompt per request (got " + std::to_string(p.size()) + ")");
    if (p[0].is_string()) {
      g->set_prompt(p[0].get<std::string>());
      return OkStatus();
    }
    ids = &p[0];  // OpenAI's list of token-id lists; no deeper nesting is a prompt
    if (ids->empty()) return Bad("prompt", "empty");
  }
  for (size_t i = 0; i < ids->size(); ++i) {
    StatusOr<int32_t> id = Int32Field((*ids)[i], "prompt[" + std::to_string(i) + "]");
    if (!id.ok()) return Bad("prompt", "must be a string, a list of strings or a list of token ids");
    g->add_prompt_token_ids(*id);
  }
  return OkStatus();
}

StatusOr<std::vector<ChatMessage>> ParseMessages(const json& m) {
  if (!m.is_array()) return Bad("messages", "must be a list of messages");
  if (m.empty()) return Bad("messages", "empty");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m[i].is_object()) return Bad(at, "must be an object with role and content");
    ChatMessage msg;
    auto role = m[i].find("role");
    if (role == m[i].end() || !role->is_string() || role->get<std::string>().empty()) {
      return Bad(at + ".role", "must be a non-empty string");
    }
    msg.role = role->get<std::string>();
    auto content = m[i].find("content");
    if (content == m[i].end() || content->is_null()) {
      // An assistant message may carry only tool calls; we render it empty.
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t j = 0; j < content->size(); ++j) {
        const json& part = (*content)[j];
        const std::string pat = at + ".content[" + std::to_string(j) + "]";
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return Bad(pat, "only {\"type\": \"text\", \"text\": ...} parts are supported");
        }
        msg.content += part["text"].get<std::string>();
      }
    } else {
      return Bad(at + ".content", "must be a string, a list of text parts or null");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

Status ParseSpeculation(const json& s, lede::v1::GenerateRequest* g) {
  if (s.is_null()) return OkStatus();
  if (!s.is_object()) return Bad("speculation", "must be an object");
  if (auto it = s.find("method"); it != s.end() && !it->is_null()) {
    if (!it->is_string()) return Bad("speculation.method", "must be a string");
    const std::string m = it->get<std::string>();
    lede::v1::SpeculationMethod method;
    if (!speculation::ParseSpeculationMethodName(m, &method)) {
      return Bad("speculation.method",
                 "unknown method '" + m + "' (lede, static, threshold or autoregressive)");
    }
    g->set_method(method);
  }
  lede::v1::SpeculationParams* sp = g->mutable_speculation();
  for (const char* key : {"exit_layer", "draft_length"}) {
    auto it = s.find(key);
    if (it == s.end() || it->is_null()) continue;
    StatusOr<int32_t> v = Int32Field(*it, std::string("speculation.") + key);
    if (!v.ok()) return v.status();
    if (std::string(key) == "exit_layer") sp->set_exit_layer(*v); else sp->set_draft_length(*v);
  }
  for (const char* key : {"threshold", "epsilon"}) {
    auto it = s.find(key);
    if (it == s.end() || it->is_null()) continue;
    StatusOr<float> v = FloatField(*it, std::string("speculation.") + key);
    if (!v.ok()) return v.status();
    if (std::string(key) == "threshold") sp->set_threshold(*v); else sp->set_epsilon(*v);
  }
  return OkStatus();
}

// The field a coordinator / parser message names: its prefix before ": ",
// when that looks like a field path.
std::string FieldOf(const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos || colon == 0) return "";
  const std::string f = message.substr(0, colon);
  for (char c : f) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '[' || c == ']')) return "";
  }
  return std::string(f);
}

json Base(const Request& r, const ResponseMeta& meta, bool chunk) {
  json j;
  j["id"] = meta.id;
  j["object"] = r.endpoint == Endpoint::kChatCompletions ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                         : "text_completion";
  j["created"] = meta.created;
  j["model"] = meta.model;
  return j;
}

json Choice(const Request& r, const std::string& text, const json& finish_reason, bool chunk) {
  json c;
  c["index"] = 0;
  if (r.endpoint == Endpoint::kChatCompletions) {
    if (chunk) {
      c["delta"] = text.empty() && !finish_reason.is_null() ? json::object() : json{{"content", text}};
    } else {
      c["message"] = {{"role", "assistant"}, {"content", text}};
    }
  } else {
    c["text"] = text;
  }
  c["logprobs"] = nullptr;
  c["finish_reason"] = finish_reason;
  return c;
}

void NullUsage(const Request& r, json* chunk) {
  if (r.include_usage) (*chunk)["usage"] = nullptr;
}

// "model", and "messages" rendered by the chat template (chat) or "prompt" (completions).
Status ParseInput(const json& j, bool chat, const ChatPromptRenderer& render_chat, Request* req) {
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return Bad("model", "must be a string");
    req->model = it->get<std::string>();
  }
  if (chat) {
    auto it = j.find("messages");
    if (it == j.end()) return Bad("messages", "required");
    StatusOr<std::vector<ChatMessage>> messages = ParseMessages(*it);
    if (!messages.ok()) return messages.status();
    StatusOr<std::string> prompt = render_chat(*messages);
    if (!prompt.ok()) return prompt.status();
    req->generate.set_prompt(*prompt);
  } else {
    auto it = j.find("prompt");
    if (it == j.end() || it->is_null()) return Bad("prompt", "required");
    return ParsePrompt(*it, &req->generate);
  }

  return OkStatus();
}

// The token limit: max_completion_tokens (chat) wins over max_tokens; none means up to the context window (chat) or kDefaultCompletionMaxTokens.
Status ParseTokenLimit(const json& j, bool chat, Request* req) {
  lede::v1::GenerateRequest& g = req->generate;
  bool have_limit = false;
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    if (!chat && std::string(key) == "max_completion_tokens") continue;
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    StatusOr<int32_t> v = Int32Field(*it, key);
    if (!v.ok()) return v.status();
    g.set_max_new_tokens(*v);
    req->max_tokens_param = key;
    have_limit = true;
    break;
  }
  if (!have_limit) {
    if (chat) {
      req->fill_max_tokens = true;  // up to the context window
    } else {
      g.set_max_new_tokens(kDefaultCompletionMaxTokens);
    }
  }
  return OkStatus();
}

// "temperature", "top_p", "seed", "stop".
Status ParseSampling(const json& j, lede::v1::GenerateRequest* request) {
  lede::v1::GenerateRequest& g = *request;
  if (auto it = j.find("temperature"); it != j.end() && !it->is_null()) {
    StatusOr<float> v = FloatField(*it, "temperature");
    if (!v.ok()) return v.status();
    g.set_temperature(*v);
  }
  if (auto it = j.find("top_p"); it != j.end() && !it->is_null()) {
    StatusOr<float> v = FloatField(*it, "top_p");
    if (!v.ok()) return v.status();
    if (*v == 0.0f) return Bad("top_p", "must be in (0, 1]");  // the proto reads 0 as 1
    g.set_top_p(*v);
  }
  if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) return Bad("seed", "must be an integer");
    g.set_seed(it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>()));
  }
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      g.add_stop(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 4) return Bad("stop", "at most 4 stop sequences");
      for (const json& s : *it) {
        if (!s.is_string()) return Bad("stop", "must be a string or a list of strings");
        g.add_stop(s.get<std::string>());
      }
    } else {
      return Bad("stop", "must be a string or a list of strings");
    }
  }
  return OkStatus();
}

// "stream" and "stream_options".
Status ParseStreaming(const json& j, Request* req) {
  if (auto it = j.find("stream"); it != j.end()) {
    StatusOr<bool> v = BoolField(*it, "stream");
    if (!v.ok()) return v.status();
    req->stream = *v;
  }
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Bad("stream_options", "must be an object");
    if (auto u = it->find("include_usage"); u != it->end()) {
      StatusOr<bool> v = BoolField(*u, "stream_options.include_usage");
      if (!v.ok()) return v.status();
      req->include_usage = *v;
    }
  }
  return OkStatus();
}

// Fields accepted only at their no-op values: n, best_of (1), echo, logprobs, top_logprobs (off).
Status RejectUnsupported(const json& j) {
  for (const char* key : {"n", "best_of"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() != 1) return Bad(key, "only 1 is supported");
  }
  if (auto it = j.find("echo"); it != j.end() && !it->is_null() && *it != false) {
    return Bad("echo", "not supported");
  }
  for (const char* key : {"logprobs", "top_logprobs"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null() || *it == false || *it == 0) continue;
    return Bad(key, "not supported");
  }
  return OkStatus();
}

}  // namespace

StatusOr<Request> ParseRequest(Endpoint endpoint, const std::string& body,
                               const ChatPromptRenderer& render_chat, uint64_t random_seed) {
  LEDE_RETURN_IF_ERROR(CheckNesting(body));
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError("body: not valid JSON (UTF-8)");
  if (!j.is_object()) return InvalidArgumentError("body: must be a JSON object");
  Request r;
  r.endpoint = endpoint;
  const bool chat = endpoint == Endpoint::kChatCompletions;
  lede::v1::GenerateRequest& g = r.generate;
  g.set_temperature(1.0f);  // OpenAI's defaults
  g.set_top_p(1.0f);
  g.set_seed(random_seed);
  g.set_method(lede::v1::SPECULATION_METHOD_LEDE);

  static const std::set<std::string> kCommon = {
      "model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options",
      "n", "user", "speculation", "logprobs", "best_of", "echo", "top_logprobs"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const bool known = kCommon.count(k) > 0 || (chat ? (k == "messages" || k == "max_completion_tokens")
                                                     : k == "prompt");
    if (!known) r.ignored_fields.push_back(k);
  }

  LEDE_RETURN_IF_ERROR(ParseInput(j, chat, render_chat, &r));
  LEDE_RETURN_IF_ERROR(ParseTokenLimit(j, chat, &r));
  LEDE_RETURN_IF_ERROR(ParseSampling(j, &g));
  LEDE_RETURN_IF_ERROR(ParseStreaming(j, &r));
  LEDE_RETURN_IF_ERROR(RejectUnsupported(j));
  if (auto it = j.find("speculation"); it != j.end()) {
    if (Status s = ParseSpeculation(*it, &g); !s.ok()) return s;
  }
  return r;
}

json ApiError::ToJson() const {
  json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return json{{"error", e}};
}

ApiError ToApiError(const Status& status, const Request* request) {
  ApiError e;
  e.message = std::string(status.message());
  switch (status.code()) {
    case StatusCode::kInvalidArgument: {
      e.http_status = 400;
      e.type = "invalid_request_error";
      const std::string field = FieldOf(e.message);
      const size_t cut = field.find_first_of("[.");
      const std::string root = field.substr(0, cut);
      const std::string rest = cut == std::string::npos ? "" : field.substr(cut);  // "[2]", ".role"
      const bool chat = request != nullptr && request->endpoint == Endpoint::kChatCompletions;
      std::string http_root = root;  // the request's name for the field
      if (root == "max_new_tokens") {
        http_root = request != nullptr ? request->max_tokens_param : "max_tokens";
      } else if (root == "prompt" || root == "prompt_token_ids") {
        http_root = chat ? "messages" : "prompt";
      } else if (root == "method") {
        http_root = "speculation.method";
      }
      if (root == "request_id" || root == "body" || field.empty()) {
        e.param = "";
      } else if (root == "stop" || http_root != root) {
        e.param = http_root;  // stop[1] → stop; prompt_token_ids[2] → prompt
      } else {
        e.param = field;
      }
      // The message names the field as the client spelled it.
      if (!field.empty() && http_root != root) {
        const std::string shown = (chat && http_root == "messages") ? http_root : http_root + rest;
        e.message = shown + e.message.substr(field.size());
      }
      break;
    }
    case StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "not_found_error";
      break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "unavailable_error";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

ApiError ModelNotFound(const std::string& model) {
  ApiError e;
  e.http_status = 404;
  e.type = "not_found_error";
  e.message = "The model '" + model + "' does not exist (see GET /v1/models)";
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

ApiError RouteNotFound(const std::string& method, const std::string& path) {
  ApiError e;
  e.http_status = 404;
  e.type = "not_found_error";
  e.message = "no route " + method + " " + path +
              " (POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics)";
  return e;
}

std::string FinishReason(const lede::v1::GenerationSummary& s) {
  return s.finish_reason() == lede::v1::FINISH_REASON_LENGTH ? "length" : "stop";
}

json Usage(const lede::v1::GenerationSummary& s) {
  return {{"prompt_tokens", s.prompt_tokens()},
          {"completion_tokens", s.generated_tokens()},
          {"total_tokens", s.prompt_tokens() + s.generated_tokens()}};
}

json Timings(const lede::v1::GenerationSummary& s) {
  const double prompt_ms = s.time_to_first_token_us() / 1000.0;
  const double predicted_ms = s.decode_time_us() / 1000.0;
  json t;
  t["prompt_n"] = s.prompt_tokens();
  t["prompt_ms"] = prompt_ms;
  t["prompt_per_token_ms"] = s.prompt_tokens() > 0 ? prompt_ms / s.prompt_tokens() : 0.0;
  t["prompt_per_second"] = prompt_ms > 0 ? 1000.0 * s.prompt_tokens() / prompt_ms : 0.0;
  t["predicted_n"] = s.generated_tokens();
  t["predicted_ms"] = predicted_ms;
  t["predicted_per_token_ms"] = s.decode_tokens_per_second() > 0 ? 1000.0 / s.decode_tokens_per_second() : 0.0;
  t["predicted_per_second"] = s.decode_tokens_per_second();
  if (s.drafted_tokens() > 0) {
    t["draft_n"] = s.drafted_tokens();
    t["draft_n_accepted"] = s.accepted_tokens();
  }
  return t;
}

json LedeStats(const lede::v1::GenerationSummary& s, const Request& r) {
  return {{"request_id", s.request_id()},
          {"method", speculation::SpeculationMethodName(r.generate.method())},
          {"rounds", s.rounds()},
          {"drafted_tokens", s.drafted_tokens()},
          {"accepted_tokens", s.accepted_tokens()},
          {"acceptance_rate", s.acceptance_rate()},
          {"mean_exit_layer", s.mean_exit_layer()},
          {"mean_draft_length", s.mean_draft_length()},
          {"tokens_per_round", s.tokens_per_round()},
          {"policy_version", s.policy_version()}};
}

json CompleteResponse(const Request& r, const ResponseMeta& meta, const std::string& text,
                      const lede::v1::GenerationSummary& s) {
  json j = Base(r, meta, /*chunk=*/false);
  j["choices"] = json::array({Choice(r, text, FinishReason(s), /*chunk=*/false)});
  j["usage"] = Usage(s);
  j["timings"] = Timings(s);
  j["lede"] = LedeStats(s, r);
  return j;
}

json FirstChunk(const Request& r, const ResponseMeta& meta) {
  if (r.endpoint != Endpoint::kChatCompletions) return nullptr;
  json j = Base(r, meta, /*chunk=*/true);
  json c = {{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
            {"finish_reason", nullptr}};
  j["choices"] = json::array({c});
  NullUsage(r, &j);
  return j;
}

json TextChunk(const Request& r, const ResponseMeta& meta, const std::string& text) {
  json j = Base(r, meta, /*chunk=*/true);
  j["choices"] = json::array({Choice(r, text, nullptr, /*chunk=*/true)});
  NullUsage(r, &j);
  return j;
}

json FinalChunk(const Request& r, const ResponseMeta& meta, const lede::v1::GenerationSummary& s) {
  json j = Base(r, meta, /*chunk=*/true);
  j["choices"] = json::array({Choice(r, "", FinishReason(s), /*chunk=*/true)});
  NullUsage(r, &j);
  j["timings"] = Timings(s);
  j["lede"] = LedeStats(s, r);
  return j;
}

json UsageChunk(const Request& r, const ResponseMeta& meta, const lede::v1::GenerationSummary& s) {
  json j = Base(r, meta, /*chunk=*/true);
  j["choices"] = json::array();
  j["usage"] = Usage(s);
  return j;
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string SseEvent(const json& data) { return "data: " + Dump(data) + "\n\n"; }

}  // namespace lede::coordinator::openai
