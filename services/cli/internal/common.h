// File: services/cli/internal/common.h
//
// What the subcommands of the `lede` command line share (generate.cc,
// calibrate.cc, tokenize.cc, widen.cc, export.cc): the exit codes, the
// model-loading flags, the one-line error, and the chat prompt of one user
// turn. Not API: only services/cli includes it.
#ifndef LEDE_SERVICES_CLI_INTERNAL_COMMON_H_
#define LEDE_SERVICES_CLI_INTERNAL_COMMON_H_

#include <ostream>
#include <string>

#include "shared/flags/flags.h"
#include "shared/flags/model_flags.h"
#include "shared/model/llama.h"
#include "shared/model/loaders/load_or_exit.h"
#include "shared/status/status.h"

namespace lede::cli::internal {

// The exit codes of every subcommand (commands.h).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// Flags shared by the subcommands that load a model: the model-loading
// group (shared/flags/model_flags.h), every flag of it.
struct ModelFlags : flags::ModelLoadFlags {
  void AddTo(flags::FlagSet& flags) { flags::AddModelLoadFlags(&flags, this); }

  // The load options, after --threads is set on this thread.
  // Errors: kNotFound naming --model for a path that does not exist;
  // kInvalidArgument naming the flag for a bad --device, --dtype,
  // --kernels, --graphs, --weights or --threads value.
  StatusOr<model::ModelOptions> Options() const;
};

// Prints "lede: <one-line message of s>" to `err`; returns `code`.
int Fail(std::ostream& err, const Status& s, int code);

// Exit code for a model or tokenizer that will not load: always
// model::loaders::kExitLoadFailure (2), whatever the status code (a refused file
// may surface as kInternal from libtorch; load_or_exit.h).
int LoadFailureCode(const Status& s);

// The chat prompt for one user turn (after an optional system turn, none
// when `system` is empty), rendered with the checkpoint's template: the
// GGUF file's own (tokenizer.chat_template) when `tokenizer_path` is a
// .gguf, else tokenizer_config.json beside it, or `template_path` if given.
// Errors: kNotFound (with a hint to pass --chat-template) when the
// checkpoint has no template and none is given; the template's load or
// render error otherwise.
StatusOr<std::string> RenderChatPrompt(const std::string& tokenizer_path, const std::string& template_path,
                                       const std::string& system, const std::string& user,
                                       bool add_generation_prompt);

}  // namespace lede::cli::internal

#endif  // LEDE_SERVICES_CLI_INTERNAL_COMMON_H_
