// File: shared/tokenizer/llama2c_tokenizer.h
//
// Llama2cTokenizer: the tokenizer of Karpathy's llama2.c (run.c's encode() /
// decode()), read from its tokenizer .bin file, e.g. stories260K's tok512.bin
// (layout in testdata/models/README.md). Torch-free.
#ifndef LEDE_SHARED_TOKENIZER_LLAMA2C_TOKENIZER_H_
#define LEDE_SHARED_TOKENIZER_LLAMA2C_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "shared/tokenizer/tokenizer.h"
#include "shared/status/status.h"

namespace lede::tokenizer {

// A score-ordered BPE tokenizer with byte fallback, bit-compatible with
// llama2.c's run.c.
//
// Vocabulary (fixed by the llama2.c export): id 0 <unk>, 1 BOS, 2 EOS,
// ids 3..258 the byte pieces "<0x00>".."<0xFF>", the rest merged pieces
// whose score is minus their merge rank.
//
// Encode(text) follows run.c's encode():
//   1. BOS (id 1) if asked;
//   2. if `text` is non-empty, the dummy-prefix piece " " (byte fallback
//      <0x20> if the vocabulary has no " " piece);
//   3. each UTF-8 character as a whole piece if the vocabulary has it, else
//      one byte-fallback id (byte + 3) per byte, or <unk> (id 0) for a byte
//      whose fallback id is past a small vocabulary (< 259 pieces);
//   4. repeatedly merge the adjacent pair whose concatenated piece is in the
//      vocabulary with the highest score (the leftmost pair on ties; as in
//      run.c, only scores above -1e10 count);
//   5. EOS (id 2) if asked.
// TokenBytes(prev, id) follows run.c's decode(): the piece's leading space
// is dropped after BOS, a piece "<0xAB>" gives the raw byte 0xAB, and ids 0,
// 1, 2 (and ids outside the vocabulary) give nothing.
//
// Example:
//   LEDE_ASSIGN_OR_RETURN(auto tok, Llama2cTokenizer::Load(
//       "testdata/models/stories260K/tok512.bin"));
//   LEDE_ASSIGN_OR_RETURN(auto ids, tok->Encode("Once upon a time", true,
//                                               false));  // 1 403 407 261 378
//
// Thread-safety: immutable after Load(); all methods are const and safe to
// call concurrently.
class Llama2cTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kUnkId = 0;
  static constexpr int32_t kBosId = 1;
  static constexpr int32_t kEosId = 2;
  static constexpr int32_t kByteFallbackOffset = 3;  // id = byte + 3

  // Reads a llama2.c tokenizer file: int32 max_token_length, then until EOF
  // records of {float32 score, int32 length, `length` bytes} (little-endian).
  // The vocabulary size is the number of records (512 for tok512.bin).
  // Errors: kNotFound if `path` does not exist; kInvalidArgument naming the
  // file if it cannot be read, is truncated (header or a record cut short),
  // has a non-positive max_token_length, a negative length or one above
  // max_token_length, or fewer than 3 tokens (ids 0..2 are reserved).
  static StatusOr<std::unique_ptr<Llama2cTokenizer>> Load(
      const std::string& path);

  // Builds a tokenizer from an in-memory vocabulary (`pieces[i]` is the bytes
  // of id i, `scores[i]` its merge score; `max_token_length` is only
  // reported back). Used by Load() and by tests.
  // Errors: kInvalidArgument if the sizes differ or there are fewer than 3
  // pieces.
  static StatusOr<std::unique_ptr<Llama2cTokenizer>> FromVocab(
      std::vector<std::string> pieces, std::vector<float> scores,
      int32_t max_token_length);

  int32_t vocab_size() const override {
    return static_cast<int32_t>(pieces_.size());
  }
  int32_t bos_id() const override { return kBosId; }
  int32_t eos_id() const override { return kEosId; }

  // The longest piece in bytes, as declared by the file header.
  int32_t max_token_length() const { return max_token_length_; }

  // The bytes of piece `id` as stored (e.g. " Once", "<0x0A>"); empty for
  // ids outside [0, vocab_size()).
  const std::string& piece(int32_t id) const;

  // See the class comment. Errors: kInvalidArgument if `text` is not valid
  // UTF-8.
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos,
                                        bool add_eos) const override;

  std::string TokenBytes(int32_t prev_id, int32_t id) const override;

 private:
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores,
                   int32_t max_token_length);

  // The id of the piece with exactly these bytes, or -1. When the file
  // repeats a piece, the lowest id wins.
  int32_t Lookup(const std::string& piece) const;
  // The byte-fallback id of `byte` (byte + 3), or kUnkId when the vocabulary
  // is too small to hold it.
  int32_t ByteToken(unsigned char byte) const;

  std::vector<std::string> pieces_;  // id -> bytes
  std::vector<float> scores_;        // id -> merge score
  std::vector<int16_t> byte_value_;  // id -> byte for "<0xAB>" pieces, or -1
  std::unordered_map<std::string, int32_t> piece_to_id_;
  int32_t max_token_length_ = 0;  // as declared by the file
  size_t longest_piece_ = 0;      // as found: bounds merge candidates
  int32_t space_id_ = -1;         // the dummy-prefix piece " ", or -1
};

}  // namespace lede::tokenizer

#endif  // LEDE_SHARED_TOKENIZER_LLAMA2C_TOKENIZER_H_
