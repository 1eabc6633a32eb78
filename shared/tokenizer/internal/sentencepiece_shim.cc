// The shim module: the only code that links libsentencepiece (see the header).
#include "shared/tokenizer/internal/sentencepiece_shim.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <sentencepiece_processor.h>

namespace {
void CopyString(const std::string& s, char* buf, size_t len) {
  if (len == 0) return;
  const size_t n = std::min(s.size(), len - 1);
  std::memcpy(buf, s.data(), n);
  buf[n] = '\0';
}
}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* lede_spm_load(const char* path, char* err,
                                                            size_t err_len) {
  auto p = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = p->Load(path);
  if (!status.ok()) {
    CopyString(status.ToString(), err, err_len);
    return nullptr;
  }
  return p.release();
}

__attribute__((visibility("default"))) void lede_spm_free(void* processor) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(processor);
}

__attribute__((visibility("default"))) void lede_spm_info(void* processor, int32_t* vocab_size,
                                                          int32_t* bos_id, int32_t* eos_id) {
  auto* p = static_cast<sentencepiece::SentencePieceProcessor*>(processor);
  *vocab_size = p->GetPieceSize();
  *bos_id = p->bos_id();
  *eos_id = p->eos_id();
}

__attribute__((visibility("default"))) int32_t lede_spm_piece(void* processor, int32_t id,
                                                              char* buf, size_t buf_len,
                                                              int32_t* flags) {
  auto* p = static_cast<sentencepiece::SentencePieceProcessor*>(processor);
  const std::string& piece = p->IdToPiece(id);
  CopyString(piece, buf, buf_len);
  *flags = (p->IsControl(id) ? kLedeSpmControl : 0) | (p->IsUnknown(id) ? kLedeSpmUnknown : 0) |
           (p->IsByte(id) ? kLedeSpmByte : 0) | (p->IsUnused(id) ? kLedeSpmUnused : 0);
  return static_cast<int32_t>(piece.size());
}

__attribute__((visibility("default"))) int64_t lede_spm_encode(void* processor, const char* text,
                                                               size_t text_len, int32_t* out,
                                                               size_t out_len) {
  auto* p = static_cast<sentencepiece::SentencePieceProcessor*>(processor);
  std::vector<int> ids;
  if (!p->Encode(std::string(text, text_len), &ids).ok()) return -1;
  for (size_t i = 0; i < ids.size() && i < out_len; ++i) out[i] = ids[i];
  return static_cast<int64_t>(ids.size());
}

}  // extern "C"
