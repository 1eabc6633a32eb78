// The state checkpoint and the decision names of trainer/retrain.h.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "shared/file/file.h"
#include "trainer/retrain.h"

namespace lede::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kStateFormat[] = "lede-retrain-state-v1";

}  // namespace

const char* RetrainDecisionName(RetrainDecision decision) {
  switch (decision) {
    case RetrainDecision::kNoNewData:
      return "no_new_data";
    case RetrainDecision::kPublished:
      return "published";
    case RetrainDecision::kRejected:
      return "rejected";
  }
  return "unknown";
}

StatusOr<RetrainState> ReadRetrainState(const std::string& path) {
  RetrainState state;
  std::error_code ec;
  if (!fs::exists(path, ec)) return state;
  StatusOr<std::string> text = file::ReadFile(path);
  if (!text.ok()) return InternalError("retrain state " + path + ": " + std::string(text.status().message()));
  const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgumentError("retrain state " + path + ": not a JSON object");
  if (j.value("format", std::string()) != kStateFormat) {
    return InvalidArgumentError("retrain state " + path + ": format is not " + std::string(kStateFormat));
  }
  try {
    for (const json& k : j.value("processed_shards", json::array())) state.processed_shards.insert(k.get<std::string>());
    state.last_version = j.value("last_version", std::string());
    state.last_decision = j.value("last_decision", std::string());
    state.last_run_utc = j.value("last_run_utc", std::string());
    state.runs = j.value("runs", int64_t{0});
    state.published = j.value("published", int64_t{0});
  } catch (const json::exception& e) {
    return InvalidArgumentError("retrain state " + path + ": " + e.what());
  }
  return state;
}

Status WriteRetrainState(const std::string& path, const RetrainState& state) {
  json j = {{"format", kStateFormat},
            {"processed_shards", state.processed_shards},
            {"last_version", state.last_version},
            {"last_decision", state.last_decision},
            {"last_run_utc", state.last_run_utc},
            {"runs", state.runs},
            {"published", state.published}};
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  return file::WriteFileAtomically(path, j.dump(2) + "\n");
}

}  // namespace lede::trainer
