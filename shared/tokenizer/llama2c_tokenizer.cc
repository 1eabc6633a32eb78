// File: shared/tokenizer/llama2c_tokenizer.cc
//
// llama2.c tokenizer: file reader, encode() and decode() as in run.c.
#include "shared/tokenizer/llama2c_tokenizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <utility>

#include "shared/status/status_macros.h"

namespace lede::tokenizer {
namespace {

// Little-endian readers at byte offset `pos` of an in-memory file.
uint32_t ReadU32Le(const std::string& data, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data() + pos);
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

int32_t ReadI32Le(const std::string& data, size_t pos) {
  return static_cast<int32_t>(ReadU32Le(data, pos));
}

float ReadF32Le(const std::string& data, size_t pos) {
  const uint32_t bits = ReadU32Le(data, pos);
  float value;
  static_assert(sizeof(value) == sizeof(bits), "float must be 32-bit");
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte of a piece spelled exactly "<0xAB>" (either hex case), else -1.
int16_t ParseBytePiece(const std::string& piece) {
  if (piece.size() != 6 || piece[0] != '<' || piece[1] != '0' ||
      piece[2] != 'x' || piece[5] != '>') {
    return -1;
  }
  const int hi = HexDigit(piece[3]);
  const int lo = HexDigit(piece[4]);
  if (hi < 0 || lo < 0) return -1;
  return static_cast<int16_t>(hi * 16 + lo);
}

// Byte length of the UTF-8 character whose lead byte is `lead`; only called
// on text already checked by IsValidUtf8().
size_t Utf8CharLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

Status Malformed(const std::string& path, const std::string& what) {
  return InvalidArgumentError("llama2.c tokenizer file '" + path +
                              "': " + what);
}

}  // namespace

Llama2cTokenizer::Llama2cTokenizer(std::vector<std::string> pieces,
                                   std::vector<float> scores,
                                   int32_t max_token_length)
    : pieces_(std::move(pieces)),
      scores_(std::move(scores)),
      max_token_length_(max_token_length) {
  byte_value_.reserve(pieces_.size());
  piece_to_id_.reserve(pieces_.size());
  for (size_t id = 0; id < pieces_.size(); ++id) {
    byte_value_.push_back(ParseBytePiece(pieces_[id]));
    longest_piece_ = std::max(longest_piece_, pieces_[id].size());
    // emplace keeps the first (lowest) id of a repeated piece.
    piece_to_id_.emplace(pieces_[id], static_cast<int32_t>(id));
  }
  space_id_ = Lookup(" ");
}

StatusOr<std::unique_ptr<Llama2cTokenizer>> Llama2cTokenizer::FromVocab(
    std::vector<std::string> pieces, std::vector<float> scores,
    int32_t max_token_length) {
  if (pieces.size() != scores.size()) {
    return InvalidArgumentError(
        "llama2.c tokenizer: " + std::to_string(pieces.size()) +
        " pieces but " + std::to_string(scores.size()) + " scores");
  }
  if (pieces.size() < 3) {
    return InvalidArgumentError(
        "llama2.c tokenizer: needs at least 3 pieces (<unk>, <s>, </s>), got " +
        std::to_string(pieces.size()));
  }
  if (pieces.size() > static_cast<size_t>(INT32_MAX)) {
    return InvalidArgumentError("llama2.c tokenizer: vocabulary too large");
  }
  return std::unique_ptr<Llama2cTokenizer>(new Llama2cTokenizer(
      std::move(pieces), std::move(scores), max_token_length));
}

StatusOr<std::unique_ptr<Llama2cTokenizer>> Llama2cTokenizer::Load(
    const std::string& path) {
  std::error_code ec;
  const auto file_status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(file_status)) {
    return NotFoundError("llama2.c tokenizer file '" + path + "' not found");
  }
  if (!std::filesystem::is_regular_file(file_status)) {
    return Malformed(path, "not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Malformed(path, "cannot open");
  std::string data((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  if (in.bad()) return Malformed(path, "read error");

  if (data.size() < 4) {
    return Malformed(path, "truncated header (" + std::to_string(data.size()) +
                               " bytes, need 4 for max_token_length)");
  }
  const int32_t max_token_length = ReadI32Le(data, 0);
  if (max_token_length <= 0) {
    return Malformed(path, "max_token_length " +
                               std::to_string(max_token_length) +
                               " is not positive");
  }
  std::vector<std::string> pieces;
  std::vector<float> scores;
  size_t pos = 4;
  while (pos < data.size()) {
    const std::string token = "token " + std::to_string(pieces.size());
    if (data.size() - pos < 8) {
      return Malformed(path, "truncated at " + token + " (offset " +
                                 std::to_string(pos) +
                                 "): score/length cut short");
    }
    const float score = ReadF32Le(data, pos);
    const int32_t length = ReadI32Le(data, pos + 4);
    pos += 8;
    if (length < 0) {
      return Malformed(
          path, token + " has negative length " + std::to_string(length));
    }
    if (length > max_token_length) {
      return Malformed(path, token + " has length " + std::to_string(length) +
                                 " > max_token_length " +
                                 std::to_string(max_token_length));
    }
    if (data.size() - pos < static_cast<size_t>(length)) {
      return Malformed(path, "truncated at " + token + ": needs " +
                                 std::to_string(length) + " bytes, " +
                                 std::to_string(data.size() - pos) + " left");
    }
    pieces.emplace_back(data, pos, static_cast<size_t>(length));
    scores.push_back(score);
    pos += static_cast<size_t>(length);
  }
  if (pieces.size() < 3) {
    return Malformed(path, "has " + std::to_string(pieces.size()) +
                               " tokens; ids 0..2 (<unk>, <s>, </s>) are "
                               "required");
  }
  return FromVocab(std::move(pieces), std::move(scores), max_token_length);
}

const std::string& Llama2cTokenizer::piece(int32_t id) const {
  static const std::string* const kEmpty = new std::string();
  if (id < 0 || id >= vocab_size()) return *kEmpty;
  return pieces_[static_cast<size_t>(id)];
}

int32_t Llama2cTokenizer::ByteToken(unsigned char byte) const {
  // A vocabulary of fewer than 259 pieces lacks some byte-fallback tokens;
  // their bytes become <unk> instead of an id past the vocabulary (found by
  // tests/fuzz/llama2c_tokenizer: a 3-piece file made Encode() read past
  // pieces_).
  const int32_t id = static_cast<int32_t>(byte) + kByteFallbackOffset;
  return id < vocab_size() ? id : kUnkId;
}

int32_t Llama2cTokenizer::Lookup(const std::string& piece) const {
  const auto it = piece_to_id_.find(piece);
  return it == piece_to_id_.end() ? -1 : it->second;
}

StatusOr<std::vector<int32_t>> Llama2cTokenizer::Encode(std::string_view text,
                                                        bool add_bos,
                                                        bool add_eos) const {
  if (!IsValidUtf8(text)) {
    return InvalidArgumentError("Encode: text is not valid UTF-8");
  }
  std::vector<int32_t> tokens;
  tokens.reserve(text.size() + 3);
  if (add_bos) tokens.push_back(kBosId);
  if (!text.empty()) {
    // run.c pushes str_lookup(" ") unconditionally; a vocabulary without a
    // " " piece would give -1 there, so fall back to the byte token instead.
    tokens.push_back(space_id_ >= 0 ? space_id_ : ByteToken(' '));
  }
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = Utf8CharLength(static_cast<unsigned char>(text[pos]));
    const int32_t id = Lookup(std::string(text.substr(pos, len)));
    if (id >= 0) {
      tokens.push_back(id);
    } else {
      for (size_t i = 0; i < len; ++i) {
        tokens.push_back(ByteToken(static_cast<unsigned char>(text[pos + i])));
      }
    }
    pos += len;
  }

  // Greedy merges. run.c rescans every pair after each merge; here the
  // merge candidate of each adjacent pair is cached and only the two pairs
  // next to a merge are recomputed, which selects the same pair (highest
  // score, leftmost on ties) with two lookups per merge instead of n.
  auto pair_merge = [this](int32_t left, int32_t right) -> int32_t {
    const std::string& a = pieces_[static_cast<size_t>(left)];
    const std::string& b = pieces_[static_cast<size_t>(right)];
    if (a.size() + b.size() > longest_piece_) {
      return -1;  // longer than any piece
    }
    return Lookup(a + b);
  };
  if (tokens.size() >= 2) {
    std::vector<int32_t> pair_ids(tokens.size() - 1);
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      pair_ids[i] = pair_merge(tokens[i], tokens[i + 1]);
    }
    while (!pair_ids.empty()) {
      float best_score = -1e10f;  // run.c's threshold
      size_t best = pair_ids.size();
      for (size_t i = 0; i < pair_ids.size(); ++i) {
        const int32_t id = pair_ids[i];
        if (id >= 0 && scores_[static_cast<size_t>(id)] > best_score) {
          best_score = scores_[static_cast<size_t>(id)];
          best = i;
        }
      }
      if (best == pair_ids.size()) break;
      tokens[best] = pair_ids[best];
      tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best) + 1);
      pair_ids.erase(pair_ids.begin() + static_cast<std::ptrdiff_t>(best));
      if (best < pair_ids.size()) {
        pair_ids[best] = pair_merge(tokens[best], tokens[best + 1]);
      }
      if (best > 0) {
        pair_ids[best - 1] = pair_merge(tokens[best - 1], tokens[best]);
      }
    }
  }
  if (add_eos) tokens.push_back(kEosId);
  return tokens;
}

std::string Llama2cTokenizer::TokenBytes(int32_t prev_id, int32_t id) const {
  if (id < 0 || id >= vocab_size() || id == kUnkId || id == kBosId ||
      id == kEosId) {
    return std::string();
  }
  const size_t index = static_cast<size_t>(id);
  if (byte_value_[index] >= 0) {
    return std::string(1, static_cast<char>(byte_value_[index]));
  }
  const std::string& bytes = pieces_[index];
  if (prev_id == kBosId && !bytes.empty() && bytes[0] == ' ') {
    return bytes.substr(1);
  }
  return bytes;
}

}  // namespace lede::tokenizer
