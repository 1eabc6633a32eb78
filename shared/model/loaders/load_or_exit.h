// File: shared/model/loaders/load_or_exit.h
//
// How a program's main gives up on a model that will not load: one line on
// stderr naming the file and the field at fault, and exit status 2, the
// same in every binary (the CLI, the model service, the trainer and bench
// mains). Model files are untrusted input (docs/design.md §5): a refusal is
// a user-facing error, never a crash, an abort or a multi-line libtorch
// report.
//
// For mains only: a library returns the Status (LlamaModel::Load,
// LoadCheckpoint) and lets its caller decide.
//
// Example:
//   std::shared_ptr<const model::LlamaModel> m =
//       model::loaders::LoadModelOrExit("lede-eval-exits", flags.model, options);
#ifndef LEDE_SHARED_MODEL_LOADERS_LOAD_OR_EXIT_H_
#define LEDE_SHARED_MODEL_LOADERS_LOAD_OR_EXIT_H_

#include <memory>
#include <string>

#include "shared/model/loaders/checkpoint.h"
#include "shared/model/llama.h"
#include "shared/status/status.h"

namespace lede::model::loaders {

// Exit status of a process whose model (or another input file it needs to
// start) was missing or refused.
inline constexpr int kExitLoadFailure = 2;

// `status`'s message on one line: everything from its first line break on
// is dropped (libtorch messages append a C++ trace), other control
// characters become spaces. "" for an OK status.
std::string OneLineMessage(const Status& status);

// Prints "<program>: <OneLineMessage(status)>" and a newline to stderr and
// exits the process with kExitLoadFailure. Not thread-safe with respect to
// other threads still running (std::exit).
[[noreturn]] void ExitLoadFailure(const std::string& program, const Status& status);

// LlamaModel::Load(path, options), or ExitLoadFailure(program, error).
std::unique_ptr<LlamaModel> LoadModelOrExit(const std::string& program, const std::string& path,
                                            const ModelOptions& options);

// LoadCheckpoint(path, read), or ExitLoadFailure(program, error).
Checkpoint LoadCheckpointOrExit(const std::string& program, const std::string& path,
                                const CheckpointReadOptions& read = CheckpointReadOptions());

}  // namespace lede::model::loaders

#endif  // LEDE_SHARED_MODEL_LOADERS_LOAD_OR_EXIT_H_
