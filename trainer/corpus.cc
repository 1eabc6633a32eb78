#include "trainer/corpus.h"


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

}  // namespace lede::trainer
