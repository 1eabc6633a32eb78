// File: shared/tokenizer/sentencepiece_tokenizer.h
//
// SentencePieceTokenizer: Tokenizer over a SentencePiece .model file (e.g.
// babyllama's tok105.model, a Llama / Llama 2 tokenizer.model, lede-tiny's
// tokenizer.model), encoded by libsentencepiece itself. libsentencepiece is
// reached through the dlopen()ed shim of internal/sentencepiece_shim.h: it
// cannot be linked into a process that loads libtorch, because its embedded
// protobuf copy clashes with the system one. Torch-free. Only built when
// LEDE_HAVE_SENTENCEPIECE=1.
//
// TokenBytes(prev, id):
//   - control pieces (<s>, </s>, ...) and unused pieces give nothing;
//   - the unknown piece gives nothing (libsentencepiece's Decode renders it
//     " ⁇ "); babyllama's tok105.model maps "\n" and every non-ASCII
//     character to <unk>, which would otherwise turn into noise;
//   - byte pieces "<0xAB>" give the raw byte 0xAB;
//   - other pieces give their text with U+2581 (▁) replaced by ' ', minus
//     the leading space when `prev_id` is BOS (the dummy prefix).
//
// Thread-safety: immutable after Load; all methods are const and safe to
// call concurrently.
#ifndef LEDE_SHARED_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
#define LEDE_SHARED_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shared/tokenizer/tokenizer.h"
#include "shared/status/status.h"

namespace lede::tokenizer {
namespace internal {
class SentencePieceLibrary;
}  // namespace internal

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Errors: kNotFound if `path` does not exist; kInvalidArgument naming the
  // file if libsentencepiece cannot parse it; kUnimplemented if the shim
  // module (liblede_spm_shim.so) cannot be found.
  static StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& path);
  ~SentencePieceTokenizer() override;

  int32_t vocab_size() const override { return static_cast<int32_t>(bytes_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }

  // Errors: kInvalidArgument if `text` is not valid UTF-8; kInternal if
  // libsentencepiece fails.
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos,
                                        bool add_eos) const override;
  std::string TokenBytes(int32_t prev_id, int32_t id) const override;

 private:
  SentencePieceTokenizer() = default;

  std::unique_ptr<internal::SentencePieceLibrary> library_;
  std::vector<std::string> bytes_;  // id -> bytes after a non-BOS token
  int32_t bos_id_ = 1;
  int32_t eos_id_ = 2;
};

}  // namespace lede::tokenizer

#endif  // LEDE_SHARED_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
