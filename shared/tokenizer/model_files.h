// File: shared/tokenizer/model_files.h
//
// Finds the files of a model given on the command line: a Hugging Face
// directory (config.json, *.safetensors, tokenizer.model), a llama2.c .bin,
// or a directory holding one llama2.c .bin and its tokenizer. Torch-free.
#ifndef LEDE_SHARED_TOKENIZER_MODEL_FILES_H_
#define LEDE_SHARED_TOKENIZER_MODEL_FILES_H_

#include <string>

#include "shared/status/status.h"

namespace lede::tokenizer {

// The tokenizer that belongs to `model_path`, searched in the model's
// directory in this order: tokenizer.model, any other *.model, tok*.bin,
// tokenizer.bin. Errors: kNotFound (naming the directory) if none exists.
StatusOr<std::string> FindTokenizerFile(const std::string& model_path);

}  // namespace lede::tokenizer

#endif  // LEDE_SHARED_TOKENIZER_MODEL_FILES_H_
