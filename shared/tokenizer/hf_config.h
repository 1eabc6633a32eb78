// File: shared/tokenizer/hf_config.h
//
// The small JSON files of a Hugging Face checkpoint directory that say how a
// model is prompted and when it stops, read in one place:
//  - tokenizer_config.json: bos_token / eos_token (strings or AddedToken
//    objects), add_bos_token / add_eos_token, chat_template (a string, or a
//    list of {"name", "template"} of which "default" is used);
//  - generation_config.json: bos_token_id, eos_token_id (an integer or a
//    list: Llama-3.1-Instruct stops on 128001, 128008 and 128009), falling
//    back to config.json's fields when the file or a field is missing.
// Torch-free; JSON via nlohmann-json.
//
// Thread-safety: plain functions over files; the structs are values.
#ifndef LEDE_SHARED_TOKENIZER_HF_CONFIG_H_
#define LEDE_SHARED_TOKENIZER_HF_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shared/status/status.h"

namespace lede::tokenizer {

// What tokenizer_config.json says. Absent fields stay empty.
struct HfTokenizerConfig {
  std::optional<std::string> bos_token;   // e.g. "<|begin_of_text|>"
  std::optional<std::string> eos_token;   // e.g. "<|eot_id|>"
  std::optional<bool> add_bos_token;      // prepend BOS when encoding a prompt
  std::optional<bool> add_eos_token;      // append EOS
  std::string chat_template;              // Jinja source; "" when none
  std::string source;                     // the file it came from; "" if none
};

// Parses tokenizer_config.json text; `source` names the file in errors.
// Errors: kInvalidArgument (naming the file and the field) for bad JSON or a
// mistyped field (bos_token that is neither a string, null nor an object
// with "content"; a chat_template list without a "default" entry).
StatusOr<HfTokenizerConfig> ParseHfTokenizerConfig(const std::string& json_text,
                                                   const std::string& source);

// Reads `dir`/tokenizer_config.json; an empty config when the file is absent.
// Errors: those of ParseHfTokenizerConfig.
StatusOr<HfTokenizerConfig> ReadHfTokenizerConfig(const std::string& dir);

// The special token ids generation uses.
struct GenerationIds {
  std::optional<int32_t> bos_id;
  std::vector<int32_t> eos_ids;  // empty when no file names one
  std::string source;            // where eos_ids came from; "" if nowhere
};

// bos/eos ids of the checkpoint in `dir`: generation_config.json's
// bos_token_id / eos_token_id, each falling back to config.json's.
// Errors: kInvalidArgument (naming the file and field) for bad JSON or an id
// that is not a non-negative integer (or a list of them).
StatusOr<GenerationIds> ReadGenerationIds(const std::string& dir);

// ReadGenerationIds's parser for one file's text (either file's layout).
StatusOr<GenerationIds> ParseGenerationIds(const std::string& json_text,
                                           const std::string& source);

}  // namespace lede::tokenizer

#endif  // LEDE_SHARED_TOKENIZER_HF_CONFIG_H_
