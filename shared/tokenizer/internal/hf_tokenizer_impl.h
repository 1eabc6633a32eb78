// File: shared/tokenizer/internal/hf_tokenizer_impl.h
//
// The parts of HfTokenizer (hf_tokenizer.h) that its two source files share:
// the parsed tokenizer state (HfTokenizer::Impl), the pre-tokenizer steps,
// and the byte-level helpers. hf_tokenizer.cc encodes and decodes with it;
// hf_tokenizer_json.cc builds it from tokenizer.json. Not an API: only those
// two files include it.
#ifndef LEDE_SHARED_TOKENIZER_INTERNAL_HF_TOKENIZER_IMPL_H_
#define LEDE_SHARED_TOKENIZER_INTERNAL_HF_TOKENIZER_IMPL_H_

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shared/status/status_macros.h"
#include "shared/tokenizer/hf_tokenizer.h"

namespace lede::tokenizer::internal {

inline constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 "▁"

// The pattern of GPT-2's pre-tokenizer (ByteLevel with use_regex = true).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Length of the (valid) UTF-8 character that starts with `lead`.
size_t Utf8Length(unsigned char lead);

// GPT-2's reversible map from bytes to printable code points: printable
// Latin-1 bytes map to themselves, the other 68 to 256, 257, ... in order.
std::vector<uint32_t> ByteToCodePoint();

using ByteInverse = std::unordered_map<uint32_t, uint8_t>;  // GPT-2 code point -> byte

// The inverse of ByteToCodePoint().
ByteInverse InverseByteMap();

// Decodes a byte-level model string ("Ġthe") back to raw bytes (" the").
// Characters outside the map are kept as their UTF-8 bytes.
std::string ByteLevelToBytes(std::string_view s, const ByteInverse& inverse);

// Replaces every `from` in *s by `to` (nothing when `from` is empty).
void ReplaceAll(std::string* s, std::string_view from, std::string_view to);

// "<0x0A>" -> 0x0A; nullopt for any other piece.
std::optional<uint8_t> ByteFallbackValue(std::string_view piece);

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool lstrip = false;
  bool rstrip = false;
  bool special = false;
};

// A compiled PCRE2 pattern (owned).
struct Regex {
  pcre2_code* code = nullptr;
  Regex() = default;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

// One step of the pre-tokenizer.
struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevelRegex, kMetaspace } kind = Kind::kSplit;
  std::shared_ptr<Regex> regex;  // kSplit, kByteLevelRegex
  bool remove_matches = false;   // Split behaviour "Removed" (else "Isolated")
  bool invert = false;           // Split: the pattern matches the gaps
  // kMetaspace
  std::string replacement;
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;
};

// The parsed tokenizer.json (HfTokenizer::Impl).
struct HfTokenizerState {
  std::string source;
  bool byte_level = false;      // the model's strings are GPT-2-mapped bytes
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  int32_t unk_id = -1;
  std::unordered_map<std::string, int32_t> vocab;  // model-space string (raw bytes if byte_level) -> id
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left id, right id) -> (rank, merged id)
  std::vector<int32_t> byte_ids;  // byte_level: raw byte -> id; SP: <0xNN> -> id (-1 if none)

  // Normalizer (SentencePiece style): prepend, then replace.
  std::string normalizer_prepend;
  std::vector<std::pair<std::string, std::string>> normalizer_replace;

  std::vector<PreTokenizerStep> pre_tokenizer;
  bool byte_level_add_prefix_space = false;

  std::vector<AddedToken> added;  // longest first
  std::vector<std::vector<size_t>> added_by_first_byte;  // [256]: indices into `added`, longest first
  std::vector<std::string> token_bytes;  // id -> decoded bytes
  std::vector<bool> contributes_nothing;  // id -> special added token
  bool strip_space_after_special = false;  // SentencePiece-style decoders

  int32_t vocab_size = 0;
  int32_t bos = -1;
  int32_t eos = -1;
  bool default_add_bos = false;
  bool default_add_eos = false;

  std::optional<int32_t> Lookup(std::string_view s) const {
    auto it = vocab.find(std::string(s));
    if (it == vocab.end()) return std::nullopt;
    return it->second;
  }

  Status ApplyPreTokenizer(const std::string& segment, bool first_segment, std::vector<std::string>* pieces) const;
  void Bpe(std::string_view piece, std::vector<int32_t>* ids) const;
  Status EncodeSegment(std::string_view segment, bool first_segment, std::vector<int32_t>* ids) const;
};

// Parses tokenizer.json text into the tokenizer state: the model (BPE
// vocabulary, merges), normalizer, pre-tokenizer, decoder, post-processor and
// added tokens; BOS/EOS from `config`, else from the post-processor.
// Errors: InvalidArgument naming `source` and the field for malformed JSON or
// a component this implementation does not support. Thread-compatible.
StatusOr<std::unique_ptr<HfTokenizer::Impl>> ParseTokenizerJson(const std::string& json_text,
                                                                 const std::string& source,
                                                                 const HfTokenizerConfig& config);

}  // namespace lede::tokenizer::internal

#endif  // LEDE_SHARED_TOKENIZER_INTERNAL_HF_TOKENIZER_IMPL_H_
