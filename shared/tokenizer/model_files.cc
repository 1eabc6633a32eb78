#include "shared/tokenizer/model_files.h"

#include <algorithm>
#include <filesystem>
#include <vector>

namespace lede::tokenizer {

StatusOr<std::string> FindTokenizerFile(const std::string& model_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // A GGUF file carries its own tokenizer (tokenizer.ggml.*).
  if (fs::path(model_path).extension() == ".gguf" && fs::is_regular_file(model_path, ec)) return model_path;
  fs::path dir = fs::is_directory(model_path, ec) ? fs::path(model_path)
                                                  : fs::path(model_path).parent_path();
  if (dir.empty()) dir = ".";
  if (fs::exists(dir / "tokenizer.json", ec)) return (dir / "tokenizer.json").string();
  if (fs::exists(dir / "tokenizer.model", ec)) return (dir / "tokenizer.model").string();
  std::vector<fs::path> models, bins;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const fs::path& p = entry.path();
    const std::string name = p.filename().string();
    if (p.extension() == ".model") models.push_back(p);
    if (p.extension() == ".bin" && (name.rfind("tok", 0) == 0)) bins.push_back(p);
  }
  std::sort(models.begin(), models.end());
  std::sort(bins.begin(), bins.end());
  if (!models.empty()) return models.front().string();
  if (!bins.empty()) return bins.front().string();
  return NotFoundError("no tokenizer (tokenizer.json, tokenizer.model, *.model, tok*.bin) in " + dir.string() +
                       "; pass --tokenizer");
}

StatusOr<std::string> ResolveTokenizerFile(const std::string& model_path, const std::string& override_path) {
  if (override_path.empty()) return FindTokenizerFile(model_path);
  std::error_code ec;
  if (!std::filesystem::exists(override_path, ec)) {
    return NotFoundError("--tokenizer: no such file: " + override_path);
  }
  return override_path;
}

}  // namespace lede::tokenizer
