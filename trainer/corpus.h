// File: trainer/corpus.h
//
// Corpus files of scripts/build_corpus.py: UTF-8 text whose documents are
// separated by a line holding only "<|doc|>".
#ifndef LEDE_TRAINER_CORPUS_H_
#define LEDE_TRAINER_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "shared/tokenizer/tokenizer.h"
#include "shared/status/status.h"

namespace lede::trainer {

// The non-empty documents of a corpus file. Errors: kNotFound if unreadable.
StatusOr<std::vector<std::string>> ReadDocuments(const std::string& path);

// BOS + ids + EOS of every document, concatenated into one token stream.
// Errors: those of Tokenizer::Encode (invalid UTF-8).
StatusOr<std::vector<int32_t>> EncodeDocuments(const tokenizer::Tokenizer& tokenizer,
                                               const std::vector<std::string>& documents);

// A prompt set of `lede-bench bench` and the trainers: the first half of its
// prompts is the tuning split (baselines are tuned and policies trained
// there only), the second half the evaluation split (every reported number).
struct PromptSet {
  std::string name;  // file stem ("story" for story.jsonl)
  std::vector<std::vector<int32_t>> tuning, eval;
};

// Loads up to per_set prompts from `path`: JSON lines with a "prompt",
// "turns" (first turn), "text" or "input" field, or corpus documents (the
// first prompt_tokens tokens of each document with at least prompt_tokens +
// 8). Prompts are encoded with BOS and cut to max_prompt_tokens.
// Errors: kNotFound if unreadable; kInvalidArgument for a line that is not
// JSON or fewer than 2 usable prompts.
StatusOr<PromptSet> LoadPromptSet(const std::string& path, const tokenizer::Tokenizer& tok, int64_t per_set,
                                  int64_t prompt_tokens, int64_t max_prompt_tokens);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_CORPUS_H_
