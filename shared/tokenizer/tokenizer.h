// File: shared/tokenizer/tokenizer.h
//
// Tokenizer: one interface over Hugging Face tokenizer.json files
// (hf_tokenizer.h), SentencePiece .model files (libsentencepiece) and
// llama2.c tokenizer .bin files (score-ordered BPE with byte fallback, see
// testdata/models/README.md). Torch-free.
//
// Thread-safety: a loaded Tokenizer is immutable; all methods are const and
// safe to call from many threads.
#ifndef LEDE_SHARED_TOKENIZER_TOKENIZER_H_
#define LEDE_SHARED_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shared/status/status.h"

namespace lede::tokenizer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;

  // Whether the tokenizer's own files ask for BOS when encoding a prompt
  // (a tokenizer.json post-processor, add_bos_token); true for SentencePiece
  // and llama2.c, which always expect it.
  virtual bool DefaultAddBos() const { return true; }

  // Encodes UTF-8 text into token ids, optionally framed by BOS / EOS.
  // Errors: kInvalidArgument if `text` is not valid UTF-8.
  virtual StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                bool add_bos,
                                                bool add_eos) const = 0;

  // The bytes token `id` contributes to the text when it follows `prev_id`
  // (the dummy-prefix space of the first piece after BOS is dropped; BOS, EOS
  // and other control tokens contribute nothing). A byte-fallback token gives
  // one raw byte, so the result may be part of a UTF-8 character.
  // Ids outside [0, vocab_size()) contribute nothing.
  virtual std::string TokenBytes(int32_t prev_id, int32_t id) const = 0;

  // Decodes a whole sequence: the concatenation of TokenBytes() with each
  // token's predecessor (the first token's predecessor is BOS). Bytes that
  // do not form valid UTF-8 are replaced by U+FFFD.
  // Virtual so that a tokenizer whose decoder rules span the sequence
  // (tokenizer.json's Strip) can apply them exactly.
  virtual std::string Decode(const std::vector<int32_t>& ids) const;

  // The most bytes of text one token covers, bytes: the longest piece of the
  // vocabulary as TokenBytes() gives it (after a non-BOS predecessor, so a
  // leading space counts), and at least kMinTokenTextBytes (a UTF-8
  // character that has no piece becomes one unknown token or byte-fallback
  // tokens; special tokens written in the text, like "<|eot_id|>", are
  // matched as one token though they contribute nothing to TokenBytes()).
  // A text longer than capacity x MaxTokenBytes() cannot encode to at most
  // `capacity` tokens (unless a normalizer deletes input, which none of the
  // supported tokenizers does beyond collapsing whitespace runs), which is
  // what lets the coordinator reject it before tokenizing.
  // Cost: one TokenBytes() per vocabulary entry, O(vocab_size()); callers
  // compute it once.
  int64_t MaxTokenBytes() const;

  static constexpr int64_t kMinTokenTextBytes = 32;
};

// Loads a tokenizer by file type: *.json is a Hugging Face tokenizer.json
// (HfTokenizer, with tokenizer_config.json beside it), *.model is
// SentencePiece, *.bin is a llama2.c tokenizer, *.gguf is the tokenizer in a
// GGUF file's tokenizer.ggml.* metadata (gguf_tokenizer.h).
// Errors: kNotFound if the file is missing; kInvalidArgument (naming the
// file) if it is truncated or malformed; kUnimplemented for a SentencePiece
// model in a build without libsentencepiece, or (naming the file and the
// type) a tokenizer.json model or pre-tokenizer type that is not supported.
StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path);

// Turns a stream of token ids into UTF-8 text for streaming, never emitting
// part of a character: bytes of an unfinished character are held back until
// the character completes. Invalid sequences become U+FFFD.
//
// Example:
//   StreamingDetokenizer detok(*tokenizer, tokenizer->bos_id());
//   for (int32_t id : new_ids) std::cout << detok.Push(id);
//   std::cout << detok.Flush();
//
// Thread-safety: not thread-safe; one per stream. Borrows the tokenizer.
class StreamingDetokenizer {
 public:
  // `prev_id` is the token before the first one pushed (BOS at the start of
  // a generation, or the last prompt token).
  StreamingDetokenizer(const Tokenizer& tokenizer, int32_t prev_id);

  // Appends one token; returns the text that is now complete.
  std::string Push(int32_t id);

  // Returns what is still held back (an unfinished character becomes U+FFFD).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  int32_t prev_id_;
  std::string pending_;  // bytes of an unfinished UTF-8 character
};

// Length of the longest prefix of `bytes` that is complete, valid UTF-8 or
// ends in an invalid sequence (which Sanitize replaces); the rest (at most
// 3 bytes) is the start of a character that may still complete.
size_t CompleteUtf8Prefix(std::string_view bytes);

// True if `text` is valid UTF-8 (no overlongs, surrogates or > U+10FFFF).
bool IsValidUtf8(std::string_view text);

// Replaces every invalid UTF-8 sequence in `bytes` by U+FFFD.
std::string SanitizeUtf8(std::string_view bytes);

}  // namespace lede::tokenizer

#endif  // LEDE_SHARED_TOKENIZER_TOKENIZER_H_
