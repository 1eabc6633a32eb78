#include "shared/tokenizer/sentencepiece_tokenizer.h"

#include <filesystem>

#include "shared/tokenizer/internal/sentencepiece_shim.h"
#include "shared/status/status_macros.h"

namespace lede::tokenizer {
namespace {

// "<0xAB>" -> 0xAB, else -1.
int PieceToByte(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  try {
    return std::stoi(piece.substr(3, 2), nullptr, 16);
  } catch (const std::exception&) {
    return -1;
  }
}

std::string ReplaceWordBoundaries(const std::string& piece) {
  static const std::string kBoundary = "\xE2\x96\x81";  // U+2581
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kBoundary.size(), kBoundary) == 0) {
      out += ' ';
      i += kBoundary.size();
    } else {
      out += piece[i++];
    }
  }
  return out;
}

}  // namespace

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return NotFoundError("tokenizer not found: " + path);
  std::unique_ptr<SentencePieceTokenizer> tok(new SentencePieceTokenizer());
  LEDE_ASSIGN_OR_RETURN(tok->library_, internal::SentencePieceLibrary::Load(path));
  const auto& lib = *tok->library_;
  if (lib.vocab_size() <= 0) return InvalidArgumentError(path + ": SentencePiece model has no pieces");
  tok->bos_id_ = lib.bos_id() >= 0 ? lib.bos_id() : 1;
  tok->eos_id_ = lib.eos_id() >= 0 ? lib.eos_id() : 2;
  for (const auto& piece : lib.pieces()) {
    std::string bytes;
    if (piece.flags & kLedeSpmByte) {
      const int b = PieceToByte(piece.text);
      if (b >= 0) bytes.assign(1, static_cast<char>(b));
    } else if (!(piece.flags & (kLedeSpmControl | kLedeSpmUnknown | kLedeSpmUnused))) {
      bytes = ReplaceWordBoundaries(piece.text);
    }
    tok->bytes_.push_back(std::move(bytes));
  }
  return tok;
}

StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(std::string_view text, bool add_bos,
                                                              bool add_eos) const {
  if (!IsValidUtf8(text)) return InvalidArgumentError("text is not valid UTF-8");
  std::vector<int32_t> ids;
  if (add_bos) ids.push_back(bos_id_);
  if (!text.empty()) {
    LEDE_ASSIGN_OR_RETURN(std::vector<int32_t> body, library_->Encode(std::string(text)));
    ids.insert(ids.end(), body.begin(), body.end());
  }
  if (add_eos) ids.push_back(eos_id_);
  return ids;
}

std::string SentencePieceTokenizer::TokenBytes(int32_t prev_id, int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  const std::string& bytes = bytes_[id];
  if (prev_id == bos_id_ && !bytes.empty() && bytes[0] == ' ') return bytes.substr(1);
  return bytes;
}

}  // namespace lede::tokenizer
