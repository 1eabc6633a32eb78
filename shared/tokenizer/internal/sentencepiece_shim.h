// File: shared/tokenizer/internal/sentencepiece_shim.h
//
// Why this exists: Debian's libsentencepiece embeds its own copy of
// protobuf-lite and exports its symbols. Linked into a process that also
// loads the system libprotobuf (libtorch and gRPC do), the dynamic linker
// binds libprotobuf's own calls to sentencepiece's copy and the process
// crashes during static initialization. So libsentencepiece is never linked
// into LEDE binaries: a small shim module (sentencepiece_shim.cc) links it and
// exposes a C API, and SentencePieceLibrary dlopen()s that module with
// RTLD_LOCAL | RTLD_DEEPBIND, which keeps both protobuf copies apart.
#ifndef LEDE_SHARED_TOKENIZER_INTERNAL_SENTENCEPIECE_SHIM_H_
#define LEDE_SHARED_TOKENIZER_INTERNAL_SENTENCEPIECE_SHIM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shared/status/status.h"

extern "C" {
// Piece flags returned by lede_spm_piece().
enum { kLedeSpmControl = 1, kLedeSpmUnknown = 2, kLedeSpmByte = 4, kLedeSpmUnused = 8 };
// Returns a processor handle or null (message in err, NUL-terminated).
void* lede_spm_load(const char* path, char* err, size_t err_len);
void lede_spm_free(void* processor);
// Vocabulary size, bos and eos ids (-1 when the model has none).
void lede_spm_info(void* processor, int32_t* vocab_size, int32_t* bos_id, int32_t* eos_id);
// Copies piece `id` into buf (truncated to buf_len), returns its full length
// and writes its flags.
int32_t lede_spm_piece(void* processor, int32_t id, char* buf, size_t buf_len, int32_t* flags);
// Encodes text into ids; returns the number of ids (which may exceed
// out_len: call again with a larger buffer) or -1 on error.
int64_t lede_spm_encode(void* processor, const char* text, size_t text_len, int32_t* out,
                        size_t out_len);
}

namespace lede::tokenizer::internal {

// One loaded SentencePiece processor behind the shim.
// Thread-safety: Encode is const and safe concurrently (libsentencepiece's
// Encode is const); construction is not.
class SentencePieceLibrary {
 public:
  struct Piece {
    std::string text;
    int32_t flags = 0;
  };

  // Errors: kUnimplemented if the shim module cannot be loaded (message
  // names where it looked); kInvalidArgument naming `path` if the model does
  // not parse.
  static StatusOr<std::unique_ptr<SentencePieceLibrary>> Load(const std::string& path);
  ~SentencePieceLibrary();

  int32_t vocab_size() const { return vocab_size_; }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  // Errors: kInternal if libsentencepiece fails.
  StatusOr<std::vector<int32_t>> Encode(const std::string& text) const;

 private:
  SentencePieceLibrary() = default;
  void* module_ = nullptr;
  void* processor_ = nullptr;
  decltype(&lede_spm_free) free_ = nullptr;
  decltype(&lede_spm_encode) encode_ = nullptr;
  int32_t vocab_size_ = 0, bos_id_ = -1, eos_id_ = -1;
  std::vector<Piece> pieces_;
};

}  // namespace lede::tokenizer::internal

#endif  // LEDE_SHARED_TOKENIZER_INTERNAL_SENTENCEPIECE_SHIM_H_
