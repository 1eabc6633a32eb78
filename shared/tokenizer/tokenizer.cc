// File: shared/tokenizer/tokenizer.cc
//
// Tokenizer::Decode, LoadTokenizer, StreamingDetokenizer and the UTF-8
// helpers.
//
// UTF-8 validation follows the Unicode Standard, Table 3-7 (well-formed byte
// sequences). Invalid input is replaced per "maximal subpart" (Unicode
// §3.9, U+FFFD substitution; the WHATWG Encoding Standard does the same):
// each maximal prefix of a well-formed sequence that is cut short, and each
// byte that cannot start one, becomes one U+FFFD. Because the scan is
// left-to-right and CompleteUtf8Prefix() cuts only where a sequence starts,
// sanitizing a stream piece by piece gives the same text as sanitizing it
// whole; StreamingDetokenizer relies on this.
#include "shared/tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "shared/tokenizer/gguf_tokenizer.h"
#include "shared/tokenizer/hf_tokenizer.h"
#include "shared/tokenizer/llama2c_tokenizer.h"
#if LEDE_HAVE_SENTENCEPIECE
#include "shared/tokenizer/sentencepiece_tokenizer.h"
#endif

namespace lede::tokenizer {
namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// How the UTF-8 sequence starting at `pos` ends.
struct Utf8Scan {
  enum Kind { kValid, kInvalid, kTruncated } kind;
  // kValid: the character's length. kInvalid: the length of the maximal
  // subpart to replace (>= 1). kTruncated: bytes up to the end of input,
  // all a valid prefix of a character.
  size_t length;
};

Utf8Scan ScanUtf8(std::string_view bytes, size_t pos) {
  const auto byte = [&](size_t i) {
    return static_cast<unsigned char>(bytes[i]);
  };
  const unsigned char lead = byte(pos);
  if (lead < 0x80) return {Utf8Scan::kValid, 1};
  size_t n_cont = 0;        // continuation bytes after the lead
  unsigned char lo = 0x80;  // allowed range of the 2nd byte
  unsigned char hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    n_cont = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    n_cont = 2;
    if (lead == 0xE0) lo = 0xA0;  // no overlongs
    if (lead == 0xED) hi = 0x9F;  // no surrogates U+D800..U+DFFF
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n_cont = 3;
    if (lead == 0xF0) lo = 0x90;  // no overlongs
    if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {Utf8Scan::kInvalid, 1};  // 80..C1 (stray/overlong), F5..FF
  }
  for (size_t k = 1; k <= n_cont; ++k) {
    if (pos + k >= bytes.size()) return {Utf8Scan::kTruncated, k};
    const unsigned char b = byte(pos + k);
    const unsigned char k_lo = k == 1 ? lo : 0x80;
    const unsigned char k_hi = k == 1 ? hi : 0xBF;
    if (b < k_lo || b > k_hi) return {Utf8Scan::kInvalid, k};
  }
  return {Utf8Scan::kValid, n_cont + 1};
}

bool HasExtension(const std::string& path, std::string_view ext) {
  return std::filesystem::path(path).extension().string() == ext;
}

}  // namespace

int64_t Tokenizer::MaxTokenBytes() const {
  int64_t longest = kMinTokenTextBytes;
  const int32_t prev = eos_id() >= 0 && eos_id() != bos_id() ? eos_id() : -1;
  for (int32_t id = 0; id < vocab_size(); ++id) {
    longest = std::max<int64_t>(longest, static_cast<int64_t>(TokenBytes(prev, id).size()));
  }
  return longest;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  int32_t prev = bos_id();
  for (const int32_t id : ids) {
    bytes += TokenBytes(prev, id);
    prev = id;
  }
  return SanitizeUtf8(bytes);
}

StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::status(path, ec))) {
    return NotFoundError("tokenizer file '" + path + "' not found");
  }
  if (HasExtension(path, ".json")) {
    auto tokenizer = HfTokenizer::Load(path);
    if (!tokenizer.ok()) return tokenizer.status();
    return std::unique_ptr<Tokenizer>(std::move(tokenizer).value());
  }
  if (HasExtension(path, ".gguf")) {
    auto tokenizer = LoadGgufTokenizer(path);
    if (!tokenizer.ok()) return tokenizer.status();
    return std::unique_ptr<Tokenizer>(std::move(tokenizer).value());
  }
  if (HasExtension(path, ".bin")) {
    auto tokenizer = Llama2cTokenizer::Load(path);
    if (!tokenizer.ok()) return tokenizer.status();
    return std::unique_ptr<Tokenizer>(std::move(tokenizer).value());
  }
  if (HasExtension(path, ".model")) {
#if LEDE_HAVE_SENTENCEPIECE
    auto tokenizer = SentencePieceTokenizer::Load(path);
    if (!tokenizer.ok()) return tokenizer.status();
    return std::unique_ptr<Tokenizer>(std::move(tokenizer).value());
#else
    return UnimplementedError("tokenizer file '" + path +
                              "': this build has no SentencePiece support "
                              "(LEDE_HAVE_SENTENCEPIECE=0)");
#endif
  }
  return InvalidArgumentError(
      "tokenizer file '" + path +
      "': unknown extension (expected .json for a Hugging Face tokenizer.json, "
      ".model for SentencePiece, .bin for llama2.c or .gguf for a GGUF file's "
      "tokenizer)");
}

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer,
                                           int32_t prev_id)
    : tokenizer_(tokenizer), prev_id_(prev_id) {}

std::string StreamingDetokenizer::Push(int32_t id) {
  pending_ += tokenizer_.TokenBytes(prev_id_, id);
  prev_id_ = id;
  const size_t complete = CompleteUtf8Prefix(pending_);
  if (complete == 0) return std::string();
  std::string out =
      SanitizeUtf8(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out = SanitizeUtf8(pending_);
  pending_.clear();
  return out;
}

size_t CompleteUtf8Prefix(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const Utf8Scan scan = ScanUtf8(bytes, pos);
    if (scan.kind == Utf8Scan::kTruncated) return pos;
    pos += scan.length;
  }
  return pos;
}

bool IsValidUtf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const Utf8Scan scan = ScanUtf8(text, pos);
    if (scan.kind != Utf8Scan::kValid) return false;
    pos += scan.length;
  }
  return true;
}

std::string SanitizeUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const Utf8Scan scan = ScanUtf8(bytes, pos);
    if (scan.kind == Utf8Scan::kValid) {
      out.append(bytes.substr(pos, scan.length));
    } else {
      out.append(kReplacementChar);
    }
    pos += scan.length;
  }
  return out;
}

}  // namespace lede::tokenizer
