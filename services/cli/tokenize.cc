// `lede tokenize` (commands.h): a text's token ids as a JSON list, or ids'
// text with --decode.
#include "services/cli/commands.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "services/cli/internal/common.h"
#include "shared/flags/flags.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"

namespace lede::cli {

using flags::FlagSet;
using internal::Fail;
using internal::kExitOk;
using internal::kExitUsage;
using internal::LoadFailureCode;
using internal::RenderChatPrompt;

int RunTokenize(const std::vector<std::string>& raw_args, std::ostream& out, std::ostream& err) {
  std::string model, tokenizer_path, template_path, system, text;
  bool chat = false, decode = false, show_prompt = false, no_generation_prompt = false;
  std::string bos = "auto";
  FlagSet flags;
  flags.Add("model", &model, "checkpoint directory (its tokenizer is used)");
  flags.Add("tokenizer", &tokenizer_path, "tokenizer file (tokenizer.json, .model, .bin); overrides --model");
  flags.Add("text", &text, "the text (or give it as the last argument)");
  flags.Add("chat", &chat, "TEXT is a user message: render the chat template, then tokenize (no extra BOS)");
  flags.Add("system", &system, "--chat: a system message before the user message");
  flags.Add("chat-template", &template_path, "--chat: Jinja template file (default: tokenizer_config.json's)");
  flags.Add("no-generation-prompt", &no_generation_prompt, "--chat: leave out the assistant header");
  flags.Add("show-prompt", &show_prompt, "--chat: print the rendered prompt to stderr");
  flags.Add("bos", &bos, "auto (what the tokenizer's files ask for), true or false");
  flags.Add("decode", &decode, "TEXT is a JSON list of ids: print their text");
  if (flags::WantsHelp(raw_args)) {
    out << "usage: lede tokenize (--model DIR | --tokenizer FILE) [--chat] [--decode] TEXT\n"
           "prints the ids as a JSON list (or, with --decode, the text)\nflags:\n"
        << flags.Usage();
    return kExitOk;
  }
  // A trailing argument that is not a flag's value is TEXT.
  static const std::vector<std::string> kValueFlags = {"--model", "--tokenizer", "--text", "--system",
                                                        "--chat-template", "--bos"};
  std::vector<std::string> args;
  std::string positional;
  int n_positional = 0;
  for (size_t i = 0; i < raw_args.size(); ++i) {
    const std::string& a = raw_args[i];
    if (a.rfind("--", 0) == 0) {
      args.push_back(a);
      if (std::find(kValueFlags.begin(), kValueFlags.end(), a) != kValueFlags.end() && i + 1 < raw_args.size()) {
        args.push_back(raw_args[++i]);
      }
    } else {
      positional = a;
      ++n_positional;
    }
  }
  if (Status s = flags.Parse(args); !s.ok()) {
    err << "lede tokenize: " << s.message() << " (see lede tokenize --help)\n";
    return kExitUsage;
  }
  if (n_positional > 1 || (n_positional == 1 && !text.empty())) {
    return Fail(err, InvalidArgumentError("give TEXT once (as --text or as the last argument)"), kExitUsage);
  }
  if (n_positional == 1) text = positional;
  if (model.empty() && tokenizer_path.empty()) {
    return Fail(err, InvalidArgumentError("--model or --tokenizer is required"), kExitUsage);
  }
  if (bos != "auto" && bos != "true" && bos != "false") {
    return Fail(err, InvalidArgumentError("--bos: want auto, true or false, got '" + bos + "'"), kExitUsage);
  }
  auto path = tokenizer::ResolveTokenizerFile(model, tokenizer_path);
  if (!path.ok()) return Fail(err, path.status(), kExitUsage);
  auto tok = tokenizer::LoadTokenizer(*path);
  if (!tok.ok()) return Fail(err, tok.status(), LoadFailureCode(tok.status()));

  if (decode) {
    std::vector<int32_t> ids;
    try {
      ids = nlohmann::json::parse(text).get<std::vector<int32_t>>();
    } catch (const std::exception&) {
      return Fail(err, InvalidArgumentError("--decode: TEXT must be a JSON list of token ids"), kExitUsage);
    }
    for (int32_t id : ids) {
      if (id < 0 || id >= (*tok)->vocab_size()) {
        return Fail(err, InvalidArgumentError("--decode: id " + std::to_string(id) + " is outside [0, " +
                                              std::to_string((*tok)->vocab_size()) + ")"),
                    kExitUsage);
      }
    }
    out << (*tok)->Decode(ids) << "\n";
    return kExitOk;
  }

  bool add_bos = bos == "auto" ? (*tok)->DefaultAddBos() : bos == "true";
  std::string input = text;
  if (chat) {
    auto rendered = RenderChatPrompt(*path, template_path, system, text, !no_generation_prompt);
    if (!rendered.ok()) return Fail(err, rendered.status(), kExitUsage);
    if (show_prompt) err << *rendered << "\n";
    input = *rendered;
    if (bos == "auto") add_bos = false;  // the template writes bos_token itself
  }
  auto ids = (*tok)->Encode(input, add_bos, false);
  if (!ids.ok()) return Fail(err, InvalidArgumentError("TEXT: " + std::string(ids.status().message())), kExitUsage);
  out << nlohmann::json(*ids).dump() << "\n";
  return kExitOk;
}

}  // namespace lede::cli
