// File: shared/tokenizer/gguf_tokenizer.h
//
// The tokenizer of a GGUF file (tokenizer.ggml.* keys, llama.cpp's
// convention) in both directions, torch-free:
//  - reading: the file's vocabulary becomes the equivalent Hugging Face
//    tokenizer.json, loaded by HfTokenizer (hf_tokenizer.h), so one BPE
//    implementation serves both formats:
//      tokenizer.ggml.model = "llama": SentencePiece-style BPE with byte
//        fallback; tokens, scores and token_type; the merges are those the
//        scores imply (a pair (a, b) whose concatenation is a vocabulary
//        piece, ranked by that piece's score, highest first: SentencePiece
//        BPE's rule); control tokens (type 3) are special added tokens,
//        user-defined ones (type 4) plain added tokens; the "▁" dummy
//        prefix unless tokenizer.ggml.add_space_prefix is false;
//      tokenizer.ggml.model = "gpt2": byte-level BPE with
//        tokenizer.ggml.merges; tokenizer.ggml.pre "llama-bpe" / "llama3"
//        (Llama-3's pre-tokenizer regex, merges ignored for whole-vocabulary
//        pieces) or "default" / "gpt2" (GPT-2's regex);
//    BOS/EOS from tokenizer.ggml.{bos,eos}_token_id, add_bos_token from
//    tokenizer.ggml.add_bos_token (default true for "llama", false for
//    "gpt2"), the chat template from tokenizer.chat_template.
//  - writing (lede export --format gguf): a checkpoint's tokenizer file
//    (SentencePiece .model, llama2.c tok*.bin, or tokenizer.json) as those
//    keys, plus tokenizer_config.json's chat template when there is one.
//
// Token types (llama.cpp's): 1 normal, 2 unknown, 3 control, 4 user-defined,
// 5 unused, 6 byte.
#ifndef LEDE_SHARED_TOKENIZER_GGUF_TOKENIZER_H_
#define LEDE_SHARED_TOKENIZER_GGUF_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shared/checkpoint/gguf.h"
#include "shared/status/status.h"
#include "shared/tokenizer/hf_config.h"
#include "shared/tokenizer/hf_tokenizer.h"

namespace lede::tokenizer {

// The tokenizer.json text and config equivalent to `file`'s tokenizer.
struct GgufTokenizerJson {
  std::string json;
  HfTokenizerConfig config;  // bos/eos token names, add_bos_token, chat template
};

// Errors: kInvalidArgument naming the key: no tokenizer.ggml.model, a
// tokens / scores / token_type / merges array of the wrong type or length,
// a token id key outside the vocabulary, a token that is not valid UTF-8;
// kUnimplemented naming the key and value for another tokenizer model or
// pre-tokenizer.
StatusOr<GgufTokenizerJson> GgufTokenizerToHfJson(const checkpoint::GgufFile& file);

// GgufTokenizerToHfJson + HfTokenizer::FromJson. Errors: those of both.
StatusOr<std::unique_ptr<HfTokenizer>> LoadGgufTokenizer(const checkpoint::GgufFile& file);
// Opens `path` first (errors of GgufFile::Open).
StatusOr<std::unique_ptr<HfTokenizer>> LoadGgufTokenizer(const std::string& path);

// The tokenizer.chat_template of a GGUF file with its BOS/EOS token texts;
// kNotFound naming the file when it has none.
struct GgufChatTemplate {
  std::string text;
  std::string bos_token;
  std::string eos_token;
};
StatusOr<GgufChatTemplate> ReadGgufChatTemplate(const std::string& path);

// A vocabulary as GGUF stores it.
struct GgufVocab {
  std::string model;  // "llama" or "gpt2"
  std::string pre;    // gpt2 only: "llama-bpe" or "gpt2"
  std::vector<std::string> tokens;
  std::vector<float> scores;        // llama only
  std::vector<int32_t> token_types;
  std::vector<std::string> merges;  // gpt2 only, "a b"
  bool add_space_prefix = true;     // llama only
  bool add_bos = true;
  std::string chat_template;        // "" for none
};

// Reads the tokenizer file `path` (by extension: .gguf a GGUF file's own
// tokenizer.* keys, .model SentencePiece BPE, .bin llama2.c, .json Hugging
// Face byte-level BPE with Llama-3's or GPT-2's
// pre-tokenizer, or SentencePiece-style BPE whose scores become minus the
// rank of the merge that first builds each piece) and, for .json and
// .model, tokenizer_config.json beside it (chat template, add_bos_token).
// Errors: kNotFound; kInvalidArgument naming the file for a malformed one;
// kUnimplemented for a tokenizer GGUF's two models cannot express (a
// SentencePiece unigram model, another pre-tokenizer).
StatusOr<GgufVocab> ReadVocabForGguf(const std::string& path);

// Adds tokenizer.ggml.* (and tokenizer.chat_template when non-empty) to
// `writer`, with the given special ids (bos, first eos; ignored when < 0).
void AddGgufTokenizerMetadata(const GgufVocab& vocab, int32_t bos_id, int32_t eos_id,
                              checkpoint::GgufWriter* writer);

}  // namespace lede::tokenizer

#endif  // LEDE_SHARED_TOKENIZER_GGUF_TOKENIZER_H_
