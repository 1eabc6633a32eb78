// File: shared/file/file.h
//
// Whole-file reads and durable atomic writes, shared by the checkpoint and
// policy-artifact code and the tools. Torch-free.
#ifndef LEDE_SHARED_FILE_FILE_H_
#define LEDE_SHARED_FILE_FILE_H_

#include <string>

#include "shared/status/status.h"

namespace lede::file {

// The bytes of `path`. Errors: kNotFound if it is not a regular file or
// cannot be opened; kInternal on a read error.
StatusOr<std::string> ReadFile(const std::string& path);

// Writes `text` to `path` atomically and durably: a unique temporary file in
// the same directory, fsync, rename over `path`. On failure `path` is left
// as it was and the temporary file is removed. Errors: kInternal naming the
// file and the system error.
Status WriteFileAtomically(const std::string& path, const std::string& text);

}  // namespace lede::file

#endif  // LEDE_SHARED_FILE_FILE_H_
