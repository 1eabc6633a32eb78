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

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_CORPUS_H_
