// File: shared/tokenizer/hf_tokenizer.h
//
// HfTokenizer: a Hugging Face tokenizer.json (the `tokenizers` library's
// serialization) with a BPE model, in the two shapes Llama-family
// checkpoints ship:
//  - byte-level BPE (Llama-3, GPT-2, Qwen without normalizer): the
//    pre-tokenizer splits the text with the file's own regex (PCRE2 in UTF +
//    UCP mode, so \p{L}, \p{N}, \s and lookahead mean what they mean in the
//    Oniguruma engine of the Rust library), each piece's bytes become symbols
//    through the GPT-2 byte-to-unicode map, and merges apply by rank
//    (`ignore_merges`: a piece that is itself a vocabulary entry is one
//    token);
//  - SentencePiece-style BPE (Llama-2, Mistral): normalizer Prepend("▁") +
//    Replace(" ", "▁"), or a Metaspace pre-tokenizer, merges over Unicode
//    characters, and byte fallback (<0xNN>) for characters not in the
//    vocabulary.
// Added tokens (<|begin_of_text|>, <|eot_id|>, <s>, ...) are matched in the
// raw text before anything else, leftmost-longest, honouring lstrip/rstrip.
// The post-processor (TemplateProcessing, ByteLevel, or a Sequence of them)
// decides DefaultAddBos()/DefaultAddEos(); tokenizer_config.json beside the
// file, when present, names the BOS/EOS tokens and add_bos_token.
//
// Decoding is byte-exact: TokenBytes() gives a token's raw bytes (the
// inverse byte map, or the piece with "▁" as a space and <0xNN> as one
// byte); special added tokens give nothing. After BOS or another special
// token, the SentencePiece-style dummy-prefix space is dropped (the
// decoder's Strip / Metaspace rule).
//
// Not supported (kUnimplemented naming the file and the type): models other
// than BPE (WordPiece, Unigram, WordLevel), normalizers other than
// Prepend/Replace/Sequence (NFC, NFKC, Lowercase, ...), pre-tokenizers other
// than Split/ByteLevel/Metaspace/Sequence, Split behaviours other than
// Isolated/Removed, continuing_subword_prefix / end_of_word_suffix, dropout.
// Added tokens marked "normalized": true are matched in the raw text too.
//
// Source: the tokenizer.json format of huggingface/tokenizers; GPT-2 byte
// map (Radford et al. 2019, encoder.py's bytes_to_unicode); checked against
// @huggingface/tokenizers (tests/shared/tokenizer/hf_tokenizer_test.cc).
//
// Thread-safety: immutable after Load; all methods are const and safe to
// call concurrently.
#ifndef LEDE_SHARED_TOKENIZER_HF_TOKENIZER_H_
#define LEDE_SHARED_TOKENIZER_HF_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shared/status/status.h"
#include "shared/tokenizer/hf_config.h"
#include "shared/tokenizer/tokenizer.h"

namespace lede::tokenizer {

namespace internal {
struct HfTokenizerState;
}  // namespace internal

// The largest id space a tokenizer.json may declare: every id of the
// vocabulary and the added tokens must be below it. The decoding tables are
// indexed by id, so a file's memory is proportional to its largest id, not to
// its size: one entry with id 242222222 asked for 7.7 GB (a fuzz finding).
// The largest vocabularies in use have about 256K ids (Gemma; Llama-3 128K).
inline constexpr int32_t kMaxHfVocabSize = 1 << 22;

class HfTokenizer : public Tokenizer {
 public:
  // Loads `path` (a tokenizer.json) and, when it exists,
  // tokenizer_config.json in the same directory.
  // Errors: kNotFound if `path` is missing; kInvalidArgument naming the file
  // and the field for bad JSON, a missing vocab or merges, a merge of unknown
  // tokens, an id outside [0, kMaxHfVocabSize) or a regex PCRE2 rejects;
  // kUnimplemented naming the file and the
  // type for an unsupported model, normalizer, pre-tokenizer or decoder.
  static StatusOr<std::unique_ptr<HfTokenizer>> Load(const std::string& path);

  // The same from text; `source` names the file in errors. `config` supplies
  // BOS/EOS names and add_bos_token (an empty config for none).
  static StatusOr<std::unique_ptr<HfTokenizer>> FromJson(const std::string& json_text,
                                                          const std::string& source,
                                                          const HfTokenizerConfig& config);
  ~HfTokenizer() override;

  // One past the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const override;
  // -1 when the files name no BOS (Qwen) or EOS.
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  bool DefaultAddBos() const override;
  bool DefaultAddEos() const;

  // add_bos / add_eos prepend bos_id() / append eos_id(); each is a no-op
  // when that id is -1. Special-token strings in `text` become their ids.
  // Errors: kInvalidArgument if `text` is not valid UTF-8 (invalid input is
  // refused, not replaced: the Rust library takes only valid strings);
  // kInternal if PCRE2 fails on a match (e.g. its match limit).
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos,
                                        bool add_eos) const override;
  std::string TokenBytes(int32_t prev_id, int32_t id) const override;
  // As the tokenizers library decodes with skip_special_tokens: special
  // tokens dropped, then the SentencePiece-style dummy-prefix space removed
  // once, from the start of the text. Invalid UTF-8 becomes U+FFFD.
  std::string Decode(const std::vector<int32_t>& ids) const override;

  // The id of a vocabulary entry or added token by its content (model-space
  // string for the vocabulary: "Ġthe", "▁the"), if any.
  std::optional<int32_t> TokenId(std::string_view content) const;

  // The loaded tables (internal/hf_tokenizer_impl.h; only hf_tokenizer.cc
  // and internal/hf_tokenizer_json.cc see them).
  using Impl = internal::HfTokenizerState;

 private:
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lede::tokenizer

#endif  // LEDE_SHARED_TOKENIZER_HF_TOKENIZER_H_
