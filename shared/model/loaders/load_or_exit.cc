// File: shared/model/loaders/load_or_exit.cc
//
// The mains' "load or exit 2" (contract in load_or_exit.h).
#include "shared/model/loaders/load_or_exit.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace lede::model::loaders {

std::string OneLineMessage(const Status& status) {
  std::string out;
  for (char ch : status.message()) {
    if (ch == '\n' || ch == '\r') break;
    out.push_back(static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f ? ' ' : ch);
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

void ExitLoadFailure(const std::string& program, const Status& status) {
  const std::string line = program + ": " + OneLineMessage(status) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  std::exit(kExitLoadFailure);
}

std::unique_ptr<LlamaModel> LoadModelOrExit(const std::string& program, const std::string& path,
                                            const ModelOptions& options) {
  StatusOr<std::unique_ptr<LlamaModel>> loaded = LlamaModel::Load(path, options);
  if (!loaded.ok()) ExitLoadFailure(program, loaded.status());
  return std::move(*loaded);
}

Checkpoint LoadCheckpointOrExit(const std::string& program, const std::string& path,
                                const CheckpointReadOptions& read) {
  StatusOr<Checkpoint> loaded = LoadCheckpoint(path, read);
  if (!loaded.ok()) ExitLoadFailure(program, loaded.status());
  return std::move(*loaded);
}

}  // namespace lede::model::loaders
