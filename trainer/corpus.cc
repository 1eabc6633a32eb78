#include "trainer/corpus.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "shared/file/file.h"
#include "shared/status/status_macros.h"

namespace lede::trainer {

StatusOr<std::vector<std::string>> ReadDocuments(const std::string& path) {
  static const std::string kSeparator = "\n<|doc|>\n";
  LEDE_ASSIGN_OR_RETURN(const std::string text, file::ReadFile(path));
  std::vector<std::string> docs;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find(kSeparator, begin);
    if (end == std::string::npos) end = text.size();
    if (end > begin) docs.push_back(text.substr(begin, end - begin));
    begin = end + kSeparator.size();
  }
  return docs;
}

StatusOr<std::vector<int32_t>> EncodeDocuments(const tokenizer::Tokenizer& tokenizer,
                                               const std::vector<std::string>& documents) {
  std::vector<int32_t> stream;
  for (const std::string& doc : documents) {
    LEDE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(doc, true, true));
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  return stream;
}

StatusOr<PromptSet> LoadPromptSet(const std::string& path, const tokenizer::Tokenizer& tok, int64_t per_set,
                                  int64_t prompt_tokens, int64_t max_prompt_tokens) {
  PromptSet set;
  set.name = std::filesystem::path(path).stem().stem().string();
  std::vector<std::vector<int32_t>> all;
  if (std::filesystem::path(path).extension() == ".jsonl") {
    std::ifstream in(path);
    if (!in) return NotFoundError("cannot read prompt file " + path);
    std::string line;
    while (std::getline(in, line) && static_cast<int64_t>(all.size()) < per_set) {
      if (line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) return InvalidArgumentError(path + ": a line is not JSON");
      std::string text;
      if (j.contains("prompt") && j["prompt"].is_string()) text = j["prompt"];
      else if (j.contains("turns") && j["turns"].is_array() && !j["turns"].empty()) text = j["turns"][0];
      else if (j.contains("text") && j["text"].is_string()) text = j["text"];
      else if (j.contains("input") && j["input"].is_string()) text = j["input"];
      if (text.empty()) continue;
      LEDE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(text, true, false));
      if (static_cast<int64_t>(ids.size()) > max_prompt_tokens) ids.resize(max_prompt_tokens);
      all.push_back(std::move(ids));
    }
  } else {
    LEDE_ASSIGN_OR_RETURN(std::vector<std::string> docs, trainer::ReadDocuments(path));
    for (const std::string& doc : docs) {
      if (static_cast<int64_t>(all.size()) >= per_set) break;
      auto ids = tok.Encode(doc, true, false);
      if (!ids.ok() || static_cast<int64_t>(ids->size()) < prompt_tokens + 8) continue;
      all.emplace_back(ids->begin(), ids->begin() + prompt_tokens);
    }
  }
  if (all.size() < 2) return InvalidArgumentError(path + ": fewer than 2 usable prompts");
  const size_t half = all.size() / 2;
  set.tuning.assign(all.begin(), all.begin() + half);
  set.eval.assign(all.begin() + half, all.end());
  return set;
}

}  // namespace lede::trainer
