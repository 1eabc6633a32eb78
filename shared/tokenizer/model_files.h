// File: shared/tokenizer/model_files.h
//
// Finds the files of a model given on the command line: a Hugging Face
// directory (config.json, *.safetensors, tokenizer.json or tokenizer.model),
// a llama2.c .bin, or a directory holding one llama2.c .bin and its
// tokenizer. Torch-free. This is the one place that decides which tokenizer
// a checkpoint uses; every binary calls ResolveTokenizerFile().
#ifndef LEDE_SHARED_TOKENIZER_MODEL_FILES_H_
#define LEDE_SHARED_TOKENIZER_MODEL_FILES_H_

#include <string>

#include "shared/status/status.h"

namespace lede::tokenizer {

// The tokenizer that belongs to `model_path`: a .gguf file is its own
// tokenizer (tokenizer.ggml.* metadata, LoadTokenizer reads it); otherwise searched in the model's
// directory in this order: tokenizer.json (Hugging Face tokenizers; what
// Llama-3 checkpoints ship), tokenizer.model, any other *.model, tok*.bin,
// tokenizer.bin. Errors: kNotFound (naming the directory) if none exists.
StatusOr<std::string> FindTokenizerFile(const std::string& model_path);

// `override_path` (a --tokenizer flag) when it is non-empty, else
// FindTokenizerFile(model_path). Errors: kNotFound naming the override if it
// does not exist; those of FindTokenizerFile.
StatusOr<std::string> ResolveTokenizerFile(const std::string& model_path, const std::string& override_path);

}  // namespace lede::tokenizer

#endif  // LEDE_SHARED_TOKENIZER_MODEL_FILES_H_
